"""One query over archive + hot log: ``format("rocketmq")`` on a tiered topic.

Archives here are written the way the tiering job writes them (the layout
contract in rmq_spark/archive/layout.py: Delta appends, or Spark's Parquet
file sink), then the service's hot retention removes what the archived
watermark allows. Reads must return exactly what was produced: no gap and
no duplicate at the boundary, the same schema as a hot read.
"""
from __future__ import annotations

import json
import os

import pytest

from rmq_spark.archive import layout
from rmq_spark.archive.errors import ArchiveError
from rmq_spark.archive.reader import load_snapshot
from rmq_spark.client import Message
from rmq_spark.datasource import _archive_hot, _planning
from rmq_spark.datasource._options import ReadOptions

from tests.conftest import wait_until

from ._helpers import Batches, reader

pytestmark = [pytest.mark.spark, pytest.mark.integration]

QUEUES = 2


def _produce(client, topic, count, start=0, tag=lambda i: "A" if i % 3 else "B", size=400):
    vals = []
    for q in range(QUEUES):
        msgs = [Message(f"{topic}-{i}".encode().ljust(size, b"."), key=f"k{i}".encode(), tags=tag(i))
                for i in range(start + q, start + count, QUEUES)]
        for i in range(0, len(msgs), 50):          # many batches: segments roll (64 KiB)
            client.produce(topic, msgs[i:i + 50], queue=q)
        vals += [m.value for m in msgs]
    return vals


def _archive(spark, endpoints, topic, tier, ckpt, ending=None):
    """Archive the topic's hot log (up to ``ending`` offsets) as the tiering job lays it out."""
    t = layout.parse_tier(tier)
    one_queue_a_task = {"packRecordsPerTask": "0", "driverReadRecords": "0"}   # as the job reads
    if t.format == "delta":
        df = reader(spark, endpoints, topic, readArchive="false", **one_queue_a_task,
                    **({"endingOffsets": json.dumps({topic: ending})} if ending else {}))
        (layout.archive_frame(df).sortWithinPartitions("topic", "date", "queue", "offset")
         .write.format("delta").mode("append").partitionBy(*layout.PARTITION_COLUMNS)
         .option("delta.dataSkippingStatsColumns", ",".join(layout.STATS_COLUMNS))
         .save(t.path))
    else:
        assert ending is None
        stream = reader(spark, endpoints, topic, stream=True, readArchive="false",
                        startingOffsets="earliest", **one_queue_a_task)
        q = (layout.archive_frame(stream).writeStream.format("parquet")
             .partitionBy(*layout.PARTITION_COLUMNS).option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start(t.path))
        q.awaitTermination()


def _tiered(spark, client, endpoints, tmp_path, name, fmt, count=1200, tail=40):
    """A topic whose first ``count`` messages live in the archive and (partly) no longer
    in the hot log, plus ``tail`` hot-only messages. Returns (values, tier)."""
    tier = f"{fmt}:{tmp_path / (name + '-archive')}"
    client.create_topic(name, queues=QUEUES, tier=tier, local_retention_ms=1)
    vals = _produce(client, name, count)
    _archive(spark, endpoints, name, tier, str(tmp_path / (name + "-ckpt")))
    archived = {o.queue: o.latest for o in client.offsets(name)}
    token = client.lease(name, "tier", "test-job", 60_000)[3]        # the job released its own
    client.set_watermark(name, "archive", archived, token)
    # Retention must be done before the tests read: a pass that removes hot data
    # under a read planned on it makes a hot-only read (rightly) fail with data
    # loss. A queue's last archived segment is full (4 batches of 50) but rolls
    # only at the next append: with a tail it then becomes deletable and
    # retention ends at the watermark; without one, the first pass is the last.
    vals += _produce(client, name, tail, start=count)
    done = ((lambda o: o.earliest == archived[o.queue]) if tail else (lambda o: o.earliest > 0))
    wait_until(lambda: all(done(o) for o in client.offsets(name)), timeout=60,
               what="hot retention up to the archived watermark")
    return vals, tier


@pytest.fixture(scope="module", params=["delta", "parquet"])
def tiered(request, spark, client, endpoints, tmp_path_factory):
    fmt = request.param
    name = f"hist-{fmt}"
    vals, tier = _tiered(spark, client, endpoints, tmp_path_factory.mktemp(name), name, fmt)
    return name, vals, tier


def _offsets_by_queue(rows):
    out = {}
    for r in rows:
        out.setdefault(r.queue, []).append(r.offset)
    return out


