"""Archive watermarks move only under the topic's current tier lease (issue 18, fenced jobs).

Retention deletes hot data below the ``archive`` watermark. Before fencing,
one SetWatermark from an ordinary client moved it, and the next retention
pass deleted unarchived messages. Now a move needs the token of the topic's
tier lease; a stray call, or a job whose lease another job took, moves
nothing and so deletes nothing.
"""
from __future__ import annotations

import time

import pytest

from rmq_spark.client import FailedPrecondition

pytestmark = pytest.mark.integration


def test_a_stray_set_watermark_deletes_nothing(client):
    client.create_topic("fence-stray", queues=1, tier="delta:/tmp/fence-stray", local_retention_ms=1)
    for _ in range(20):
        client.produce("fence-stray", [b"v" * 1024] * 20, queue=0)   # 400 KiB in 64 KiB segments
    with pytest.raises(FailedPrecondition, match="give lease_token"):
        client.set_watermark("fence-stray", "archive", {0: 400})
    with pytest.raises(FailedPrecondition, match="lease token 12345 is not the topic's tier lease"):
        client.set_watermark("fence-stray", "archive", {0: 400}, lease_token=12345)
    with pytest.raises(FailedPrecondition, match="lease_token"):
        client.set_watermark("fence-stray", "archive_earliest", {0: 400})
    time.sleep(2.0)                                     # four retention passes (0.5 s)
    q = client.describe_topic("fence-stray")["queue_info"][0]
    assert (q["archived"], q["earliest"], q["latest"]) == (-1, 0, 400)


def test_a_job_whose_lease_another_job_took_moves_nothing(client):
    client.create_topic("fence-zombie", queues=1, tier="delta:/tmp/fence-zombie", local_retention_ms=1)
    for _ in range(20):
        client.produce("fence-zombie", [b"v" * 1024] * 20, queue=0)
    granted, _, _, old = client.lease("fence-zombie", "tier", "/ckpt/a", 200)
    assert granted
    client.set_watermark("fence-zombie", "archive", {0: 100}, old)          # a's batch: fine
    time.sleep(0.3)                                                          # a paused past its lease
    granted, _, _, new = client.lease("fence-zombie", "tier", "/ckpt/b", 60_000)
    assert granted and new != old
    with pytest.raises(FailedPrecondition, match=f"lease token {old} is not"):
        client.set_watermark("fence-zombie", "archive", {0: 400}, old)       # a resumes: refused
    client.set_watermark("fence-zombie", "archive", {0: 200}, new)
    time.sleep(2.0)
    q = client.describe_topic("fence-zombie")["queue_info"][0]
    assert q["archived"] == 200 and q["earliest"] <= 200                     # nothing above b's mark went
