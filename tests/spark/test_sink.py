"""The exactly-once sink: retried tasks and replayed micro-batches are applied once."""
from __future__ import annotations

import json
import os

import pytest
from pyspark.sql import functions as F

from ._helpers import produce, reader, values

pytestmark = [pytest.mark.spark, pytest.mark.integration]
ROWS, FAIL_AT, SIZE = 12_000, 11_000, 1024


def _fail_once(endpoints: str, topic: str, marker: str):
    """A UDF that, on the first attempt of its task, waits until the task's writer
    has sent rows to the service, records how many, then fails the task."""
    def value(i):
        import time

        from pyspark import TaskContext

        from rmq_spark.client import Client

        if i == FAIL_AT and TaskContext.get().attemptNumber() == 0:
            with Client(endpoints) as c:
                deadline = time.monotonic() + 60
                while c.offsets(topic)[0].latest == 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
                with open(marker, "w") as f:
                    json.dump({"written_before_failure": c.offsets(topic)[0].latest}, f)
            raise RuntimeError("injected task failure")
        return str(i).encode().ljust(SIZE, b".")
    return value


@pytest.fixture
def small_arrow_batches(spark):
    """2,000-row Arrow batches: the writer sees rows well before the UDF reaches FAIL_AT
    (Spark hands a batch to the writer only once the UDF has produced the next one)."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = spark.conf.get(key)
    spark.conf.set(key, "2000")
    yield
    spark.conf.set(key, old)


def test_injected_task_failure_is_applied_once(spark, client, endpoints, topic, tmp_path,
                                               small_arrow_batches):
    marker = str(tmp_path / "failed.json")
    udf = F.udf(_fail_once(endpoints, topic, marker), "binary")
    df = (spark.range(0, ROWS, numPartitions=1)
          .select(udf("id").alias("value"), F.lit(0).alias("queue")))
    df.write.format("rocketmq").option("endpoints", endpoints).option("topic", topic) \
        .mode("append").save()
    with open(marker) as f:
        before = json.load(f)["written_before_failure"]
    assert 0 < before < ROWS                    # the failed attempt had written some rows ...
    assert client.offsets(topic)[0].latest == ROWS   # ... the retry re-sent them: applied once
    got = values(reader(spark, endpoints, topic))
    assert sorted(got) == sorted(str(i).encode().ljust(SIZE, b".") for i in range(ROWS))


def test_stream_sink_replayed_batch_is_applied_once(spark, client, endpoints, topic, tmp_path):
    client.create_topic(f"{topic}-dst", queues=3)
    dst = f"{topic}-dst"
    sent = produce(client, topic, 300)
    ck = tmp_path / "ck"

    def run():
        q = (reader(spark, endpoints, topic, stream=True, startingOffsets="earliest",
                    maxOffsetsPerTrigger=100)
             .select("key", "value", "tags").writeStream.format("rocketmq")
             .option("endpoints", endpoints).option("topic", dst)
             .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert not q.isActive and q.exception() is None
        return q

    run()
    assert sum(o.latest for o in client.offsets(dst)) == 300
    last = max(int(n) for n in os.listdir(ck / "commits") if n.isdigit())
    os.remove(ck / "commits" / str(last))        # as if the driver died after the write,
    crc = ck / "commits" / f".{last}.crc"          # before committing the batch
    if crc.exists():
        os.remove(crc)
    q = run()
    replayed = [p for p in q.recentProgress if p["batchId"] == last]
    assert replayed and replayed[0]["numInputRows"] == 100   # the batch really ran again
    assert sum(o.latest for o in client.offsets(dst)) == 300
    assert sorted(values(reader(spark, endpoints, dst))) == sorted(sent)


def test_null_value_cell_writes_a_tombstone_read_back_as_null(spark, client, endpoints, topic):
    df = spark.createDataFrame([(b"a", "x", 0), (b"a", None, 0), (b"b", "", 0)],
                               "key binary, value string, queue int").coalesce(1)   # one task: order kept
    df.write.format("rocketmq").option("endpoints", endpoints).option("topic", topic) \
        .mode("append").save()
    assert [(r.key, r.value) for r in client.fetch(topic, 0, 0).records] == \
        [(b"a", b"x"), (b"a", None), (b"b", b"")]           # null and empty stay distinct
    rows = reader(spark, endpoints, topic).orderBy("offset").select("key", "value").collect()
    assert [(bytes(r.key), None if r.value is None else bytes(r.value)) for r in rows] == \
        [(b"a", b"x"), (b"a", None), (b"b", b"")]
    with pytest.raises(Exception, match="needs a 'value' column"):   # the column stays required
        df.select("key").write.format("rocketmq").option("endpoints", endpoints) \
            .option("topic", topic).mode("append").save()