def test_batch_read_spans_archive_and_hot_log(spark, client, endpoints, tiered):
    topic, vals, _ = tiered
    hot = {o.queue: o for o in client.offsets(topic)}
    assert all(o.earliest > 0 for o in hot.values())          # the archive alone holds the start
    df = reader(spark, endpoints, topic)
    rows = df.select("value", "queue", "offset", "topic", "msg_id").collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(vals)
    for q, offs in _offsets_by_queue(rows).items():
        assert sorted(offs) == list(range(hot[q].latest))     # contiguous: no gap, no duplicate
    assert {r.topic for r in rows} == {topic}
    hot_only = reader(spark, endpoints, topic, readArchive="false")
    assert df.schema == hot_only.schema
    # Every column of an archived row equals the same row read from the hot log.
    cols = ["key", "value", "topic", "queue", "offset", "timestamp", "born_timestamp", "tags",
            "properties", "msg_id"]
    from_hot = hot_only.select(*cols).orderBy("queue", "offset").collect()
    span = {}
    for r in from_hot:
        lo, hi = span.get(str(r.queue), (r.offset, r.offset))
        span[str(r.queue)] = (min(lo, r.offset), max(hi, r.offset + 1))
    mixed = reader(spark, endpoints, topic,
                   startingOffsets=json.dumps({topic: {q: lo for q, (lo, _) in span.items()}}),
                   endingOffsets=json.dumps({topic: {q: hi for q, (_, hi) in span.items()}}))
    assert mixed.select(*cols).orderBy("queue", "offset").collect() == from_hot


def test_archive_is_planned_by_statistics(spark, client, endpoints, tiered):
    topic, _, tier = tiered
    snap = load_snapshot(layout.parse_tier(tier))
    spans = snap.spans(topic)
    assert sorted(spans) == list(range(QUEUES))
    hot = {o.queue: o for o in client.offsets(topic)}
    for q, qf in spans.items():
        assert qf.earliest == 0 and qf.end >= hot[q].earliest
    # A range inside the archive of one queue is planned on that queue's files only.
    state = _planning.queue_state(client, [topic])
    archived, hot_part = _archive_hot.plan(ReadOptions(endpoints, topics=(topic,)), topic,
                                        state[topic][0], 10, 20)
    assert hot_part is None and [(a.start, a.end) for a in archived] == [(10, 20)]
    by_path = {f.path: f for f in snap.files}
    chosen = [by_path[p] for p in archived[0].files]
    assert chosen and all(f.min_queue <= 0 <= f.max_queue and f.min_offset < 20
                          and f.max_offset >= 10 for f in chosen)
    assert len(chosen) < len(snap.files)
    df = reader(spark, endpoints, topic, startingOffsets=json.dumps({topic: {"0": 10, "1": 0}}),
                endingOffsets=json.dumps({topic: {"0": 20, "1": 0}}))
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(10, 20))


def test_earliest_is_the_archive_earliest_and_tags_filter_archive_rows(spark, endpoints, tiered):
    topic, vals, _ = tiered
    n_b = sum(1 for v in vals if int(v.split(b"-")[-1].rstrip(b".")) % 3 == 0)
    df = reader(spark, endpoints, topic, startingOffsets="earliest", tags="B")
    got = df.select("tags").collect()
    assert len(got) == n_b and {r.tags for r in got} == {"B"}


