"""spark.readStream.format("rocketmq"): offsets, admission control, restarts, data loss."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest
from pyspark.serializers import write_with_length
from pyspark.sql.types import StructType

from rmq_spark.datasource._handover import read_small_batch
from rmq_spark.datasource._options import ReadOptions
from rmq_spark.datasource._planning import QueueRange

from tests.conftest import wait_until

from ._helpers import Batches, produce, produce_to, reader, retained_topic, run_available_now

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_available_now_drains_backlog_in_bounded_batches(spark, client, endpoints, topic, tmp_path):
    sent = []
    for q, n in ((0, 700), (1, 100), (2, 200)):     # uneven backlog; queue 3 stays empty
        sent += produce_to(client, topic, q, n, f"q{q}")
    late = []

    def sink(df, batch_id):
        batches(df, batch_id)
        if batch_id == 0:                           # arrives after the run started: not read
            late.extend(produce_to(client, topic, 3, 50, "late"))

    batches = Batches()
    df = reader(spark, endpoints, topic, stream=True, startingOffsets="earliest",
                maxOffsetsPerTrigger=300)
    q = run_available_now(df, tmp_path / "ck", sink)
    assert batches.sizes() == [300, 300, 300, 100]
    assert sorted(batches.all()) == sorted(sent)
    latest = q.lastProgress["sources"][0]["latestOffset"]           # from reportLatestOffset
    assert json.loads(latest) == {topic: {"0": 700, "1": 100, "2": 200, "3": 50}}

    again = Batches()
    run_available_now(df, tmp_path / "ck", again)
    assert sorted(again.all()) == sorted(late)


def test_latest_start_while_producing_reads_a_gapless_suffix(spark, client, endpoints, topic,
                                                             tmp_path):
    # Spark asks a new query's initial offset more than once; "latest" moving in
    # between once made batch 0 end before it started (a spurious data-loss error).
    stop, sent = threading.Event(), [0, 0, 0, 0]

    def keep_producing():
        i = 0
        while not stop.is_set():
            client.produce(topic, [f"p-{i}".encode()], queue=i % 4)
            sent[i % 4] += 1
            i += 1
            time.sleep(0.002)

    by_batch: dict[int, list] = {}

    def sink(df, batch_id):
        by_batch[batch_id] = [(r.queue, r.offset) for r in df.select("queue", "offset").collect()]

    producer = threading.Thread(target=keep_producing)
    producer.start()
    q = None
    try:
        time.sleep(0.3)
        q = (reader(spark, endpoints, topic, stream=True).writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "ck")).start())
        wait_until(lambda: len(by_batch) >= 3 or q.exception() is not None, timeout=120,
                   what="three micro-batches")
    finally:
        stop.set()
        producer.join()
    try:
        assert q.exception() is None, q.exception()
        q.processAllAvailable()
    finally:
        q.stop()
    rows = [r for i in sorted(by_batch) for r in by_batch[i]]
    assert len(rows) == len(set(rows)) > 0
    for queue in range(4):
        offsets = sorted(o for q_, o in rows if q_ == queue)
        # From wherever the query started to the last message sent, every offset once.
        assert offsets == list(range(offsets[0], sent[queue])), queue


def test_restart_mid_stream_loses_and_duplicates_nothing(spark, client, endpoints, topic, tmp_path):
    sent = produce(client, topic, 600)
    batches = Batches()
    # (Tasks read here: the other tests' small batches are read by the driver.)
    df = reader(spark, endpoints, topic, stream=True, startingOffsets="earliest",
                maxOffsetsPerTrigger=100, driverReadRecords=0)
    q = (df.writeStream.foreachBatch(batches).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="100 milliseconds").start())
    try:
        wait_until(lambda: len(batches.by_id) >= 2, timeout=120, what="two micro-batches")
    finally:
        q.stop()                                     # may interrupt a batch: it is replayed
    first_run = len(batches.all())
    assert 200 <= first_run < 600
    sent += produce(client, topic, 200, start=600)
    run_available_now(df, tmp_path / "ck", batches)
    got = batches.all()
    assert len(got) == len(set(got)) == 800 and sorted(got) == sorted(sent)


def test_min_offsets_per_trigger_waits_for_max_trigger_delay(spark, client, endpoints, topic, tmp_path):
    produce(client, topic, 10)
    seen = []
    df = reader(spark, endpoints, topic, stream=True, startingOffsets="earliest",
                minOffsetsPerTrigger=1000, maxTriggerDelay="3s")
    start = time.monotonic()
    q = (df.writeStream.option("checkpointLocation", str(tmp_path / "ck"))
         .foreachBatch(lambda b, i: seen.append((time.monotonic() - start, b.count())))
         .trigger(processingTime="200 milliseconds").start())
    try:
        wait_until(lambda: any(n for _, n in seen), timeout=60, what="the delayed batch")
        first = next((t, n) for t, n in seen if n)
        assert first[1] == 10 and first[0] >= 2.9       # 10 < 1000: only after the delay
        produce(client, topic, 1000, start=10)          # enough: admitted without waiting
        wait_until(lambda: sum(n for _, n in seen) == 1010, timeout=60, what="the full batch")
    finally:
        q.stop()


def test_topic_pattern_picks_up_new_topic_from_earliest(spark, client, endpoints, tmp_path):
    client.create_topic("pat-a", queues=2)
    a = produce(client, "pat-a", 10, queues=2, prefix="a")
    client.create_topic("other-x", queues=1)
    produce(client, "other-x", 5, queues=1, prefix="x")
    df = (spark.readStream.format("rocketmq").option("endpoints", endpoints)
          .option("topicPattern", "pat-.*").option("startingOffsets", "earliest").load()
          .selectExpr("concat(topic, ':', cast(value as string)) as tv"))
    first, second = Batches("tv"), Batches("tv")
    run_available_now(df, tmp_path / "ck", first)
    assert sorted(first.all()) == sorted(f"pat-a:{v.decode()}" for v in a)
    client.create_topic("pat-b", queues=3)
    b = produce(client, "pat-b", 30, queues=3, prefix="b")
    more_a = produce(client, "pat-a", 4, queues=2, prefix="a2")
    run_available_now(df, tmp_path / "ck", second)
    assert sorted(second.all()) == sorted([f"pat-b:{v.decode()}" for v in b]
                                          + [f"pat-a:{v.decode()}" for v in more_a])


def test_queue_added_mid_stream_is_read_from_earliest(spark, client, endpoints, tmp_path):
    """The topic grows from 2 to 3 queues between runs (``alter_topic(queues=3)``): the
    checkpoint knows queues 0 and 1; queue 2 is read from its earliest offset."""
    name = "grows"
    client.create_topic(name, queues=2)
    produce(client, name, 40, queues=2, prefix="old")
    df = reader(spark, endpoints, name, stream=True, startingOffsets="earliest")
    first = Batches()
    run_available_now(df, tmp_path / "ck", first)
    assert len(first.all()) == 40
    client.alter_topic(name, queues=3)
    new = produce(client, name, 15, queues=3, prefix="new")
    got = Batches()
    run_available_now(df, tmp_path / "ck", got)
    assert sorted(got.all()) == sorted(new)
    assert {o.queue: o.latest for o in client.offsets(name)} == {0: 25, 1: 25, 2: 5}


def test_recreated_topic_is_data_loss(spark, client, endpoints, tmp_path):
    """A topic deleted and created again behind a stream's back: offsets went backwards."""
    name = "recreated"
    client.create_topic(name, queues=2)
    produce(client, name, 40, queues=2, prefix="old")
    df = reader(spark, endpoints, name, stream=True, startingOffsets="earliest")
    run_available_now(df, tmp_path / "ck", Batches())
    client.delete_topic(name)
    client.create_topic(name, queues=3)
    new = produce(client, name, 15, queues=3, prefix="new")   # queues 0, 1 went back to 5
    with pytest.raises(Exception) as e:
        run_available_now(df, tmp_path / "ck", Batches())
    assert "data loss" in str(e.value) and "went back to 5" in str(e.value)
    got = Batches()
    lenient = reader(spark, endpoints, name, stream=True, startingOffsets="earliest",
                     failOnDataLoss="false")
    run_available_now(lenient, tmp_path / "ck", got)
    assert sorted(got.all()) == sorted(new)


