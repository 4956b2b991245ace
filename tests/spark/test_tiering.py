"""The tiering job: rocketmq -> Delta/Parquet archive, exactly once, with watermarks.

Real cluster, real Spark, real Delta. The archive is checked against the hot
log itself (``readArchive=false``): every column, every (queue, offset) once.
"""
from __future__ import annotations

import datetime as dt
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from rmq_spark.archive import layout
from rmq_spark.archive.errors import ArchiveError
from rmq_spark.archive.reader import delta_referenced_paths
from rmq_spark.client import Message
from rmq_spark.tiering import TierConfigError, tier_topic
from rmq_spark.tiering._retention import ArchiveRetention
from tests.conftest import wait_until

from ._helpers import produce, reader

pytestmark = [pytest.mark.spark, pytest.mark.integration]
FORMATS = ["delta", "parquet"]


@pytest.fixture(scope="module", autouse=True)
def small_delta_snapshots(spark):
    """This module's Delta reads rebuild table state in 2 partitions, not Delta's 50
    (the tiering job itself does the same for its own query)."""
    key = "spark.databricks.delta.snapshotPartitions"
    old = spark.conf.get(key, None)
    spark.conf.set(key, "2")
    yield
    if old is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, old)


# ------------------------------------------------------------------ helpers
def run_tier(spark, endpoints, topic, archive=None, fmt=None, **kw) -> list[str]:
    lines: list[str] = []
    q = tier_topic(spark, endpoints, topic, archive=None if archive is None else str(archive),
                   format=fmt, progress=lines.append, **kw)
    assert not q.isActive
    return lines


def reported_batches(lines: list[str]) -> list[int]:
    """Batch ids the job's progress lines cover ("batch N" or "batches A-B"), in order."""
    out = []
    for line in lines:
        m = re.search(r"batch(?:es)? (\d+)(?:-(\d+))? committed", line)
        assert m, line
        out += range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1)
    return out


def archive_df(spark, path, fmt, topic):
    df = (spark.read.format("delta").load(str(path)) if fmt == "delta"
          else spark.read.schema(layout.ARCHIVE_DDL).option("ignoreMissingFiles", "true")
          .parquet(str(path)))
    return df.where(df.topic == topic)


def _row(r) -> tuple:
    return (r.topic, r.queue, r.offset, r.timestamp, r.born_timestamp, r.key, r.value, r.tags,
            tuple(sorted((r.properties or {}).items())), r.msg_id)


def archive_rows(spark, path, fmt, topic) -> list[tuple]:
    rows = archive_df(spark, path, fmt, topic).collect()
    for r in rows:       # date = UTC date of the store time (pyspark gives naive local times)
        assert r.date == r.timestamp.astimezone(dt.timezone.utc).date(), r
    return sorted(_row(r) for r in rows)


def hot_rows(spark, endpoints, topic) -> list[tuple]:
    return sorted(_row(r) for r in reader(spark, endpoints, topic, readArchive="false").collect())


def assert_exactly_once(rows: list[tuple]) -> None:
    keys = [(r[1], r[2]) for r in rows]
    assert len(keys) == len(set(keys)), "a (queue, offset) is in the archive twice"


def watermarks(client, topic) -> dict[int, tuple[int, int, int]]:
    """queue -> (archive_earliest, archived, hot latest)."""
    return {q["queue"]: (q["archive_earliest"], q["archived"], q["latest"])
            for q in client.describe_topic(topic)["queue_info"]}


def produce_rich(client, topic, count, start=0, queues=4) -> None:
    """Keys, tags and properties on most rows; some without a key, tags or properties."""
    produce(client, topic, count, queues=queues, start=start,
            tags=lambda i: "TagA" if i % 3 else "")
    client.produce(topic, [Message(b"no-key", properties={"src": "web", "n": str(start)}),
                           Message(b"k", key=b"k1", tags="TagB", properties={"x": ""})], queue=1)


def data_files(path, topic) -> list[str]:
    return glob.glob(os.path.join(str(path), f"topic={topic}", "*", "*.parquet"))


def rmq(endpoints, *args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rmq_spark.cli.main", "--endpoints", endpoints,
                           *args], capture_output=True, text=True, timeout=timeout)