def test_starting_timestamp_crosses_the_boundary(spark, endpoints, tiered):
    topic, _, _ = tiered
    rows = reader(spark, endpoints, topic).select("queue", "offset", "timestamp").collect()
    times = sorted({r.timestamp for r in rows})
    for ts in (times[len(times) // 4], times[-1]):              # inside the archive; the tail
        ms = int(ts.timestamp() * 1000)
        expected = sorted((r.queue, r.offset) for r in rows if r.timestamp >= ts)
        got = reader(spark, endpoints, topic, startingTimestamp=ms).select("queue", "offset")
        assert sorted((r.queue, r.offset) for r in got.collect()) == expected


def test_streaming_read_spans_archive_and_hot_log(spark, client, endpoints, tiered, tmp_path):
    topic, vals, _ = tiered
    sink = Batches()
    q = (reader(spark, endpoints, topic, stream=True, startingOffsets="earliest",
                maxOffsetsPerTrigger=500)
         .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    got = sink.all()
    assert sorted(got) == sorted(vals) and len(sink.by_id) > 2
    # A restart from the checkpoint reads only what arrived since.
    more = _produce(client, topic, 10, start=10_000)
    sink2 = Batches()
    q = (reader(spark, endpoints, topic, stream=True)
         .writeStream.foreachBatch(sink2).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    assert sorted(sink2.all()) == sorted(more)


def test_read_archive_false_reads_the_hot_log_only(spark, client, endpoints, tiered):
    topic, _, _ = tiered
    hot = client.offsets(topic)
    rows = reader(spark, endpoints, topic, readArchive="false").select("queue", "offset").collect()
    assert len(rows) == sum(o.latest - o.earliest for o in hot)
    assert min(r.offset for r in rows) == min(o.earliest for o in hot)


def test_read_archive_option_is_checked(spark, endpoints, tiered):
    topic, _, _ = tiered
    with pytest.raises(Exception, match="readArchive"):
        reader(spark, endpoints, topic, readArchive="maybe").count()


# ---------------------------------------------------------------- data loss
@pytest.fixture(scope="module")
def gapped(spark, client, endpoints, tmp_path_factory):
    """Archive holds offsets < 100 per queue, the watermark claims 300: [100, hot earliest)
    is in neither place."""
    name = "gapped"
    tier = f"delta:{tmp_path_factory.mktemp(name) / 'archive'}"
    client.create_topic(name, queues=QUEUES, tier=tier, local_retention_ms=1)
    vals = _produce(client, name, 1200)
    _archive(spark, endpoints, name, tier, None, ending={str(q): 100 for q in range(QUEUES)})
    token = client.lease(name, "tier", "test-job", 60_000)[3]
    client.set_watermark(name, "archive", {q: 600 for q in range(QUEUES)}, token)
    wait_until(lambda: all(o.earliest > 100 for o in client.offsets(name)), timeout=60,
                       what="hot retention past the archive's end")
    return name, vals


def test_offsets_in_neither_place_fail_the_query(spark, endpoints, gapped):
    topic, _ = gapped
    with pytest.raises(Exception, match=r"queue 0.*\[100, \d+\).*neither in the archive"):
        reader(spark, endpoints, topic).count()


def test_offsets_in_neither_place_are_skipped_without_fail_on_data_loss(spark, client, endpoints,
                                                                         gapped):
    topic, _ = gapped
    hot = {o.queue: o for o in client.offsets(topic)}
    rows = reader(spark, endpoints, topic, failOnDataLoss="false").select("queue", "offset")
    for q, offs in _offsets_by_queue(rows.collect()).items():
        assert sorted(offs) == list(range(100)) + list(range(hot[q].earliest, hot[q].latest))


def test_archive_file_removed_after_planning_is_data_loss(spark, client, endpoints, tmp_path):
    name = "vanishing"
    vals, tier = _tiered(spark, client, endpoints, tmp_path, name, "delta", count=800, tail=0)
    df = reader(spark, endpoints, name)
    plan = df.select("offset")          # planned now; files removed before it runs
    snap = load_snapshot(layout.parse_tier(tier))
    victim = snap.spans(name)[0].files[0].path
    os.remove(victim)
    with pytest.raises(Exception, match="missing from the archive"):
        plan.count()
    assert reader(spark, endpoints, name, failOnDataLoss="false").count() < len(vals)


# ------------------------------------------------------------ Delta log reading
def test_snapshot_follows_checkpoints_and_removes(spark, tmp_path):
    path = str(tmp_path / "t")
    base = spark.range(0, 30).selectExpr("cast(id % 2 as int) as queue", "id as offset",
                                         "current_timestamp() as timestamp", "'t' as topic")
    for i in range(4):                       # past the table's checkpoint interval of 3 commits
        (base.where(f"offset % 4 = {i}").coalesce(1).write.format("delta")
         .option("delta.checkpointInterval", "3").mode("append").save(path))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE offset < 6")
    assert any(n.endswith(".checkpoint.parquet") for n in os.listdir(path + "/_delta_log"))
    snap = load_snapshot(layout.Tier("delta", path))
    expected = {os.path.abspath(p.replace("file://", "").replace("file:", ""))
                for p in spark.read.format("delta").load(path).inputFiles()}
    assert {f.path for f in snap.files} == expected
    assert sum(f.rows for f in snap.files) == 24


def test_deletion_vectors_are_refused_with_a_clear_error(spark, tmp_path):
    path = str(tmp_path / "dv")
    (spark.range(0, 100).selectExpr("cast(0 as int) as queue", "id as offset",
                                    "current_timestamp() as timestamp", "'t' as topic")
     .coalesce(1).write.format("delta").option("delta.enableDeletionVectors", "true").save(path))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE offset = 5")
    with pytest.raises(ArchiveError, match="deletion vector.*enableDeletionVectors=false"):
        load_snapshot(layout.Tier("delta", path))


def test_missing_archive_reads_as_no_archive(spark, client, endpoints, tmp_path):
    name = "not-yet-tiered"
    client.create_topic(name, queues=1, tier=f"delta:{tmp_path / 'none'}")
    client.produce(name, [Message(b"x"), Message(b"y")], queue=0)
    assert load_snapshot(layout.Tier("delta", str(tmp_path / "none"))) is None
    assert sorted(bytes(r.value) for r in reader(spark, endpoints, name).collect()) == [b"x", b"y"]
