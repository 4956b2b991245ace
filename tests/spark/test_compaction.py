"""The compaction job: a compact topic -> Delta table with the latest value per key.

Real cluster, real Spark, real Delta. The expected table is always recomputed
from the topic itself (last record per key by (queue, offset)), never typed in.
"""
from __future__ import annotations

import random
import time

import pytest

from rmq_spark.client import Message
from rmq_spark.compaction import CompactedTable, CompactionConfigError, KeyLookup, compact_topic

from ..conftest import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _produce_updates(client, topic, n, keys, queues, seed, prefix="v", pad=0, first_key=0):
    """``n`` updates of ``keys`` random keys; each key always goes to the same queue."""
    rng = random.Random(seed)
    by_queue = {}
    for i in range(n):
        k = first_key + rng.randrange(keys)
        by_queue.setdefault(k % queues, []).append(
            Message(f"{prefix}{i}".encode() + b"." * pad, key=f"key-{k:05d}".encode()))
    for q, msgs in by_queue.items():
        for j in range(0, len(msgs), 200):
            client.produce(topic, msgs[j:j + 200], queue=q)


def _last_records(spark, endpoints, topic):
    """key -> (value or None for a delete, queue, offset) of the key's last record in the topic."""
    rows = (spark.read.format("rocketmq").option("endpoints", endpoints).option("topic", topic)
            .load().select("key", "value", "queue", "offset").collect())
    last = {}
    for r in sorted(rows, key=lambda r: (r.queue, r.offset)):
        last[bytes(r.key)] = (None if r.value is None else bytes(r.value), r.queue, r.offset)
    return last


def _expected(spark, endpoints, topic):
    """The table a from-scratch recomputation over the topic gives: live keys only."""
    return {k: v for k, v in _last_records(spark, endpoints, topic).items() if v[0] is not None}


def _table(spark, path):
    return {bytes(r.key): (bytes(r.value), r.queue, r.offset)
            for r in spark.read.format("delta").load(path)
            .select("key", "value", "queue", "offset").collect()}


@pytest.fixture
def compact(client, tmp_path, request):
    name = "c-" + request.node.name[5:40].replace("_", "-")
    client.create_topic(name, queues=3, cleanup_policy="compact")
    return name, str(tmp_path / "table")


def test_latest_value_wins_within_and_across_batches(spark, client, endpoints, compact):
    topic, table = compact
    _produce_updates(client, topic, 1500, keys=300, queues=3, seed=1)
    compact_topic(spark, endpoints, topic, table, max_offsets_per_trigger=800)   # 2 batches
    assert _table(spark, table) == _expected(spark, endpoints, topic)
    _produce_updates(client, topic, 800, keys=400, queues=3, seed=2, prefix="w")
    compact_topic(spark, endpoints, topic)                      # resumes; table from config
    want = _expected(spark, endpoints, topic)
    assert _table(spark, table) == want and len(want) > 300


def test_point_lookup_and_prefix_scan(spark, client, endpoints, compact):
    topic, table = compact
    _produce_updates(client, topic, 500, keys=50, queues=3, seed=3)
    compact_topic(spark, endpoints, topic, table, buckets=4)
    want = _expected(spark, endpoints, topic)
    t = CompactedTable(table)
    for key, (value, q, off) in want.items():
        row = t.get(key)
        assert row is not None and (row.value, row.queue, row.offset) == (value, q, off)
    assert t.get(b"no-such-key") is None
    scanned = t.scan(b"key-0000")
    assert [r.key for r in scanned] == sorted(k for k in want if k.startswith(b"key-0000"))
    # The same objects see a later commit (a long-lived lookup must not serve a stale table).
    look = KeyLookup(client, topic)
    assert look.latest(b"late-key") is None
    client.produce(topic, [Message(b"late", key=b"late-key")], queue=0)
    compact_topic(spark, endpoints, topic)
    assert t.get(b"late-key").value == b"late"
    assert look.latest(b"late-key").value == b"late"