# -------------------------------------------------------------------- tests
@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_then_incremental(spark, client, endpoints, topic, tmp_path, fmt):
    path = tmp_path / "archive"
    produce_rich(client, topic, 200, queues=3)            # queue 3 stays empty for now
    lines = run_tier(spark, endpoints, topic, path, fmt, max_offsets_per_trigger=120)
    assert all("committed" in line for line in lines)
    batches = reported_batches(lines)       # a line covers every batch since the one before
    assert len(batches) >= 2 and batches == list(range(len(batches))), lines
    assert " rows, archived to q0=" in lines[-1] and lines[-1].endswith("lag 0")
    assert client.describe_topic(topic)["tier"] == f"{fmt}:{path}"
    rows = archive_rows(spark, path, fmt, topic)
    assert rows == hot_rows(spark, endpoints, topic) and len(rows) == 202
    assert_exactly_once(rows)
    assert watermarks(client, topic) == {0: (0, 67, 67), 1: (0, 69, 69), 2: (0, 66, 66),
                                         3: (-1, 0, 0)}
    for f in data_files(path, topic):       # each file in (queue, offset) order
        t = pq.read_table(f, columns=["queue", "offset"])
        keys = list(zip(t.column("queue").to_pylist(), t.column("offset").to_pylist()))
        assert keys == sorted(keys), f

    produce_rich(client, topic, 100, start=200)
    run_tier(spark, endpoints, topic)           # the topic's tier config names the archive now
    rows = archive_rows(spark, path, fmt, topic)
    assert rows == hot_rows(spark, endpoints, topic) and len(rows) == 304
    assert_exactly_once(rows)
    assert all(e == 0 and a == latest for e, a, latest in watermarks(client, topic).values())


@pytest.mark.parametrize("fmt", FORMATS)
def test_files_no_batch_committed_go_once_old(spark, client, endpoints, topic, tmp_path, fmt):
    """A batch killed before its commit leaves files the archive's log never names: the
    next run removes this topic's such files once ``vacuum_retain_hours`` old. Committed
    files (however old), recent files and other topics' files stay."""
    path = tmp_path / "archive"
    produce(client, topic, 300, size=100)
    run_tier(spark, endpoints, topic, path, fmt)
    committed = data_files(path, topic)
    assert committed
    day = os.path.dirname(committed[0])
    week_ago = time.time() - 8 * 86400

    def plant(folder: str, name: str, mtime: float) -> tuple[str, str]:
        """A data file as a killed task leaves it, with Hadoop's checksum file."""
        f, crc = os.path.join(folder, name), os.path.join(folder, f".{name}.crc")
        shutil.copyfile(committed[0], f)
        with open(crc, "wb") as out:
            out.write(b"crc")
        os.utime(f, (mtime, mtime))
        return f, crc

    old, old_crc = plant(day, "part-00000-killed-old.c000.snappy.parquet", week_ago)
    recent, recent_crc = plant(day, "part-00001-killed-new.c000.snappy.parquet",
                               time.time() - 3600)
    foreign_dir = path / "topic=another-topic" / "date=2020-01-01"
    foreign_dir.mkdir(parents=True)
    foreign, _ = plant(str(foreign_dir), "part-00000-other.c000.snappy.parquet", week_ago)
    for f in committed:
        os.utime(f, (week_ago, week_ago))

    produce(client, topic, 60, size=100, start=300)
    run_tier(spark, endpoints, topic)           # default retain: 168 hours
    assert not os.path.exists(old) and not os.path.exists(old_crc)
    assert all(os.path.exists(f) for f in (recent, recent_crc, foreign, *committed))
    rows = archive_rows(spark, path, fmt, topic)
    assert rows == hot_rows(spark, endpoints, topic) and len(rows) == 360
    assert_exactly_once(rows)

    # With no retain at all, the archive named by a relative path and through a symlink
    # (the log holds the real absolute paths): only files over a day old go; committed
    # files and a file written since the job started stay.
    in_flight, _ = plant(day, "part-00002-in-flight.c000.snappy.parquet", time.time() + 1)
    alias = tmp_path / "alias"
    alias.symlink_to(path)
    for name in (os.path.relpath(path), str(alias)):
        older, _ = plant(day, "part-00003-killed-2d.c000.snappy.parquet",
                         time.time() - 2 * 86400)
        retention = ArchiveRetention(client, topic, layout.Tier(fmt, name),
                                     vacuum_retain_hours=0)
        assert retention.sweep_orphans() == 1, name
        assert not os.path.exists(older)
        assert all(os.path.exists(f) for f in (recent, in_flight, foreign, *committed)), name
    if fmt == "delta":
        # A file a DELETE retired is VACUUM's (time travel reads it until then): it stays.
        from delta.tables import DeltaTable

        DeltaTable.forPath(spark, str(path)).delete(f"topic = '{topic}' AND offset < 3")
        files = set(data_files(path, topic)) - {recent, in_flight}    # the log's
        assert set(committed) < files            # the DELETE wrote files, removed none
        for f in files:
            os.utime(f, (week_ago, week_ago))
        retention = ArchiveRetention(client, topic, layout.Tier(fmt, str(path)),
                                     vacuum_retain_hours=0)
        assert retention.sweep_orphans() == 0
        assert all(os.path.exists(f) for f in files)

    # Nothing is removed where the log cannot be trusted to name every committed file.
    retention = ArchiveRetention(client, topic, layout.Tier(fmt, str(path)),
                                 vacuum_retain_hours=0)
    older, _ = plant(day, "part-00004-killed-2d.c000.snappy.parquet", time.time() - 2 * 86400)
    other_log = path / ("_spark_metadata" if fmt == "delta" else "_delta_log")
    other_log.mkdir()                          # the archive's format was switched
    assert retention.sweep_orphans() == 0 and os.path.exists(older)
    other_log.rmdir()
    if fmt == "delta":                         # a commit missing (e.g. cleaned up after a
        log_dir = path / "_delta_log"          # checkpoint kind the reader does not read)
        first = log_dir / f"{0:020d}.json"
        first.rename(tmp_path / "commit-0.json")
        assert retention.sweep_orphans() == 0 and os.path.exists(older)
        with pytest.raises(ArchiveError, match="commit 0 is missing"):
            delta_referenced_paths(str(path))
        (tmp_path / "commit-0.json").rename(first)
    assert retention.sweep_orphans() == 1 and not os.path.exists(older)


