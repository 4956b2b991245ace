"""spark.read / df.write with format("rocketmq") against a real 3-node cluster."""
from __future__ import annotations

import datetime as dt
import time

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F
from pyspark.sql.utils import AnalysisException

import rmq_spark
from rmq_spark.datasource._batch_reader import BatchReader
from rmq_spark.datasource._options import ReadOptions
from rmq_spark.datasource._planning import QueueRanges
from rmq_spark.datasource._read import read_partition
from tests.conftest import wait_until

from ._helpers import produce, reader, retained_topic, values

pytestmark = [pytest.mark.spark, pytest.mark.integration]
UTC = dt.timezone.utc


def test_round_trip_every_column(spark, client, endpoints, topic):
    """Write every sink column, read every source column back."""
    born = dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
    rows = [(f"v{i}", f"k{i}".encode() if i % 3 else None, f"Tag{i % 2}", {"i": str(i), "x": "y"},
             born, topic, i % 4) for i in range(40)]
    df = spark.createDataFrame(rows, "value string, key binary, tags string, "
                               "properties map<string,string>, born_timestamp timestamp, "
                               "topic string, queue int")
    before = time.time()
    df.coalesce(1).write.format("rocketmq").option("endpoints", endpoints).mode("append").save()
    got = reader(spark, endpoints, topic).orderBy("queue", "offset").collect()
    assert len(got) == 40
    by_value = {r.value: r for r in got}
    for v, k, tags, props, b, t, q in rows:
        r = by_value[v.encode()]
        assert (r.key, r.tags, r.properties, r.topic, r.queue) == (k, tags, props, t, q)
        assert r.born_timestamp.replace(tzinfo=None) == _local_naive(born)
        assert r.timestamp.timestamp() >= before - 5
        assert r.msg_id == rmq_spark.client._types.msg_id(t, q, r.offset)
    for q in range(4):                     # one task: offsets contiguous from 0, in row order
        mine = [r for r in got if r.queue == q]
        assert [r.offset for r in mine] == list(range(10))
        assert [r.value for r in mine] == [f"v{i}".encode() for i in range(q, 40, 4)]
    # Spark and the nodes share this host: the read above took the short-circuit
    # path (localReads defaults to true); over the network it is the same.
    network = reader(spark, endpoints, topic, localReads="false").orderBy("queue", "offset")
    assert network.collect() == got


def _local_naive(ts: dt.datetime) -> dt.datetime:
    return ts.astimezone().replace(tzinfo=None)


def test_explicit_register_and_static_lookup_agree(spark, client, endpoints, topic):
    produce(client, topic, 8)
    assert reader(spark, endpoints, topic).count() == 8   # static lookup, no register
    rmq_spark.register(spark)
    assert reader(spark, endpoints, topic).count() == 8


def test_batch_read_is_a_snapshot_planned_once(client, endpoints, topic):
    produce(client, topic, 20)
    r = BatchReader(ReadOptions.from_options({"endpoints": endpoints, "topic": topic}))
    parts = r.partitions()
    produce(client, topic, 20, start=20)               # arrives after planning
    rows = sum(b.num_rows for p in parts for b in read_partition(r.opts, p))
    assert rows == 20 and sum(q.end - q.start for q in _ranges(parts)) == 20


def _ranges(parts):
    return [q for p in parts for q in (p.ranges if isinstance(p, QueueRanges) else (p,))]


def test_small_ranges_share_a_task_and_keep_queue_order(spark, client, endpoints, topic):
    produce(client, topic, 400)                        # 100 per queue
    packed = reader(spark, endpoints, topic)
    assert packed.rdd.getNumPartitions() == 1          # 400 records < packRecordsPerTask
    apart = reader(spark, endpoints, topic, packRecordsPerTask=0)
    assert apart.rdd.getNumPartitions() == 4           # a task a queue
    two = reader(spark, endpoints, topic, packRecordsPerTask=250)
    assert two.rdd.getNumPartitions() == 2
    for df in (packed, apart, two):
        rows = df.select("queue", "offset").collect()
        assert len(rows) == 400
        for q in range(4):
            assert [r.offset for r in rows if r.queue == q] == list(range(100))


def test_starting_and_ending_offsets_json(spark, client, endpoints, topic):
    produce(client, topic, 40)                         # 10 per queue
    df = reader(spark, endpoints, topic,
                startingOffsets=f'{{"{topic}": {{"0": 3, "1": -2}}}}',
                endingOffsets=f'{{"{topic}": {{"0": 5, "2": 4, "3": -1}}}}')
    got = sorted((r.queue, r.offset) for r in df.select("queue", "offset").collect())
    want = ([(0, o) for o in (3, 4)] + [(1, o) for o in range(10)] + [(2, o) for o in range(4)]
            + [(3, o) for o in range(10)])
    assert got == want


def test_timestamp_seeks(spark, client, endpoints, topic):
    produce(client, topic, 20, prefix="old")
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    new = produce(client, topic, 20, prefix="new")
    assert sorted(values(reader(spark, endpoints, topic, startingTimestamp=cut))) == sorted(new)
    assert all(v.startswith(b"old") for v in values(reader(spark, endpoints, topic, endingTimestamp=cut)))
    per_queue = f'{{"{topic}": {{"0": {cut}, "1": 0}}}}'
    got = values(reader(spark, endpoints, topic, startingOffsetsByTimestamp=per_queue))
    assert len(got) == 5 + 10 + 10 + 10    # queue 0 from cut, queue 1 from 0, others earliest


