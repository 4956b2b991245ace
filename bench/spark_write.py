#!/usr/bin/env python
"""Spark write benchmark: df.write.format("rocketmq") against the client's batched produce.

One run measures every row on this machine and prints one table plus the
issue's target (Spark writes >= 50% of the produce benchmark's batched rate)::

    .venv/bin/python bench/spark_write.py                 # about 3 minutes
    .venv/bin/python bench/spark_write.py --quick         # smoke run
    .venv/bin/python bench/spark_write.py --json bench/results/spark_write.json

Rows:

1. peers: ``bench/produce.py``'s two batched rows, measured here in the same
   run: 8 threads share one Client, 100 x 1 KiB random messages per produce
   call to one queue; and one call holding such a batch for each of the 8
   queues (``produce_batches``). Ratios and the target are against the faster.
2. ``df.write.format("rocketmq").mode("append")`` of a cached DataFrame of
   random values (4 partitions on ``local[2]``), 100 B and 1 KiB, without key
   (spread over the queues) and 1 KiB with a key (``crc32(key) % queues``).
   Exactly-once is on, as always: producer ids and sequences per task.

All topics have 8 queues on a 3-node LocalCluster with 4 raft groups. Rates
are the median of ``--repeats`` timed writes after one warm-up write;
MB = 10^6 bytes of message values. Progress goes to stderr, the table to stdout.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from _spark import compile_sources, local_session, setup  # noqa: E402  (next to this file)

import produce as produce_bench  # noqa: E402  (lives next to this file)

log = logging.getLogger("bench.spark_write")
QUEUES = 8
TARGET_VS_PRODUCE = 0.50


def random_frame(spark, rows: int, size: int, keyed: bool):
    """A cached DataFrame of ``rows`` random ``size``-byte values (and keys)."""
    import pyarrow as pa
    rng = np.random.default_rng(size + keyed)
    pool = rng.integers(0, 256, (min(rows, 50_000), size), dtype=np.uint8)
    values = pa.array([bytes(pool[i % len(pool)]) for i in range(rows)], pa.binary())
    cols = {"value": values}
    if keyed:
        cols["key"] = pa.array([f"key-{i % 10_000}".encode() for i in range(rows)], pa.binary())
    df = spark.createDataFrame(pa.table(cols)).repartition(4).cache()
    df.count()
    return df


def timed_write(label: str, df, endpoints: str, topic: str, rows: int, repeats: int) -> float:
    def write():
        df.write.format("rocketmq").option("endpoints", endpoints).option("topic", topic) \
            .mode("append").save()

    write()
    rates = []
    for i in range(repeats):
        t = time.perf_counter()
        write()
        rates.append(rows / (time.perf_counter() - t))
        log.info("  %-26s run %d/%d %12s rows/s", label, i + 1, repeats, f"{rates[-1]:,.0f}")
    return statistics.median(rates)


def measure_peer(client, args, pids: list[int]) -> dict[str, float]:
    """msgs/s of produce.py's two batched rows: 100 messages per call to one queue,
    and a call holding a batch of 100 for each of the 8 queues."""
    client.create_topic(produce_bench.TOPIC, queues=produce_bench.QUEUES)
    values = [bytes(v) for v in np.random.default_rng(7).integers(
        0, 256, (1000, produce_bench.MSG_SIZE), dtype=np.uint8)]
    return {label: produce_bench.rmq_throughput(client, values, 100, per_queue, args.threads,
                                                args.seconds, 1.0, pids)[0]
            for label, per_queue in ((PEER_ONE, False), (PEER_ALL, True))}


PEER_ONE = "client produce, batch=100, 1 KiB (peer)"
PEER_ALL = "client produce, batch=100 x 8 queues/call, 1 KiB (peer)"


def render(rows: list[tuple[str, int, float]], peers: dict[str, float]) -> str:
    """Ratios against the faster peer: the target is against produce's best batched rate."""
    peer = max(peers.values())
    head = f"{'rows':<56}{'msgs/s':>12}{'MB/s':>9}{'vs produce':>12}"
    lines = [head, "-" * len(head)]
    for name, rate in peers.items():
        lines.append(f"{name:<56}{rate:>12,.0f}{rate * 1024 / 1e6:>9.1f}{rate / peer:>11.0%}")
    for name, size, rate in rows:
        lines.append(f"{name:<56}{rate:>12,.0f}{rate * size / 1e6:>9.1f}{rate / peer:>11.0%}")
    lines.append("")
    for name, size, rate in rows:
        if size == 1024:
            ok = rate / peer >= TARGET_VS_PRODUCE
            lines.append(f"target: {name} >= {TARGET_VS_PRODUCE:.0%} of batched produce "
                         f"(the faster row): {rate / peer:.0%} {'MET' if ok else 'NOT MET'}")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small-rows", type=int, default=1_000_000, help="100 B messages per write")
    p.add_argument("--large-rows", type=int, default=200_000, help="1 KiB messages per write")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5, help="peer measuring window")
    p.add_argument("--threads", type=int, default=8, help="peer producer threads")
    p.add_argument("--quick", action="store_true", help="small data, one repeat")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args(argv)
    if a.quick:
        a.small_rows, a.large_rows, a.repeats, a.seconds = 100_000, 20_000, 1, 2
    return a


def main(argv=None) -> int:
    setup()
    args = parse_args(argv)
    compile_sources()
    from rmq_spark.client import Client
    from storage_service.local import LocalCluster

    cases = [("rocketmq write, 100 B", 100, args.small_rows, False),
             ("rocketmq write, 1 KiB", 1024, args.large_rows, False),
             ("rocketmq write, 1 KiB, keyed", 1024, args.large_rows, True)]
    with tempfile.TemporaryDirectory(prefix="rmq-bench-") as root:
        log.info("starting LocalCluster (3 nodes, 4 groups) and Spark local[2]")
        with LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "rmq")) as cluster, \
                Client(cluster.endpoints) as client:
            peer = measure_peer(client, args, [p.pid for p in cluster.procs if p])
            spark = local_session("bench-spark-write")
            results = []
            try:
                for i, (name, size, rows, keyed) in enumerate(cases):
                    topic = f"write-{i}"
                    client.create_topic(topic, queues=QUEUES)
                    df = random_frame(spark, rows, size, keyed)
                    results.append((name, size, timed_write(name, df, cluster.endpoints, topic,
                                                            rows, args.repeats)))
                    df.unpersist()
            finally:
                spark.stop()
    print(render(results, peer))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peers_msgs_per_s": peer, "writes": [dict(name=n, size=s, msgs_per_s=r)
                                                           for n, s, r in results],
                       "args": vars(args)}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