@pytest.mark.parametrize("fmt", FORMATS)
def test_new_checkpoint_starts_where_the_archive_ends(spark, client, endpoints, topic, tmp_path,
                                                       fmt):
    path = tmp_path / "archive"
    produce(client, topic, 100)
    run_tier(spark, endpoints, topic, path, fmt)
    produce(client, topic, 40, start=100)
    run_tier(spark, endpoints, topic, checkpoint=str(tmp_path / "new"))
    rows = archive_rows(spark, path, fmt, topic)
    assert rows == hot_rows(spark, endpoints, topic) and len(rows) == 140
    assert_exactly_once(rows)
    # The old checkpoint ends below the archive now: resuming it would archive twice.
    with pytest.raises(TierConfigError, match="another checkpoint"):
        tier_topic(spark, endpoints, topic)
    assert len(archive_rows(spark, path, fmt, topic)) == 140


@pytest.mark.parametrize("fmt", FORMATS)
def test_killed_mid_batch_then_restarted_archives_each_message_once(spark, client, endpoints,
                                                                     topic, tmp_path, fmt):
    path = tmp_path / "archive"
    produce(client, topic, 800, size=200)
    ckpt = path / "_rmq_checkpoints" / topic
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmq_spark.cli.main", "--endpoints", endpoints, "tier", topic,
         "--archive", str(path), "--format", fmt, "--max-offsets-per-trigger", "100"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # kill -9 (the driver and its JVM) while a batch after the first is being written
        wait_until(lambda: (ckpt / "commits" / "0").exists() or proc.poll() is not None,
                   timeout=480, what="the first committed batch")
        assert proc.poll() is None, proc.stdout.read().decode()[-8000:]
        wait_until(lambda: any((ckpt / "offsets" / str(b)).exists()
                               and not (ckpt / "commits" / str(b)).exists() for b in range(1, 7)),
                   timeout=120, interval=0.01, what="a batch in flight")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed_at = watermarks(client, topic)
    assert any(a < latest for _, a, latest in killed_at.values()), "the run was not cut short"

    run_tier(spark, endpoints, topic)
    rows = archive_rows(spark, path, fmt, topic)
    assert_exactly_once(rows)
    assert rows == hot_rows(spark, endpoints, topic) and len(rows) == 800
    assert all(a == latest for _, a, latest in watermarks(client, topic).values())