def test_stream_data_loss_fails_or_skips(spark, client, endpoints, tmp_path):
    topic = retained_topic(client, "retained-stream", wait_until)
    o = client.offsets(topic)[0]
    start = f'{{"{topic}": {{"0": 0}}}}'
    strict = reader(spark, endpoints, topic, stream=True, startingOffsets=start)
    with pytest.raises(Exception) as e:
        run_available_now(strict, tmp_path / "strict", Batches())
    msg = str(e.value)
    assert f"topic {topic!r} queue 0: offsets [0, " in msg and "removed by retention" in msg
    assert "failOnDataLoss" in msg
    got = Batches("offset")
    lenient = reader(spark, endpoints, topic, stream=True, startingOffsets=start,
                     failOnDataLoss="false")
    run_available_now(lenient, tmp_path / "lenient", got)
    offsets = sorted(got.all())
    assert offsets[0] >= o.earliest and offsets == list(range(offsets[0], o.latest))


def test_tag_filter_in_a_stream(spark, client, endpoints, topic, tmp_path):
    produce(client, topic, 90, tags=lambda i: "keep" if i % 3 == 0 else "drop")
    got = Batches("tags")
    df = reader(spark, endpoints, topic, stream=True, startingOffsets="earliest", tags="keep",
                maxOffsetsPerTrigger=40)
    run_available_now(df, tmp_path / "ck", got)
    assert len(got.all()) == 30 and set(got.all()) == {"keep"}
    assert len(got.by_id) == 3                       # limits count offsets, filtered or not