def test_a_bucket_file_keeps_its_row_groups_small_for_lookups(spark, client, endpoints, compact):
    """A lookup reads the whole row group holding its key: the first write and a MERGE
    both cut a bucket's file into row groups of about 1 MB, not one per file."""
    import pyarrow.parquet as pq
    topic, table = compact
    _produce_updates(client, topic, 12_000, keys=11_000, queues=3, seed=11, pad=300)
    compact_topic(spark, endpoints, topic, table, buckets=1)     # ~3.6 MB in one bucket

    def row_groups():
        files = spark.read.format("delta").load(table).inputFiles()
        metas = [pq.ParquetFile(f.removeprefix("file:")).metadata for f in files]
        return [m.row_group(i).total_byte_size for m in metas for i in range(m.num_row_groups)]

    sizes = row_groups()
    assert len(sizes) >= 3 and max(sizes) < 2 << 20, sizes
    _produce_updates(client, topic, 4_000, keys=11_000, queues=3, seed=12, prefix="w", pad=300)
    compact_topic(spark, endpoints, topic)                      # MERGE into the table
    sizes = row_groups()
    assert len(sizes) >= 3 and max(sizes) < 2 << 20, sizes
    want = _expected(spark, endpoints, topic)
    t = CompactedTable(table)
    for key in random.Random(13).sample(sorted(want), 50):
        row = t.get(key)
        assert (row.value, row.queue, row.offset) == want[key]


def test_replayed_batch_is_applied_once(spark, client, endpoints, compact, tmp_path):
    """A batch run again (its commit lost) leaves the table as one run did."""
    import os
    import shutil
    topic, table = compact
    _produce_updates(client, topic, 600, keys=60, queues=3, seed=4)
    ck = str(tmp_path / "ck")
    compact_topic(spark, endpoints, topic, table, checkpoint=ck)
    before = _table(spark, table)
    last = max(int(n) for n in os.listdir(os.path.join(ck, "commits")) if n.isdigit())
    for name in (str(last), f".{last}.crc"):                    # as if killed before commit
        if os.path.exists(os.path.join(ck, "commits", name)):
            os.remove(os.path.join(ck, "commits", name))
    shutil.rmtree(os.path.join(ck, "state"), ignore_errors=True)
    compact_topic(spark, endpoints, topic, table, checkpoint=ck)
    assert _table(spark, table) == before == _expected(spark, endpoints, topic)
    from delta.tables import DeltaTable
    ops = [r.operation for r in DeltaTable.forPath(spark, table).history().collect()]
    assert ops == ["WRITE"]              # the table was created by the write; the replay skipped
    files = [f for f in spark.read.format("delta").load(table).inputFiles()]
    buckets = {int(f.split("bucket=")[1].split("/")[0]) for f in files}
    assert len(files) == len(buckets)                           # one file per bucket