def _same_group_topic(client, name: str, queue: int, **config) -> str:
    """A new 1-queue topic whose queue lives in the raft group of (name, queue): same
    retention passes. New queues go to the least loaded group, so creating topics
    until one lands there takes at most a few (the ones that miss stay, empty)."""
    group = client.group_of(name, queue)
    for i in range(30):
        created = client.create_topic(f"{name}-c{i}", queues=1, **config)
        if created["queue_groups"] == [group]:
            return created["name"]
    raise AssertionError(f"no new queue landed in group {group}")


def test_hot_segments_go_only_after_they_are_archived(spark, client, endpoints, tmp_path):
    name, path = "hot-retention", tmp_path / "archive"
    client.create_topic(name, queues=1, tier=f"delta:{path}", local_retention_ms=1)
    for i in range(20):                                  # ~320 KiB: several 64 KiB segments
        client.produce(name, [Message(f"{i}-{j}".encode().ljust(4096, b".")) for j in range(4)],
                       queue=0)
    control = _same_group_topic(client, name, 0, retention_ms=1)   # untiered, same group
    moved = []
    for round_ in range(2):                              # two passes after the tiered produce
        for i in range(20):
            client.produce(control, [Message(b"x" * 4096) for _ in range(4)], queue=0)
        wait_until(lambda: client.offsets(control)[0].earliest > (moved[-1] if moved else 0),
                   timeout=60, what="a retention pass on the control topic")
        moved.append(client.offsets(control)[0].earliest)
    assert client.offsets(name)[0].earliest == 0         # tiering has not run: nothing deleted
    assert watermarks(client, name)[0][1] == -1

    lines: list[str] = []                                # a running job this time
    q = tier_topic(spark, endpoints, name, trigger="500ms", progress=lines.append)
    try:
        latest = client.offsets(name)[0].latest
        wait_until(lambda: watermarks(client, name)[0] == (0, latest, latest), timeout=180,
                   what="the running job to archive everything")
        wait_until(lambda: lines and lines[-1].endswith(f"archived to q0={latest}, lag 0"),
                   timeout=60, what="the progress line of the last batch")
        wait_until(lambda: client.offsets(name)[0].earliest > 0, timeout=60,
                   what="hot segments below the archive watermark to be deleted")
        running = str(path / "_rmq_checkpoints" / name)
        assert client.describe_topic(name)["tier_job"] == running
        assert f"tiering job: checkpoint {running} (lease" in rmq(endpoints, "topic", "describe",
                                                                  name).stdout
        # One job per topic: a second one (another checkpoint) is refused while this runs.
        with pytest.raises(TierConfigError, match=r"being tiered by another job \(checkpoint "
                           + re.escape(str(path / "_rmq_checkpoints" / name))):
            tier_topic(spark, endpoints, name, checkpoint=str(tmp_path / "second"))
        assert not (tmp_path / "second").exists()
    finally:
        q.stop()
    assert 0 < client.offsets(name)[0].earliest <= latest
    assert len(archive_rows(spark, path, "delta", name)) == latest == 80
    # Stopped: its monitor gives the lease back, so another job may take the topic.
    wait_until(lambda: client.lease(name, "tier", "probe", 1)[0], timeout=30,
               what="the stopped job to release its lease")