def _rmq_offsets(endpoints: str, topic: str) -> dict:
    rmq = os.path.join(os.path.dirname(sys.executable), "rmq")
    out = subprocess.run([rmq, "--endpoints", endpoints, "offsets", topic, "--json"],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    return json.loads(out)


def test_consumer_group_lag_visible_through_rmq(spark, client, endpoints, topic, tmp_path):
    produce(client, topic, 100)
    df = reader(spark, endpoints, topic, stream=True, startingOffsets="earliest",
                consumerGroup="lag-test", maxOffsetsPerTrigger=60)
    run_available_now(df, tmp_path / "ck", Batches())
    lag = _rmq_offsets(endpoints, topic)["consumer_groups"]["lag-test"]
    assert {q: v["committed"] for q, v in lag.items()} == {str(q): 25 for q in range(4)}
    assert sum(v["lag"] for v in lag.values()) == 0
    produce(client, topic, 8, start=100)
    lag = _rmq_offsets(endpoints, topic)["consumer_groups"]["lag-test"]
    assert sum(v["lag"] for v in lag.values()) == 8


def test_bad_stream_options(spark, endpoints, topic, tmp_path):
    df = reader(spark, endpoints, topic, stream=True, endingOffsets="latest")
    with pytest.raises(Exception, match="a stream has no end"):
        run_available_now(df, tmp_path / "ck", Batches())


def _planner_call(func, reader, *args: dict, **kwargs) -> io.BytesIO:
    """Run one of Spark's planner-process functions on ``reader`` as the JVM would."""
    infile, outfile = io.BytesIO(), io.BytesIO()
    for arg in args:
        write_with_length(json.dumps(arg).encode(), infile)
    infile.seek(0)
    func(reader, *kwargs.values(), infile, outfile) if kwargs else func(reader, outfile)
    outfile.seek(0)
    return outfile


def test_small_batches_are_handed_over_in_memory(client, endpoints, topic):
    # Spark's planner sends a small batch's rows from the driver (no Python task),
    # and still reports the latest offset: the private contract _handover.py uses.
    from pyspark.serializers import read_int
    from pyspark.sql.streaming import python_streaming_source_runner as runner
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from rmq_spark.datasource._source import RocketMQDataSource

    source = RocketMQDataSource({"endpoints": endpoints, "topic": topic})
    schema = StructType.fromDDL(source.schema())
    reader = source.streamReader(schema)
    start = reader.initialOffset()
    sent = produce(client, topic, 40)
    end = reader.latestOffset(start, ReadAllAvailable())
    planned = dict(data_source=source, schema=schema, max_arrow_batch_size=10_000)

    out = _planner_call(runner.partitions_func, reader, start, end, **planned)
    assert read_int(out) == 1                                   # one partition
    out.read(read_int(out))
    assert read_int(out) == runner.NON_EMPTY_PYARROW_RECORD_BATCHES
    read_int(out)                                               # START_ARROW_STREAM
    rows = pa.ipc.open_stream(out).read_all()
    assert sorted(rows.column("value").to_pylist()) == sorted(sent)

    produce(client, topic, 4, start=40)
    reader.latestOffset(end, ReadAllAvailable())
    out = _planner_call(runner.report_latest_offset_func, reader)
    assert json.loads(out.read(read_int(out))) == {topic: {str(q): 11 for q in range(4)}}

    # Over driverReadRecords (or the byte limit) a task reads it: nothing is handed over.
    reader = RocketMQDataSource({"endpoints": endpoints, "topic": topic,
                                 "driverReadRecords": "10"}).streamReader(schema)
    out = _planner_call(runner.partitions_func, reader, start, end, **planned)
    for _ in range(read_int(out)):
        out.read(read_int(out))
    assert read_int(out) == runner.PREFETCHED_RECORDS_NOT_FOUND
    reader.stop()


def test_driver_reads_only_small_hot_batches(client, endpoints, topic):
    opts = ReadOptions.from_options({"endpoints": endpoints, "topic": topic})
    produce_to(client, topic, 0, 3, "big")
    for _ in range(2):
        client.produce(topic, [b"x" * (3 << 20)], queue=1)     # 6 MiB in 2 records
    small = [QueueRange(topic, 0, 0, 3)]
    assert [b.num_rows for b in read_small_batch(client, opts, small)] == [3]
    assert read_small_batch(client, opts, [QueueRange(topic, 1, 0, 2)]) is None       # bytes
    assert read_small_batch(client, opts, small * 2) is None                          # 2 tasks
    few = ReadOptions.from_options({"endpoints": endpoints, "topic": topic, "driverReadRecords": "2"})
    assert read_small_batch(client, few, small) is None                               # records
