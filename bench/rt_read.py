#!/usr/bin/env python
"""Streaming read throughput of the two sources: ``format("rocketmq-rt")`` (the JVM
source real-time mode needs; HTTP long polls answered with the stored batches) against ``format("rocketmq")`` (the
Python source; Arrow over the produce port or local reads), issue 41.

One 3-node LocalCluster, a topic of 8 queues holding ``--rows`` messages of ``--size``
bytes. Each round runs, in turn, an ``availableNow`` query of each source from earliest
into the ``noop`` sink (a fresh checkpoint each time), after one warm-up each; rows/s
is rows over the query's wall time, the median of ``--repeats`` rounds. The Python
source runs twice: with its defaults (local reads: the executor reads the segment files
of a node on its host) and over the network (``localReads=false``: the produce port's
binary fetch). Node CPU per row (from /proc) says what each transport costs the nodes. Spark ``local[2]``.
Progress to stderr, the table to stdout::

    .venv/bin/python bench/rt_read.py
    .venv/bin/python bench/rt_read.py --size 1024 --rows 200000
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time

from _spark import setup  # noqa: E402  (next to this file; puts the checkout on sys.path)
from grpc_call import _cpu as cpu_seconds  # noqa: E402
from spark_read import QUEUES, produce  # noqa: E402

log = logging.getLogger("bench.rt_read")


def node_cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    setup()
    from rmq_spark.client import Client
    from rmq_spark.spark import session_builder
    from storage_service.local import LocalCluster

    with tempfile.TemporaryDirectory(prefix="rmq-bench-") as root, \
            LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "rmq")) as cluster, \
            Client(cluster.endpoints) as client:
        topic = "rt-read"
        client.create_topic(topic, queues=QUEUES)
        produce(client, topic, args.rows, args.size)
        rows = sum(o.latest for o in client.offsets(topic))
        pids = [p.pid for p in cluster.procs if p]
        spark = session_builder("bench-rt-read", master="local[2]").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        runs = {"rocketmq (Python source)": ("rocketmq", {}),
                "rocketmq, localReads=false (produce port)": ("rocketmq", {"localReads": "false"}),
                "rocketmq-rt (JVM source, HTTP batches)": ("rocketmq-rt", {})}
        rates: dict[str, list[float]] = {k: [] for k in runs}
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        try:
            for i in range(args.repeats + 1):
                for n, (label, (fmt, opts)) in enumerate(runs.items()):
                    q = (spark.readStream.format(fmt).option("endpoints", cluster.endpoints)
                         .option("topic", topic).option("startingOffsets", "earliest").options(**opts).load()
                         .writeStream.format("noop").trigger(availableNow=True)
                         .option("checkpointLocation", os.path.join(root, f"chk-{n}-{i}")))
                    c0, t = node_cpu(pids), time.perf_counter()
                    q.start().awaitTermination()
                    dt, used = time.perf_counter() - t, node_cpu(pids) - c0
                    if i:                                  # the first round warms up
                        rates[label].append(rows / dt)
                        cpu[label].append(1e6 * used / rows)
                    log.info("  %-32s %s %12s rows/s", label, f"run {i}/{args.repeats}" if i else "warm-up",
                             f"{rows / dt:,.0f}")
        finally:
            spark.stop()
    base = statistics.median(rates["rocketmq (Python source)"])
    print(f"\n{rows:,} rows of {args.size} B, 8 queues, 3 nodes, availableNow into noop, "
          f"median of {args.repeats} alternating rounds\n")
    print("| source | rows/s (median) | rounds | x Python source | node CPU us/row |")
    print("|---|---|---|---|---|")
    for label in runs:
        r = rates[label]
        print(f"| {label} | {statistics.median(r):,.0f} | {', '.join(f'{x:,.0f}' for x in r)} | "
              f"{statistics.median(r) / base:.2f} | {statistics.median(cpu[label]):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