@pytest.mark.parametrize("fmt", FORMATS)
def test_archive_retention_removes_expired_rows(spark, client, endpoints, tmp_path, fmt,
                                                caplog):
    name, path = f"arch-retention-{fmt}", tmp_path / "archive"
    client.create_topic(name, queues=2, retention_ms=2000, local_retention_ms=3_600_000)
    produce(client, name, 60, queues=2)
    run_tier(spark, endpoints, name, path, fmt, retention_check_s=3600)
    rows = archive_rows(spark, path, fmt, name)
    assert len(rows) == 60
    newest_ms = max(r[3] for r in rows).timestamp() * 1000          # naive local time
    wait_until(lambda: time.time() * 1000 > newest_ms + 2000 + 100, timeout=30,
               what="every archived row to be older than the 2 s retention")
    if fmt == "delta":
        # Log cleanup has removed the first commit after a checkpoint: VACUUM LITE
        # cannot tell what to delete; the job falls back to a full VACUUM.
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval'='1')")
        altered = max(int(n[:20]) for n in os.listdir(path / "_delta_log") if n.endswith(".json"))
        assert altered > 0 and os.path.exists(path / "_delta_log" / f"{altered:020d}.checkpoint.parquet")
        os.remove(path / "_delta_log" / f"{0:020d}.json")

    with caplog.at_level("INFO", logger="rmq_spark.tiering._retention"):
        run_tier(spark, endpoints, name, vacuum_retain_hours=0)
    assert archive_rows(spark, path, fmt, name) == []
    assert data_files(path, name) == []                  # gone from disk (VACUUM for Delta)
    assert all(e == a == latest == 30 for e, a, latest in watermarks(client, name).values())
    if fmt == "delta":
        ops = [r.operation for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()]
        assert "DELETE" in ops and "VACUUM END" in ops
        assert any("running a full VACUUM" in r.message for r in caplog.records)


def test_archive_is_a_delta_table_and_describe_shows_it(spark, client, endpoints, topic,
                                                         tmp_path):
    from delta.tables import DeltaTable

    path = tmp_path / "archive"
    produce(client, topic, 40)
    run_tier(spark, endpoints, topic, path, "delta")
    table = DeltaTable.forPath(spark, str(path))
    history = [(r.version, r.operation) for r in table.history().collect()]
    # The job's fence (an empty append, rmq_spark/tiering/_fence.py) created the table,
    # then the one batch appended.
    assert history == [(1, "WRITE"), (0, "WRITE")]
    assert table.history().collect()[-1].operationMetrics.get("numOutputRows", "0") == "0"
    want = spark.createDataFrame([], layout.ARCHIVE_DDL).schema
    assert [(f.name, f.dataType) for f in table.toDF().schema] == \
        [(f.name, f.dataType) for f in want]
    detail = table.detail().collect()[0]
    assert detail.partitionColumns == ["topic", "date"]
    assert detail.properties["delta.enableDeletionVectors"] == "false"
    assert detail.properties["delta.dataSkippingStatsColumns"] == "queue,offset,timestamp"

    produce(client, topic, 8, start=40)                  # 2 per queue not archived yet
    out = rmq(endpoints, "topic", "describe", topic)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    head, rows = lines[1], lines[3:-1]
    assert "archive earliest" in head and "archived to" in head and "tier lag" in head
    assert lines[-1].startswith("tiering job: none running"), lines[-1]   # the job has ended
    for line in rows:                                    # earliest latest size archive archived lag
        cells = line.split()
        assert cells[2:4] == ["0", "12"] and cells[6:9] == ["0", "10", "2"], line
    d = json.loads(rmq(endpoints, "topic", "describe", topic, "--json").stdout)
    assert [(q["archive_earliest"], q["archived"]) for q in d["queue_info"]] == [(0, 10)] * 4