def test_tag_filter_is_applied_by_the_service(spark, client, endpoints, topic):
    produce(client, topic, 60, tags=lambda i: ("TagA", "TagB", "TagC")[i % 3])
    df = reader(spark, endpoints, topic, tags="TagA || TagC")
    tags = [r.tags for r in df.select("tags").collect()]
    assert len(tags) == 40 and set(tags) == {"TagA", "TagC"}


def test_min_partitions_and_follower_reads(spark, client, endpoints, topic):
    produce(client, topic, 400)
    df = reader(spark, endpoints, topic, minPartitions=10)
    assert df.rdd.getNumPartitions() >= 10
    assert sorted(values(df)) == sorted(values(reader(spark, endpoints, topic, readFrom="follower")))
    assert df.select("value").distinct().count() == 400


def test_data_loss_fails_or_skips(spark, client, endpoints):
    topic = retained_topic(client, "retained-batch", wait_until)
    earliest, latest = client.offsets(topic)[0].earliest, client.offsets(topic)[0].latest
    start = f'{{"{topic}": {{"0": 0}}}}'
    with pytest.raises(Exception) as e:
        reader(spark, endpoints, topic, startingOffsets=start).count()
    msg = str(e.value)
    assert "data loss" in msg and f"topic {topic!r} queue 0" in msg and "[0, " in msg
    assert "failOnDataLoss" in msg
    df = reader(spark, endpoints, topic, startingOffsets=start, failOnDataLoss="false")
    offsets = sorted(r.offset for r in df.select("offset").collect())
    assert offsets and offsets[0] >= earliest > 0        # skipped the removed offsets ...
    assert offsets == list(range(offsets[0], latest))    # ... and read the rest, once


@pytest.mark.parametrize("options,needle", [
    ({"bogus": "1"}, "unknown read option"),
    ({"startingOffsets": "{not json"}, "not valid JSON"),
    ({"readFrom": "anyone"}, "'readFrom'"),
    ({"maxOffsetsPerTrigger": "-5"}, "'maxOffsetsPerTrigger'"),
])
def test_bad_read_options_fail_at_load(spark, endpoints, options, needle):
    with pytest.raises(AnalysisException) as e:
        reader(spark, endpoints, "whatever", **options)   # load() alone, no action
    assert needle in str(e.value)


def test_read_of_missing_topic_names_it(spark, endpoints):
    with pytest.raises(Exception, match="topic 'no-such-topic' does not exist"):
        reader(spark, endpoints, "no-such-topic").count()


def _writer(df, endpoints, **options):
    w = df.write.format("rocketmq").option("endpoints", endpoints)
    for k, v in options.items():
        w = w.option(k, v)
    return w


@pytest.mark.parametrize("ddl,row,needle", [
    ("value int", (1,), "column 'value' is int; the rocketmq sink needs binary or string"),
    ("key string", ("k",), "needs a 'value' column"),
    ("value string, extra int", ("v", 1), "column 'extra' is not written"),
    ("value string, properties map<string,int>", ("v", {"a": 1}), "map<string,string>"),
])
def test_bad_sink_columns_fail_before_writing(spark, client, endpoints, topic, ddl, row, needle):
    with pytest.raises(PySparkException) as e:
        _writer(spark.createDataFrame([row], ddl), endpoints, topic=topic).mode("append").save()
    assert needle in str(e.value)
    assert sum(o.latest for o in client.offsets(topic)) == 0


def test_only_append_mode(spark, endpoints, topic):
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(PySparkException, match="only appends"):
        _writer(df, endpoints, topic=topic).mode("overwrite").save()
    with pytest.raises(PySparkException, match="Append"):
        _writer(df, endpoints, topic=topic).save()            # default mode: ErrorIfExists


def test_missing_value_column_and_unknown_topic_are_clear_errors(spark, endpoints, topic):
    # (A null value cell is a tombstone, see test_sink; a missing column is an error.)
    with pytest.raises(Exception, match="needs a 'value' column"):
        _writer(spark.createDataFrame([("k",)], "key string"), endpoints,
                topic=topic).mode("append").save()
    with pytest.raises(Exception, match="topic 'nope' does not exist"):
        _writer(spark.createDataFrame([("v",)], "value string"), endpoints,
                topic="nope").mode("append").save()


def test_rerun_with_same_idempotence_key_is_applied_once(spark, client, endpoints, topic):
    df = spark.range(0, 3000, numPartitions=3).select(F.col("id").cast("string").alias("value"))
    for _ in range(2):
        _writer(df, endpoints, topic=topic, idempotenceKey="backfill-1").mode("append").save()
    assert sum(o.latest for o in client.offsets(topic)) == 3000
    _writer(df, endpoints, topic=topic).mode("append").save()    # no key: a new write
    assert sum(o.latest for o in client.offsets(topic)) == 6000
    assert sorted(values(reader(spark, endpoints, topic))) == sorted(
        [str(i).encode() for i in range(3000)] * 2)


def test_a_read_with_nothing_to_read_returns_no_rows(spark, client, endpoints, topic):
    # No partition is planned; Spark then hands the reader one InputPartition(None)
    # (it raised AttributeError: 'InputPartition' object has no attribute 'start').
    df = spark.read.format("rocketmq").option("endpoints", endpoints).option("topic", topic).load()
    assert df.count() == 0 and df.limit(5).collect() == []
    client.produce(topic, [b"x"], queue=0)
    at_end = f'{{"{topic}": {{"0": 1}}}}'                 # from the end, to the end: nothing
    later = spark.read.format("rocketmq").option("endpoints", endpoints).option("topic", topic) \
        .option("startingOffsets", at_end).option("endingOffsets", at_end).load()
    assert later.collect() == []