def test_a_first_build_is_written_and_replaces_what_a_job_that_lost_the_topic_wrote(
        spark, client, endpoints, compact, monkeypatch):
    """The first batch into a table that held no rows is written, not merged. If a job
    that lost the topic appended rows after this run found the table empty (stale
    values of its keys, a key deleted since), the written batch replaces them: one
    row per live key, each the newest, as a recomputation gives."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from rmq_spark.compaction import _job
    from rmq_spark.compaction.table import TABLE_DDL

    topic, table = compact
    _produce_updates(client, topic, 400, keys=40, queues=3, seed=21)
    client.produce(topic, [Message(b"old", key=b"gone")], queue=0)
    # what the other job appends: older records of some keys, and one deleted since
    stale = (spark.read.format("rocketmq").option("endpoints", endpoints).option("topic", topic)
             .load().where("offset < 30 OR (key = 'gone' AND value IS NOT NULL)"))
    client.produce(topic, [Message(None, key=b"gone")], queue=0)
    found = []

    def ensure_then_other_job_appends(spark_, s):
        buckets, empty = ensure(spark_, s)
        found.append(empty)
        (stale.withColumn("bucket", F.pmod(F.crc32("key"), F.lit(buckets)).cast("int"))
         .select(*[c.split()[0] for c in TABLE_DDL.split(", ")])
         .write.format("delta").mode("append").partitionBy("bucket").save(s.table))
        return buckets, empty

    ensure = _job._ensure_table
    monkeypatch.setattr(_job, "_ensure_table", ensure_then_other_job_appends)
    compact_topic(spark, endpoints, topic, table)
    assert found == [True]
    ops = [r.operation for r in DeltaTable.forPath(spark, table).history().collect()]
    assert ops == ["WRITE", "WRITE"]         # the other job's append, then this run's: no MERGE
    rows = spark.read.format("delta").load(table).select("key").collect()
    assert len(rows) == len({bytes(r.key) for r in rows})      # one row per key
    assert _table(spark, table) == _expected(spark, endpoints, topic)
    assert b"gone" not in _table(spark, table)


def test_killed_mid_batch_then_restarted_equals_a_recomputation(spark, client, endpoints, compact):
    """kill -9 of the job (driver and JVM) while a MERGE is in flight, then a rerun."""
    import os
    import signal
    import subprocess
    import sys

    topic, table = compact
    _produce_updates(client, topic, 900, keys=200, queues=3, seed=11)
    client.produce(topic, [Message(None, key=f"key-{k:05d}".encode()) for k in range(0, 60, 3)], queue=0)
    ckpt = os.path.join(table, "_rmq_checkpoints", topic)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmq_spark.cli.main", "--endpoints", endpoints, "compact", topic,
         "--table", table, "--max-offsets-per-trigger", "200"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: os.path.exists(os.path.join(ckpt, "commits", "0")) or proc.poll() is not None,
                   timeout=480, what="the first committed batch")
        assert proc.poll() is None, proc.stdout.read().decode()[-8000:]
        wait_until(lambda: any(os.path.exists(os.path.join(ckpt, "offsets", str(b)))
                               and not os.path.exists(os.path.join(ckpt, "commits", str(b)))
                               for b in range(1, 9)),
                   timeout=120, interval=0.01, what="a batch in flight")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    compacted = {q["queue"]: q["compacted"] for q in client.describe_topic(topic)["queue_info"]}
    assert any(compacted[o.queue] < o.latest for o in client.offsets(topic)), "the run was not cut short"
    compact_topic(spark, endpoints, topic)
    assert _table(spark, table) == _expected(spark, endpoints, topic)
    assert {q["queue"]: q["compacted"] for q in client.describe_topic(topic)["queue_info"]} == \
        {o.queue: o.latest for o in client.offsets(topic)}


def test_an_older_record_never_overwrites_a_newer_one(spark, client, endpoints, compact):
    """Key k goes to queue 2 first, then to queue 0 in a later batch: (0, x) < (2, y)."""
    topic, table = compact
    client.produce(topic, [Message(b"new", key=b"k")], queue=2)
    compact_topic(spark, endpoints, topic, table)
    client.produce(topic, [Message(b"older-by-order", key=b"k")], queue=0)
    compact_topic(spark, endpoints, topic)
    assert _table(spark, table)[b"k"][0] == b"new"


def test_bad_arguments_change_nothing(spark, client, endpoints, tmp_path):
    client.create_topic("plain-delete", queues=1)
    with pytest.raises(CompactionConfigError, match="cleanup policy 'delete'"):
        compact_topic(spark, endpoints, "plain-delete", str(tmp_path / "t"))
    with pytest.raises(CompactionConfigError, match="does not exist"):
        compact_topic(spark, endpoints, "no-such-topic", str(tmp_path / "t"))
    client.create_topic("c-bad", queues=1, cleanup_policy="compact")
    with pytest.raises(CompactionConfigError, match="buckets 0"):
        compact_topic(spark, endpoints, "c-bad", str(tmp_path / "t"), buckets=0)
    with pytest.raises(CompactionConfigError, match="trigger|interval"):
        compact_topic(spark, endpoints, "c-bad", str(tmp_path / "t"), trigger="soon")
    with pytest.raises(CompactionConfigError, match="lease TTL 0.5 s: use 3-86400 s"):
        compact_topic(spark, endpoints, "c-bad", str(tmp_path / "t"), lease_ttl_s=0.5)
    assert client.describe_topic("c-bad")["tier"] == ""
    assert client.describe_topic("c-bad")["compacted_table"] == ""
    assert not (tmp_path / "t").exists()


def test_a_running_job_holds_its_lease_for_the_ttl_it_was_given(spark, client, endpoints, compact):
    """``lease_ttl_s`` reaches the metadata group: another job is refused with an expiry
    at most that TTL away (not the 30 s default), and the lease goes with the job."""
    topic, table = compact
    _produce_updates(client, topic, 30, keys=10, queues=3, seed=4)
    q = compact_topic(spark, endpoints, topic, table, trigger="1s", lease_ttl_s=5)
    try:
        granted, holder, expires_ms, _ = client.lease(topic, "compact", "another-job", 60_000)
        now_ms = time.time() * 1000
        assert not granted and holder.endswith(f"_rmq_checkpoints/{topic}"), holder
        assert now_ms - 1000 < expires_ms <= now_ms + 5000      # one node clock: this host's
    finally:
        q.stop()
    wait_until(lambda: client.lease(topic, "compact", "another-job", 60_000)[0], timeout=30,
               what="the stopped job's lease to be given back")


def test_a_table_from_before_the_bucket_file_and_a_table_that_is_not_compacted(
        spark, client, endpoints, compact, tmp_path, capsys):
    """A table created by CREATE TABLE with the property rmq.buckets (before
    _rmq_table.json) keeps its bucket count; a Delta table of other columns is refused."""
    from delta.tables import DeltaTable

    from rmq_spark.compaction.table import TABLE_DDL

    topic, table = compact
    (DeltaTable.createIfNotExists(spark).location(table)
     .addColumns(spark.createDataFrame([], TABLE_DDL).schema).partitionedBy("bucket")
     .property("delta.enableDeletionVectors", "false").property("rmq.buckets", "4").execute())
    _produce_updates(client, topic, 300, keys=30, queues=3, seed=9)
    compact_topic(spark, endpoints, topic, table)              # buckets=32 by default
    assert _table(spark, table) == _expected(spark, endpoints, topic)
    assert {r.bucket for r in spark.read.format("delta").load(table).select("bucket")
            .distinct().collect()} <= set(range(4))
    t = CompactedTable(table)
    assert all(t.get(k).value == v for k, (v, _, _) in _expected(spark, endpoints, topic).items())
    other = str(tmp_path / "other")
    spark.range(3).write.format("delta").save(other)
    client.create_topic(topic + "-o", queues=1, cleanup_policy="compact")
    with pytest.raises(CompactionConfigError, match="is not a compacted table"):
        compact_topic(spark, endpoints, topic + "-o", other)
    with pytest.raises(CompactionConfigError, match="is not a compacted table"):
        CompactedTable(other).get(b"k")
    # A damaged bucket file is named, with what it should hold; nothing is written.
    (tmp_path / "other" / "_rmq_table.json").write_text('{"buckets": "many"}')
    with pytest.raises(CompactionConfigError, match=r"_rmq_table.json does not hold a bucket "
                       r"count: .*many.*expected \{\"buckets\": N\}"):
        CompactedTable(other).get(b"k")
    from rmq_spark.cli.main import main as rmq
    capsys.readouterr()
    assert rmq(["--endpoints", endpoints, "get", topic + "-o", "k", "--table", other]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rmq get: ") and "does not hold a bucket count" in err


def test_lookup_sees_the_hot_tail_before_the_table(spark, client, endpoints, compact):
    topic, table = compact
    client.produce(topic, [Message(b"a1", key=b"a"), Message(b"b1", key=b"b")], queue=0)
    compact_topic(spark, endpoints, topic, table)
    assert client.describe_topic(topic)["queue_info"][0]["compacted"] == 2
    client.produce(topic, [Message(b"a2", key=b"a"), Message(b"c1", key=b"c")], queue=0)
    look = KeyLookup(client, topic)
    assert look.latest(b"a").value == b"a2"          # the tail is newer than the table
    assert look.latest(b"b").value == b"b1"          # only in the table
    assert look.latest(b"c").value == b"c1"          # only in the tail
    assert look.latest(b"zz") is None
    assert [(r.key, r.value) for r in look.scan(b"")] == [(b"a", b"a2"), (b"b", b"b1"),
                                                          (b"c", b"c1")]
    compact_topic(spark, endpoints, topic)
    assert CompactedTable(table).get(b"a").value == b"a2"
    with pytest.raises(CompactionConfigError, match="cleanup policy"):
        client.create_topic("plain-for-lookup", queues=1)
        KeyLookup(client, "plain-for-lookup")


def test_tombstone_deletes_the_key_and_replay_rebuilds_the_table(spark, client, endpoints,
                                                                compact, tmp_path):
    topic, table = compact
    client.produce(topic, [Message(b"1", key=b"a"), Message(b"1", key=b"b"),
                           Message(b"1", key=b"c")], queue=0)
    compact_topic(spark, endpoints, topic, table)
    client.produce(topic, [Message(None, key=b"a"), Message(b"2", key=b"b")], queue=0)
    client.produce(topic, [Message(None, key=b"c"), Message(b"3", key=b"c")], queue=1)
    compact_topic(spark, endpoints, topic)
    got = _table(spark, table)
    assert set(got) == {b"b", b"c"} and got[b"b"][0] == b"2" and got[b"c"][0] == b"3"
    assert KeyLookup(client, topic).latest(b"a") is None
    client.produce(topic, [Message(None, key=b"b")], queue=0)      # only in the hot tail
    assert KeyLookup(client, topic).latest(b"b") is None
    # Replaying the topic from earliest into a fresh table gives the same table.
    compact_topic(spark, endpoints, topic)
    other = str(tmp_path / "replayed")
    client.create_topic(topic + "-r", queues=3, cleanup_policy="compact")
    rows = (spark.read.format("rocketmq").option("endpoints", endpoints).option("topic", topic)
            .load().orderBy("queue", "offset").collect())
    for r in rows:
        client.produce(topic + "-r", [Message(None if r.value is None else bytes(r.value),
                                              key=bytes(r.key))], queue=r.queue)
    compact_topic(spark, endpoints, topic + "-r", other)
    assert {k: v[0] for k, v in _table(spark, other).items()} == \
        {k: v[0] for k, v in _table(spark, table).items()} == {b"c": b"3"}


def test_hot_log_compaction_behind_the_job_keeps_replay_equal_to_the_table(spark, client, endpoints,
                                                                          compact):
    topic, table = compact
    # ~3 MB of updates to 150 keys in 64 KiB segments, and deletes of 10 keys.
    _produce_updates(client, topic, 3000, keys=150, queues=3, seed=7, pad=1000)
    client.produce(topic, [Message(None, key=f"key-{k:05d}".encode()) for k in range(0, 30, 3)], queue=0)
    _produce_updates(client, topic, 300, keys=120, queues=3, seed=8, prefix="w", pad=1000, first_key=30)

    def records_in_topic():
        return (spark.read.format("rocketmq").option("endpoints", endpoints).option("topic", topic)
                .load().count())
    produced = records_in_topic()
    assert produced == 3310
    compact_topic(spark, endpoints, topic, table)
    # The job's watermark lets every replica drop superseded records below it.
    wait_until(lambda: records_in_topic() < produced // 2, timeout=60, what="hot-log compaction")
    offsets = client.offsets(topic)
    assert [o.earliest for o in offsets] == [0, 0, 0] and sum(o.latest for o in offsets) == produced
    # Replaying what is left from earliest gives the table: every key's latest value,
    # and every delete (tombstones younger than delete-retention stay in the log).
    last = _last_records(spark, endpoints, topic)
    assert _table(spark, table) == {k: v for k, v in last.items() if v[0] is not None}
    deleted = {k for k, v in last.items() if v[0] is None}
    assert deleted and all(KeyLookup(client, topic).latest(k) is None for k in deleted)


def test_keyless_produce_to_a_compact_topic_fails(client, compact):
    topic, _ = compact
    with pytest.raises(Exception, match="every message needs a key"):
        client.produce(topic, [Message(b"no key")], queue=0)


def test_cli_get_and_bad_compact_arguments(spark, client, endpoints, compact, capsys):
    from rmq_spark.cli.main import main as rmq
    topic, table = compact
    client.produce(topic, [Message(b"10", key=b"acct-1"), Message(b"20", key=b"acct-2"),
                           Message(b"11", key=b"acct-1")], queue=0)
    compact_topic(spark, endpoints, topic, table)
    capsys.readouterr()
    assert rmq(["--endpoints", endpoints, "get", topic, "acct-1"]) == 0
    assert capsys.readouterr().out == "acct-1\t11\n"
    assert rmq(["--endpoints", endpoints, "get", topic, "acct-", "--prefix"]) == 0
    assert capsys.readouterr().out == "acct-1\t11\nacct-2\t20\n"
    assert rmq(["--endpoints", endpoints, "get", topic, "nope"]) == 1
    assert "no value for key 'nope'" in capsys.readouterr().err
    assert rmq(["--endpoints", endpoints, "compact", topic, "--buckets", "0"]) == 2
    assert "buckets 0" in capsys.readouterr().err
    assert rmq(["--endpoints", endpoints, "compact", topic, "--lease-ttl", "forever"]) == 2
    assert "--lease-ttl forever: give a duration such as 10s" in capsys.readouterr().err
    client.create_topic("plain-cli", queues=1)
    assert rmq(["--endpoints", endpoints, "compact", "plain-cli", "--table", table]) == 2
    assert "cleanup policy 'delete'" in capsys.readouterr().err
    assert rmq(["--endpoints", endpoints, "topic", "alter", "plain-cli", "--queues", "3"]) == 0
    assert client.describe_topic("plain-cli")["queues"] == 3


def test_compaction_lag_metrics_go_to_zero_after_an_available_now_run(spark, client, endpoints, cluster, compact):
    """rmq_compaction_lag_messages/_seconds (/metrics, from the queues' leaders):
    messages not merged into the table yet, the oldest one's age; 0 after a run."""
    from tests.scrape import series

    topic, table = compact
    _produce_updates(client, topic, 90, keys=20, queues=3, seed=4)
    time.sleep(1.1)
    lag = {d["queue"]: v for d, v in series(cluster, "rmq_compaction_lag_messages", topic=topic)}
    assert sorted(lag) == ["0", "1", "2"] and sum(lag.values()) == 90
    assert all(v >= 1.0 for _, v in series(cluster, "rmq_compaction_lag_seconds", topic=topic))
    compact_topic(spark, endpoints, topic, table)
    assert all(v == 0 for _, v in series(cluster, "rmq_compaction_lag_messages", topic=topic))
    assert all(v == 0 for _, v in series(cluster, "rmq_compaction_lag_seconds", topic=topic))
    assert sum(v for _, v in series(cluster, "rmq_compaction_topic_lag_messages", topic=topic)) == 0


def test_latest_per_key_reads_one_row_per_live_key_without_the_job(spark, client, endpoints, compact):
    """spark.read ... latestPerKey=true: the nodes' key index answers (issue 40), no
    compaction job ran; a deleted key has no row; each row's offset is the key's
    revision, as kv_get gives it."""
    compact, _ = compact
    rng = random.Random(7)
    for i in range(0, 300, 50):                  # no queue given: by key hash, as kv_put routes
        client.produce(compact, [Message(f"v{i + j}".encode(), key=f"k{rng.randrange(20)}".encode())
                                 for j in range(50)])
    for k in range(20):
        client.produce(compact, [Message(b"last", key=f"k{k}".encode())])
    client.produce(compact, [Message(None, key=b"k3")])            # deleted
    rows = (spark.read.format("rocketmq").option("endpoints", endpoints).option("subscribe", compact)
            .option("latestPerKey", "true").load().collect())
    got = {bytes(r.key): (bytes(r.value), r.offset) for r in rows}
    assert len(rows) == len(got) == 19 and b"k3" not in got
    for key, (value, offset) in got.items():
        e = client.kv_get(compact, key)
        assert (e.value, e.revision) == (value, offset), key
    with pytest.raises(Exception, match="latestPerKey.*startingOffsets|startingOffsets.*latestPerKey"):
        (spark.read.format("rocketmq").option("endpoints", endpoints).option("subscribe", compact)
         .option("latestPerKey", "true").option("startingOffsets", "earliest").load().collect())
