"""Archives, checkpoints and compacted tables on object storage (issue 21).

A real S3-compatible server (moto's, ``tests/s3server.py``) on loopback; the
AWS environment points at it before Spark starts (``conftest.s3``), as a user
points tools at an S3-compatible store. Spark writes through Hadoop's S3A
(jars/pom.xml), the Python side reads through pyarrow (``rmq_spark.fs``), and
an independent reader (the ``deltalake`` package, pyarrow datasets) checks
what landed.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pyarrow.dataset as pads
import pytest

from rmq_spark import fs
from rmq_spark.client import Message
from rmq_spark.compaction import CompactedTable, CompactionConfigError, KeyLookup, compact_topic
from rmq_spark.tiering import TierConfigError, tier_topic

from ..conftest import wait_until
from ._helpers import reader

pytestmark = [pytest.mark.spark, pytest.mark.integration]

QUEUES = 2


def _produce(client, topic, count, start=0, size=400):
    vals = []
    for q in range(QUEUES):
        msgs = [Message(f"{topic}-{i}".encode().ljust(size, b"."), key=f"k{i}".encode())
                for i in range(start + q, start + count, QUEUES)]
        for i in range(0, len(msgs), 50):          # many batches: segments roll (64 KiB)
            client.produce(topic, msgs[i:i + 50], queue=q)
        vals += [m.value for m in msgs]
    return vals


def _tier(spark, endpoints, topic, **kw) -> list[str]:
    lines: list[str] = []
    q = tier_topic(spark, endpoints, topic, progress=lines.append, **kw)
    assert not q.isActive
    return lines


def _archived(client, topic) -> dict[int, int]:
    return {q["queue"]: q["archived"] for q in client.describe_topic(topic)["queue_info"]}


def _independent_rows(uri: str, fmt: str, topic: str) -> list[tuple[int, int]]:
    """(queue, offset) of every archived row of ``topic``, read without this package:
    delta-rs for a Delta archive, a pyarrow dataset of the files the sink's log names
    for Parquet."""
    if fmt == "delta":
        from deltalake import DeltaTable
        t = DeltaTable(uri.replace("s3a://", "s3://", 1)).to_pyarrow_table(
            columns=["topic", "queue", "offset"])
    else:
        import json as _json
        import pyarrow.fs as pafs
        store, root = pafs.FileSystem.from_uri(uri.replace("s3a://", "s3://", 1))
        log = root + "/_spark_metadata"
        paths = []
        for info in store.get_file_info(pafs.FileSelector(log)):
            for line in store.open_input_file(info.path).read().decode().splitlines()[1:]:
                paths.append(_json.loads(line)["path"].split("://", 1)[1])
        # archive retention deletes whole expired files; the sink's log still names them
        paths = [p for p in paths if store.get_file_info(p).type != pafs.FileType.NotFound]
        if not paths:
            return []
        t = pads.dataset(paths, filesystem=store, format="parquet",
                         partitioning=pads.partitioning(flavor="hive")).to_table(
            columns=["topic", "queue", "offset"])
    rows = [(q, o) for tp, q, o in zip(t.column("topic").to_pylist(), t.column("queue").to_pylist(),
                                        t.column("offset").to_pylist()) if tp == topic]
    return sorted(rows)


def _lists(s3, since: int) -> list[str]:
    """LIST requests the server answered after line ``since`` of its access log."""
    with open(s3.access_log, encoding="utf-8") as f:
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in f][since:]
    return [line for line in lines if re.search(r'"GET /[^/ ?]+/?\?[^ ]*list-type=2', line)
            or re.search(r'"GET /[^/ ?]+/?\?[^ ]*(delimiter|prefix)=', line)]


def _log_lines(s3) -> int:
    with open(s3.access_log, encoding="utf-8") as f:
        return sum(1 for _ in f)


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_tier_to_s3_then_one_query_reads_archive_and_hot_log(spark, client, endpoints, s3, fmt):
    bucket, topic = f"archive-{fmt}", f"s3-hist-{fmt}"
    s3.create_bucket(bucket)
    uri = f"s3a://{bucket}/archive"
    client.create_topic(topic, queues=QUEUES, local_retention_ms=1)
    vals = _produce(client, topic, 1200)
    before = s3.requests()
    lines = _tier(spark, endpoints, topic, archive=uri, format=fmt, max_offsets_per_trigger=300)
    batches = len(lines)
    print(f"\n{fmt}: {batches} batches, {s3.requests() - before} S3 requests "
          f"({(s3.requests() - before) / max(1, batches):.0f} per batch, job start included)")
    assert client.describe_topic(topic)["tier"] == f"{fmt}:{uri}"
    # the secret is nowhere Spark or the topic shows it (S3A reads it from the environment)
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    shown = [v for _, v in spark.sparkContext.getConf().getAll()]
    shown.append(str(client.describe_topic(topic)))
    assert not any(secret in v for v in shown)
    # Spark itself copies AWS_* keys into its Hadoop conf (fs.s3a.secret.key); its UI and
    # event log redact such names (spark.redaction.regex), and no plan shows them.
    import re as _re
    redact = spark.sparkContext.getConf().get("spark.redaction.regex", "(?i)secret|password|token|access[.]?key")
    assert _re.search(redact, "fs.s3a.secret.key") and _re.search(redact, "fs.s3a.access.key")
    plan = reader(spark, endpoints, topic)._jdf.queryExecution().toString()
    assert secret not in plan
    # the checkpoint lives beside the archive, on the store too
    assert fs.exists(f"{uri}/_rmq_checkpoints/{topic}/commits/0")
    assert not os.path.exists(f"{uri}")                          # nothing went to a local path
    archived = _archived(client, topic)
    assert sum(archived.values()) == 1200

    # An independent reader finds every message exactly once.
    rows = _independent_rows(uri, fmt, topic)
    assert len(rows) == len(set(rows)) == 1200
    assert rows == sorted((q, o) for q in range(QUEUES) for o in range(archived[q]))

    # Hot retention removes what the archive holds; one query reads the whole history.
    tail = _produce(client, topic, 40, start=1200)
    wait_until(lambda: all(o.earliest == archived[o.queue] for o in client.offsets(topic)),
               timeout=60, what="hot retention up to the archived watermark")
    mark = _log_lines(s3)
    df = reader(spark, endpoints, topic)
    got = df.select("value", "queue", "offset").collect()
    assert sorted(bytes(r.value) for r in got) == sorted(vals + tail)
    for q in range(QUEUES):
        offs = sorted(r.offset for r in got if r.queue == q)
        assert offs == list(range(len(offs))) and len(offs) == archived[q] + 20
    if fmt == "delta":
        # Planning found the archive's files from its log, not by listing the bucket.
        assert _lists(s3, mark) == []


@pytest.mark.parametrize("fmt", ["delta"])     # Parquet's kill path: tests/spark/test_tiering.py
def test_tier_job_killed_mid_batch_on_s3_restarts_exactly_once(spark, client, endpoints, s3, fmt):
    bucket, topic = f"archive-kill-{fmt}", f"s3-kill-{fmt}"
    s3.create_bucket(bucket)
    uri = f"s3a://{bucket}/archive"
    client.create_topic(topic, queues=QUEUES)
    _produce(client, topic, 800, size=200)
    ckpt = f"{uri}/_rmq_checkpoints/{topic}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmq_spark.cli.main", "--endpoints", endpoints, "tier", topic,
         "--archive", uri, "--format", fmt, "--max-offsets-per-trigger", "100"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: fs.exists(f"{ckpt}/commits/0") or proc.poll() is not None,
                   timeout=480, what="the first committed batch")
        assert proc.poll() is None, proc.stdout.read().decode()[-8000:]
        wait_until(lambda: any(fs.exists(f"{ckpt}/offsets/{b}") and not fs.exists(f"{ckpt}/commits/{b}")
                               for b in range(1, 7)),
                   timeout=120, interval=0.01, what="a batch in flight")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    latest = {o.queue: o.latest for o in client.offsets(topic)}
    assert any(a < latest[q] for q, a in _archived(client, topic).items()), "not cut short"

    _tier(spark, endpoints, topic)
    rows = _independent_rows(uri, fmt, topic)
    assert rows == sorted((q, o) for q in range(QUEUES) for o in range(latest[q]))
    assert _archived(client, topic) == latest


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_archive_retention_and_vacuum_on_s3(spark, client, endpoints, s3, fmt):
    bucket, topic = f"retention-{fmt}", f"s3-retention-{fmt}"
    s3.create_bucket(bucket)
    uri = f"s3a://{bucket}/archive"
    client.create_topic(topic, queues=QUEUES, retention_ms=2000, local_retention_ms=3_600_000)
    _produce(client, topic, 60, size=50)
    _tier(spark, endpoints, topic, archive=uri, format=fmt, retention_check_s=3600)
    assert len(_independent_rows(uri, fmt, topic)) == 60
    data = [u for u, _, _ in fs.walk_files(f"{uri}/topic={topic}") if u.endswith(".parquet")]
    assert data
    time.sleep(2.2)                                  # every archived row older than 2 s
    _tier(spark, endpoints, topic, vacuum_retain_hours=0)
    assert _independent_rows(uri, fmt, topic) == []
    left = [u for u, _, _ in fs.walk_files(f"{uri}/topic={topic}") if u.endswith(".parquet")]
    assert not set(data) & set(left)                 # deleted from the store (VACUUM for Delta)
    assert all(q["archive_earliest"] == q["archived"] == 30
               for q in client.describe_topic(topic)["queue_info"])
    if fmt == "delta":
        ops = [r.operation for r in spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()]
        assert "DELETE" in ops and "VACUUM END" in ops


def test_compaction_into_a_table_on_s3_and_rmq_get(spark, client, endpoints, s3):
    bucket, topic = "compacted", "s3-compact"
    s3.create_bucket(bucket)
    uri = f"s3a://{bucket}/accounts"
    client.create_topic(topic, queues=QUEUES, cleanup_policy="compact")
    for i in range(30):
        client.produce(topic, [Message(f"v{i}".encode(), key=f"acct-{i % 10}".encode())],
                       queue=i % 10 % QUEUES)
    q = compact_topic(spark, endpoints, topic, table=uri)
    assert not q.isActive
    assert client.describe_topic(topic)["compacted_table"] == f"delta:{uri}"
    from deltalake import DeltaTable
    t = DeltaTable(uri.replace("s3a://", "s3://", 1)).to_pyarrow_table(columns=["key", "value"])
    table = dict(zip(t.column("key").to_pylist(), t.column("value").to_pylist()))
    assert table == {f"acct-{k}".encode(): f"v{20 + k}".encode() for k in range(10)}
    table_on_s3 = CompactedTable(uri)
    assert table_on_s3.get(b"acct-3").value == b"v23" and table_on_s3.get(b"nope") is None
    lookup = KeyLookup(client, topic)
    assert lookup.latest(b"acct-3").value == b"v23"
    # Long-lived readers see a later commit (their log reads are cached: delta_log.py).
    client.produce(topic, [Message(b"later", key=b"acct-3")], queue=3 % QUEUES)
    compact_topic(spark, endpoints, topic)
    assert table_on_s3.get(b"acct-3").value == b"later"
    assert lookup.latest(b"acct-3").value == b"later"
    out = subprocess.run([sys.executable, "-m", "rmq_spark.cli.main", "--endpoints", endpoints,
                          "get", topic, "acct-7"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "v27" in out.stdout, out.stderr
    assert "testing" not in out.stdout + out.stderr                  # no key shown


_CONDITIONAL = "fs.option.create.conditional.overwrite"


def test_delta_commits_on_s3_from_two_drivers_never_overwrite_each_other(spark, s3):
    """Delta's own S3 log store is safe only within one JVM: two drivers committing
    version N both succeed and one commit is lost. Ours (jars/src) commits with a
    put-if-absent, so the loser retries as Delta does on any other store."""
    from py4j.protocol import Py4JJavaError
    s3.create_bucket("commits")
    jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()
    store = jvm.io.rmqspark.delta.ConditionalPutLogStore(conf)
    path = jvm.org.apache.hadoop.fs.Path("s3a://commits/t/_delta_log/00000000000000000000.json")

    def lines(*text):
        out = jvm.java.util.ArrayList()
        for t in text:
            out.add(t)
        return out.iterator()

    store.write(path, lines('{"first":1}'), False, conf)
    with pytest.raises(Py4JJavaError, match="FileAlreadyExistsException"):
        store.write(path, lines('{"second":2}'), False, conf)
    assert fs.read_text("s3a://commits/t/_delta_log/00000000000000000000.json") == '{"first":1}\n'
    assert spark.conf.get("spark.delta.logStore.s3a.impl") == "io.rmqspark.delta.ConditionalPutLogStore"

    # Why: another driver's commit landing between the check and the write. Delta's own
    # store (check, then create) overwrites it; the conditional create ours uses fails.
    hfs = jvm.org.apache.hadoop.fs.Path("s3a://commits/").getFileSystem(conf)
    for name, conditional in (("own", False), ("ours", True)):
        uri = f"s3a://commits/{name}/_delta_log/00000000000000000001.json"
        target = jvm.org.apache.hadoop.fs.Path(uri)
        out = (hfs.createFile(target).overwrite(False).must(_CONDITIONAL, True).build()
               if conditional else hfs.create(target, False))
        fs.write_bytes(uri, b"the other driver's commit\n")
        out.write(bytearray(b"this driver's commit\n"))
        if conditional:
            with pytest.raises(Py4JJavaError, match="RemoteFileChangedException|412"):
                out.close()
            assert fs.read_text(uri) == "the other driver's commit\n"
        else:
            out.close()
            assert fs.read_text(uri) == "this driver's commit\n"        # the other one is gone

    # Writers racing for the same versions (threads here: ours has no lock in the JVM, so
    # they race as two drivers would): the loser's FileAlreadyExistsException is a conflict
    # Delta retries, and every append is in the table.
    import threading
    table, n = "s3a://commits/race", 4
    spark.createDataFrame([("init", -1)], "who string, i int").write.format("delta").save(table)
    errors = []

    def appends(who: str) -> None:
        try:
            for i in range(n):
                spark.createDataFrame([(who, i)], "who string, i int").write.format("delta") \
                    .mode("append").save(table)
        except Exception as e:               # noqa: BLE001 - reported below
            errors.append(e)
    racers = [threading.Thread(target=appends, args=(w,)) for w in ("a", "b")]
    for t in racers:
        t.start()
    for t in racers:
        t.join(300)
    assert not errors, errors
    from deltalake import DeltaTable
    t = DeltaTable(table.replace("s3a://", "s3://", 1))
    rows = sorted(zip(*(t.to_pyarrow_table().column(c).to_pylist() for c in ("who", "i"))))
    assert rows == sorted([("init", -1)] + [(w, i) for w in "ab" for i in range(n)])
    assert t.version() == 2 * n                      # one commit each, none overwritten



def test_a_missing_bucket_is_refused_naming_the_uri_and_nothing_is_written(spark, client,
                                                                            endpoints, s3):
    topic = "s3-no-bucket"
    client.create_topic(topic, queues=QUEUES)
    _produce(client, topic, 10)
    for fmt in ("delta", "parquet"):
        with pytest.raises(TierConfigError, match=r"s3a://no-such-bucket/archive.*bucket "
                                                  r"'no-such-bucket' does not exist"):
            tier_topic(spark, endpoints, topic, archive="s3a://no-such-bucket/archive", format=fmt)
    assert client.describe_topic(topic)["tier"] == ""            # the topic is left as it was
    s3.create_bucket("has-bucket")
    with pytest.raises(TierConfigError, match=r"checkpoint s3a://no-such-bucket/ck"):
        tier_topic(spark, endpoints, topic, archive="s3a://has-bucket/archive",
                   checkpoint="s3a://no-such-bucket/ck")
    assert list(fs.walk_files("s3a://has-bucket/")) == []
    compact = "s3-no-bucket-compact"
    client.create_topic(compact, queues=1, cleanup_policy="compact")
    with pytest.raises(CompactionConfigError, match=r"s3a://no-such-bucket/t"):
        compact_topic(spark, endpoints, compact, table="s3a://no-such-bucket/t")
    assert client.describe_topic(compact)["compacted_table"] == ""


def test_wrong_credentials_are_refused_naming_the_uri_and_nothing_is_written(client, endpoints,
                                                                              tmp_path):
    """A store that checks keys (a server of its own: auth is server-wide), and a job run
    the way a user runs it, with the wrong secret in its environment."""
    from tests.s3server import S3Server
    server = S3Server.start(str(tmp_path / "auth-s3"))
    try:
        server.create_bucket("locked")
        key, secret = server.with_auth()
        env = {**os.environ, **server.env(key, secret)}
        subprocess.run([sys.executable, "-c", "import sys; from rmq_spark import fs; "
                        "fs.write_bytes('s3a://locked/keep', b'x')"], env=env, check=True)
        topic = "s3-wrong-key"
        client.create_topic(topic, queues=QUEUES)
        _produce(client, topic, 10)
        out = subprocess.run([sys.executable, "-m", "rmq_spark.cli.main", "--endpoints", endpoints,
                              "tier", topic, "--archive", "s3a://locked/archive"],
                             env={**env, "AWS_SECRET_ACCESS_KEY": "wrong"}, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode != 0
        assert "s3a://locked/archive" in out.stderr and "access denied" in out.stderr, out.stderr
        assert "wrong" not in out.stderr                             # the secret is never shown
        assert client.describe_topic(topic)["tier"] == ""
        listing = subprocess.run([sys.executable, "-c", "from rmq_spark import fs; "
                                  "print([u for u, _, _ in fs.walk_files('s3a://locked/')])"],
                                 env=env, capture_output=True, text=True, check=True).stdout
        assert listing.strip() == "['s3a://locked/keep']"
        # a lookup in a table on that store: a clear error, not a traceback
        compact = "s3-wrong-key-compact"
        client.create_topic(compact, queues=QUEUES, cleanup_policy="compact")
        client.alter_topic(compact, compacted_table="delta:s3a://locked/table")
        got = subprocess.run([sys.executable, "-m", "rmq_spark.cli.main", "--endpoints", endpoints,
                              "get", compact, "k"], env={**env, "AWS_SECRET_ACCESS_KEY": "wrong"},
                             capture_output=True, text=True, timeout=120)
        assert got.returncode == 1 and "Traceback" not in got.stderr, got.stderr
        assert got.stderr.startswith("rmq: s3a://locked/table") and "access denied" in got.stderr
    finally:
        server.stop()


def test_credentials_in_a_uri_are_refused_and_never_echoed(spark, client, endpoints):
    from rmq_spark.client.errors import InvalidArgument
    topic = "s3-userinfo"
    client.create_topic(topic, queues=QUEUES)
    with pytest.raises(TierConfigError) as e:
        tier_topic(spark, endpoints, topic, archive="s3a://AKIAEXAMPLE:SeCrEt@bucket/archive")
    assert "credentials in the URI are not supported" in str(e.value)
    assert "SeCrEt" not in str(e.value) and "AKIAEXAMPLE" not in str(e.value)
    with pytest.raises(InvalidArgument) as e:
        client.alter_topic(topic, tier="delta:s3a://AKIAEXAMPLE:SeCrEt@bucket/archive")
    assert "SeCrEt" not in str(e.value) and "***@bucket" in str(e.value)
    assert client.describe_topic(topic)["tier"] == ""


def test_credentials_from_a_profile(tmp_path):
    """``AWS_PROFILE`` with no key variables, against a store that checks keys: the
    Python side (pyarrow's chain) uses the profile, and ``session_builder`` adds the
    profile provider to S3A's chain."""
    from rmq_spark.spark import s3a_conf
    from tests.s3server import S3Server
    server = S3Server.start(str(tmp_path / "auth-s3"))
    try:
        server.create_bucket("profiled")
        key, secret = server.with_auth()
        creds = tmp_path / "credentials"
        creds.write_text(f"[archiver]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
                         f"[stale]\naws_access_key_id = {key}\naws_secret_access_key = wrong\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({k: v for k, v in server.env().items()
                    if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
        env.update(AWS_SHARED_CREDENTIALS_FILE=str(creds))
        code = ("from rmq_spark import fs; fs.write_bytes('s3a://profiled/x', b'via profile'); "
                "print(fs.read_text('s3a://profiled/x'))")
        ok = subprocess.run([sys.executable, "-c", code], env={**env, "AWS_PROFILE": "archiver"},
                            capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0 and ok.stdout.strip() == "via profile", ok.stderr
        refused = subprocess.run([sys.executable, "-c", code], env={**env, "AWS_PROFILE": "stale"},
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "access denied" in refused.stderr, refused.stderr
        assert "wrong" not in refused.stderr
        conf = s3a_conf({**env, "AWS_PROFILE": "archiver"})
        assert "ProfileCredentialsProvider" in conf["spark.hadoop.fs.s3a.aws.credentials.provider"]
        assert conf["spark.hadoop.fs.s3a.endpoint"] == server.endpoint
        assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
        assert not any(secret in v for v in conf.values())
    finally:
        server.stop()
