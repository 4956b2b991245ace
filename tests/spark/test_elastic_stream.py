"""A streaming query and a producer across a join, a rebalance and a decommission
(issue 19): every acknowledged message read exactly once, the query never stops."""
from __future__ import annotations

import threading

import pytest

from rmq_spark.client import Client
from tests.conftest import start_cluster, wait_until
from tests.test_cli import rmq

from ._helpers import Batches, reader

pytestmark = [pytest.mark.spark, pytest.mark.integration]

QUEUES = 4


class _Producer(threading.Thread):
    """Idempotent batches of 10, round the queues, until stopped; ``acked`` holds
    every value acknowledged (a failed call is retried with the same sequence)."""

    def __init__(self, client: Client, topic: str):
        super().__init__(daemon=True)
        self.client, self.topic = client, topic
        self.acked: list[bytes] = []
        self.stop = threading.Event()
        self.errors = 0

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            q = (n // 10) % QUEUES
            vals = [f"e-{n + i}".encode() for i in range(10)]
            while True:
                try:
                    self.client.produce(self.topic, vals, queue=q, producer_id=f"elastic-{q}",
                                        sequence=n // 10 // QUEUES * 10, timeout=30)
                    break
                except Exception:
                    self.errors += 1
                    if self.stop.wait(0.1):
                        return
            self.acked += vals
            n += 10
            self.stop.wait(0.02)


def test_a_stream_keeps_going_across_join_rebalance_and_decommission(spark, tmp_path):
    c = start_cluster(tmp_path / "cluster", nodes=3, groups=4, extra_args=("--replication-factor", "3"))
    client = Client(c.endpoints)
    q = None
    try:
        client.create_topic("moving", queues=QUEUES)
        prod = _Producer(client, "moving")
        prod.start()
        batches = Batches()
        df = reader(spark, c.endpoints, "moving", stream=True, startingOffsets="earliest",
                    maxOffsetsPerTrigger=500)
        q = (df.writeStream.foreachBatch(batches).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
        wait_until(lambda: len(batches.all()) > 100, timeout=120, what="the stream reading")

        c.add_node()
        assert "rebalance: done" in rmq(c, "cluster", "rebalance", "--wait", timeout=300).stdout
        wait_until(lambda: len(prod.acked) > len(batches.all()) - 1 and len(batches.by_id) > 3,
                   timeout=60, what="more batches after the rebalance")
        gone = c.addresses[0]
        out = rmq(c, "cluster", "decommission", gone, "--wait", "--timeout", "240", timeout=300).stdout
        assert f"decommission {gone}: done" in out, out
        c.kill(0)                                   # stopped for good, still in the query's endpoints
        before = len(prod.acked)
        wait_until(lambda: len(prod.acked) > before + 200, timeout=60, what="producing after the decommission")
        prod.stop.set()
        prod.join(timeout=60)
        assert q.isActive and q.exception() is None
        wait_until(lambda: len(batches.all()) >= len(prod.acked), timeout=120, what="the stream catching up")
        got = batches.all()
        assert len(got) == len(set(got)), "a message was read twice"
        assert sorted(got) == sorted(prod.acked)
    finally:
        if q is not None:
            q.stop()
        client.close()
        c.stop()