def test_topics_sharing_a_new_delta_archive_create_it_together(spark, client, endpoints,
                                                              tmp_path, caplog, monkeypatch):
    """Two topics' jobs on one new archive: both first appends find no table and
    create it, one loses the commit and appends again; each topic once, complete."""
    import threading

    from delta.tables import DeltaTable

    from rmq_spark.tiering import _job

    path = tmp_path / "shared"
    topics = ["shared-a", "shared-b"]
    for i, t in enumerate(topics):
        client.create_topic(t, queues=2)
        produce(client, t, 300, queues=2, start=1000 * i)
    # Both first batches look for the table before either writes (the race, made certain).
    both_looked = threading.Barrier(len(topics))
    real_has_log = _job._has_delta_log

    def has_log_after_both_looked(p):
        found = real_has_log(p)
        if not found and not both_looked.broken:    # the first looks; a retry finds the table
            both_looked.wait(timeout=60)
        return found

    monkeypatch.setattr(_job, "_has_delta_log", has_log_after_both_looked)
    errors: list[BaseException] = []

    def tier(t):
        try:
            run_tier(spark, endpoints, t, path, "delta")
        except BaseException as e:
            errors.append(e)

    with caplog.at_level("INFO", logger="rmq_spark.tiering._job"):
        threads = [threading.Thread(target=tier, args=(t,)) for t in topics]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=300)
    assert not errors, errors
    retried = [r for r in caplog.records if "created by another job meanwhile" in r.message]
    assert len(retried) == 1
    for t in topics:
        rows = archive_rows(spark, path, "delta", t)
        assert rows == hot_rows(spark, endpoints, t) and len(rows) == 300
        assert_exactly_once(rows)
    ops = [r.operation for r in DeltaTable.forPath(spark, str(path)).history().collect()]
    assert ops == ["WRITE"] * 4           # each job's fence (the race is there), each job's batch


def test_cli_bad_input_is_refused_and_changes_nothing(client, endpoints, topic, tmp_path):
    arch = str(tmp_path / "a")
    cases = [
        (["tier", topic, "--archive", arch, "--format", "orc"], "invalid choice: 'orc'"),
        (["tier", topic, "--archive", arch, "--trigger", "soon"], "available-now"),
        (["tier", topic, "--archive", arch, "--max-offsets-per-trigger", "0"], ">= 1"),
        (["tier", "no-such-topic", "--archive", arch], "does not exist"),
        (["tier", topic], "has no tier config"),
        (["tier", topic, "--archive", arch, "--vacuum-retain", "soon"], "duration"),
        (["tier", topic, "--archive", arch, "--lease-ttl", "1s"], "lease TTL 1 s: use 3-86400 s"),
        (["tier", topic, "--archive", arch, "--lease-ttl", "2d"], "lease TTL 172800 s: use 3-86400 s"),
        (["tier", topic, "--archive", arch, "--lease-ttl", "soon"], "--lease-ttl soon: give a duration such as 10s"),
    ]
    for args, message in cases:
        out = rmq(endpoints, *args)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
    assert client.describe_topic(topic)["tier"] == "" and not os.path.exists(arch)

    client.alter_topic(topic, tier=f"delta:{arch}")
    other = str(tmp_path / "b")
    out = rmq(endpoints, "tier", topic, "--archive", other)
    assert out.returncode == 2 and f"delta:{arch}" in out.stderr and other in out.stderr
    out = rmq(endpoints, "tier", topic, "--format", "parquet")
    assert out.returncode == 2 and "does not match" in out.stderr
    assert client.describe_topic(topic)["tier"] == f"delta:{arch}" and not os.path.exists(other)


def test_tiering_lag_metrics_go_to_zero_after_an_available_now_run(spark, client, endpoints, cluster, tmp_path):
    """rmq_tiering_lag_messages/_seconds on the queues' leaders (/metrics): the hot
    messages not archived yet, and the age of the oldest; 0 once the job ran."""
    from tests.scrape import series

    name = "tier-lag-metrics"
    client.create_topic(name, queues=2, tier=f"delta:{tmp_path / 'archive'}")
    produce(client, name, 30, queues=2)
    time.sleep(1.1)
    lag = {d["queue"]: v for d, v in series(cluster, "rmq_tiering_lag_messages", topic=name)}
    assert lag == {"0": 15, "1": 15}
    secs = [v for _, v in series(cluster, "rmq_tiering_lag_seconds", topic=name)]
    assert len(secs) == 2 and all(s >= 1.0 for s in secs), secs
    run_tier(spark, endpoints, name)
    assert {d["queue"]: v for d, v in series(cluster, "rmq_tiering_lag_messages", topic=name)} == {"0": 0, "1": 0}
    assert [v for _, v in series(cluster, "rmq_tiering_lag_seconds", topic=name)] == [0.0, 0.0]
    assert sum(v for _, v in series(cluster, "rmq_tiering_topic_lag_messages", topic=name)) == 0
