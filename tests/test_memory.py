"""Invariant 8: a node's memory does not grow with the amount of retained data."""
from __future__ import annotations

import os

import pytest

from rmq_spark.client import Client

from .conftest import start_cluster

pytestmark = pytest.mark.integration


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def produce_mb(client: Client, topic: str, mb: int) -> None:
    chunk = [os.urandom(1024) for _ in range(256)]          # 256 KiB per call
    for i in range(mb * 4):
        client.produce(topic, chunk, queue=i % 4)


def test_node_memory_flat_while_retained_data_grows(tmp_path):
    """RSS plateaus (raft log compaction bounds it) while retained data keeps growing."""
    cluster = start_cluster(tmp_path, extra_args=["--compaction-entries", "100"])
    try:
        with Client(cluster.endpoints) as client:
            client.create_topic("mem", queues=4)
            peaks = []
            for _ in range(8):
                produce_mb(client, "mem", 24)
                peaks.append(max(rss_bytes(cluster.pid(i)) for i in range(3)))
            retained = sum(q["size_bytes"] for q in client.describe_topic("mem")["queue_info"])
        assert retained >= 190 << 20
        first, second = max(peaks[:4]), max(peaks[4:])
        print(f"\nnode RSS peaks per 24 MiB step: {[p >> 20 for p in peaks]} MiB; "
              f"retained {retained >> 20} MiB per replica")
        # The second half doubles the retained data (+96 MiB per replica); a
        # node that held it in memory would grow by that much.
        assert second - first < 32 << 20, f"RSS peak grew {(second - first) >> 20} MiB"
    finally:
        cluster.stop()
