"""A tiering job that lost the topic appends nothing to a Delta archive (issue 18, fenced jobs).

The lease check before each append leaves a window: a job paused right after
it (GC, SIGSTOP, a partition) resumes after another job took the topic over
and commits anyway. Its appends carry its lease token in Delta's
idempotent-write version (``rmq_spark/tiering/_fence.py``); the job that took
over committed a fence with a higher token first, so Delta skips the stale
append. Real cluster, real Spark, real Delta.
"""
from __future__ import annotations

import os

import pytest
from pyspark.sql import functions as F

from rmq_spark.archive import layout
from rmq_spark.archive.reader import delta_txn_version
from rmq_spark.client import Client, FailedPrecondition
from rmq_spark.tiering import TierConfigError, tier_topic
from rmq_spark.tiering import _fence
from rmq_spark.tiering._config import TierSettings
from rmq_spark.tiering._job import _Run

from ._helpers import produce, reader
from .test_tiering import archive_rows, assert_exactly_once, hot_rows, run_tier

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _token(path, topic) -> int:
    return _fence.token_of(delta_txn_version(str(path), _fence.app_id(topic)))


def test_a_paused_jobs_append_after_a_takeover_appends_nothing(spark, client, endpoints, topic,
                                                                tmp_path):
    path, ckpt_a, ckpt_b = tmp_path / "archive", tmp_path / "ckpt-a", tmp_path / "ckpt-b"
    produce(client, topic, 100)
    run_tier(spark, endpoints, topic, path, "delta", checkpoint=str(ckpt_a))     # job A
    token_a = _token(path, topic)
    assert (ckpt_a / "rmq_tier_token").read_text() == str(token_a)
    run_tier(spark, endpoints, topic, checkpoint=str(ckpt_a))    # A again: same owner, same token
    assert _token(path, topic) == token_a

    # A is paused right after its lease check, holding its next batch ...
    produce(client, topic, 40, start=100)
    paused_batch = layout.archive_frame(
        reader(spark, endpoints, topic, readArchive="false").where(F.col("offset") >= 25))
    assert paused_batch.count() == 40                             # 4 queues x offsets 25..34
    # ... past its lease; job B takes the topic over and archives those 40 messages.
    run_tier(spark, endpoints, topic, checkpoint=str(ckpt_b))
    token_b = _token(path, topic)
    assert token_b > token_a
    assert len(archive_rows(spark, path, "delta", topic)) == 140

    # A resumes: its append (a batch after its last, under its token) is skipped by Delta ...
    with Client(endpoints) as c:
        settings = TierSettings.create(c, endpoints, topic, None, None, "available-now",
                                       str(ckpt_a), None, True, 168, 60)
    run_a = _Run(spark, settings, client, print)
    run_a._append(paused_batch, _fence.batch_version(token_a, 99))
    rows = archive_rows(spark, path, "delta", topic)
    assert_exactly_once(rows)
    assert rows == hot_rows(spark, endpoints, topic) and len(rows) == 140
    # ... its watermark move is refused, and a start under its old token is refused.
    with pytest.raises(FailedPrecondition, match=f"lease token {token_a} is not"):
        client.set_watermark(topic, "archive", {q: 35 for q in range(4)}, token_a)
    with pytest.raises(TierConfigError, match="fenced by a newer tiering job"):
        _fence.raise_fence(str(path), topic, token_a, run_a._append_empty)
    assert len(archive_rows(spark, path, "delta", topic)) == 140


def test_a_checkpoint_with_a_batch_in_doubt_after_a_takeover_is_refused(spark, client, endpoints,
                                                                        topic, tmp_path):
    path, ckpt_a, ckpt_b = tmp_path / "archive", tmp_path / "ckpt-a", tmp_path / "ckpt-b"
    produce(client, topic, 100)
    run_tier(spark, endpoints, topic, path, "delta", checkpoint=str(ckpt_a),
             max_offsets_per_trigger=40)
    # Killed after Delta's commit of its last batch, before Spark's commit: in doubt.
    last = max(int(n) for n in os.listdir(ckpt_a / "commits") if n.isdigit())
    os.remove(ckpt_a / "commits" / str(last))
    run_tier(spark, endpoints, topic, checkpoint=str(ckpt_b))     # B takes over: nothing new
    with pytest.raises(TierConfigError, match="cannot be told"):
        tier_topic(spark, endpoints, topic, checkpoint=str(ckpt_a))
    rows = archive_rows(spark, path, "delta", topic)
    assert_exactly_once(rows)
    assert rows == hot_rows(spark, endpoints, topic) and len(rows) == 100


def test_a_job_stopped_past_its_lease_and_resumed_after_a_takeover_changes_nothing(
        spark, client, endpoints, topic, tmp_path):
    """The whole path, as it happens: a running job (its own process, a batch every
    second) is stopped with SIGSTOP, JVM and all, for longer than its lease; another
    job takes the topic over and archives; the first resumes. Its lease thread finds
    the lease gone and it stops; whatever it had in flight appends nothing (fence)
    and moves no watermark (token): every message is in the archive once."""
    import signal
    import subprocess
    import sys

    from tests.conftest import wait_until

    ttl_s = 10     # --lease-ttl: A's lease lapses this long after its last renewal (default 30 s)

    path = tmp_path / "archive"
    produce(client, topic, 100)
    ckpt_a = path / "_rmq_checkpoints" / topic
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmq_spark.cli.main", "--endpoints", endpoints, "tier", topic,
         "--archive", str(path), "--format", "delta", "--trigger", "1s", "--lease-ttl", f"{ttl_s}s"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: (ckpt_a / "commits" / "0").exists() or proc.poll() is not None,
                   timeout=300, what="job A's first committed batch")
        assert proc.poll() is None, proc.stdout.read().decode()[-6000:]
        os.killpg(proc.pid, signal.SIGSTOP)
        produce(client, topic, 40, start=100)          # A planned none of these
        # A's lease lapses: at most ttl_s after its last renewal, which was before the
        # stop. Wait for the metadata group to say so (B takes the lease only then),
        # not a fixed ttl_s from now.
        wait_until(lambda: not client.describe_topic(topic)["tier_job"], timeout=ttl_s + 90,
                   interval=0.2, what="job A's lease to lapse")
        run_tier(spark, endpoints, topic, checkpoint=str(tmp_path / "ckpt-b"))   # job B
        token_b = _token(path, topic)
        assert len(archive_rows(spark, path, "delta", topic)) == 140
        produce(client, topic, 20, start=140)            # A would plan these once resumed
        os.killpg(proc.pid, signal.SIGCONT)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise AssertionError("job A still ran 120 s after it resumed:\n" + out.decode()[-6000:])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, out.decode()[-4000:]   # A stopped: its lease was taken
    assert b"lease" in out, out.decode()[-4000:]
    assert _token(path, topic) == token_b                # no append under A's token landed
    rows = archive_rows(spark, path, "delta", topic)
    assert_exactly_once(rows)
    assert len(rows) == 140                             # the last 20: nobody archived them yet
    info = client.describe_topic(topic)["queue_info"]
    assert all(q["archived"] == 35 for q in info)        # B's watermark: 4 queues x 35
