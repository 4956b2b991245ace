#!/usr/bin/env python
"""Fetches from another host, by transport: the produce port, gRPC, TLS; rows/s and node CPU.

What a Spark task with ``localReads=false`` does, without Spark: ``--readers``
threads, each with its own ``Client``, read every queue of a topic of
``--records`` ``--size``-byte messages with ``Client.fetch_arrow`` (no
short-circuit), once per round. Two 3-node LocalClusters hold the same
records: a plaintext one and one with TLS and ACLs (read with a token). Each
round reads with every transport in turn:

- ``plaintext, produce port``: what a plaintext client does (the node sends
  the batches from the segment file with ``sendfile``);
- ``plaintext, gRPC``: the same client with ``produce_port=False``;
- ``TLS + token, gRPC``: what a TLS client does.

Prints the median rows/s of ``--rounds`` rounds, the spread, and the CPU
seconds the serving cluster's node processes spent per round (from /proc)::

    .venv/bin/python bench/fetch_transport.py
    .venv/bin/python bench/fetch_transport.py --size 100 --records 1000000
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time

# spark_read and grpc_call live next to this file; importing them puts the checkout on sys.path.
from grpc_call import _cpu as cpu_seconds
from spark_read import QUEUES, produce
from rmq_spark.client import Client, TlsFiles
from storage_service.local import LocalCluster

log = logging.getLogger("fetch_transport")


def node_cpu_seconds(cluster: LocalCluster) -> float:
    """CPU seconds (user + system) of the cluster's node processes."""
    return sum(cpu_seconds(p.pid) for p in cluster.procs if p is not None)


def read_all(make_client, topic: str, records: int, readers: int, max_bytes: int) -> float:
    """Every queue read once by ``readers`` threads; rows/s. Checks the row count
    (``produce`` put ``records // QUEUES`` in each queue, one more in the first
    ``records % QUEUES``)."""
    clients = [make_client() for _ in range(readers)]
    rows = [0] * readers

    def work(i: int) -> None:
        for q in range(i, QUEUES, readers):
            offset, end = 0, records // QUEUES + (q < records % QUEUES)
            while offset < end:
                batch, offset, _, _ = clients[i].fetch_arrow(topic, q, offset, end,
                                                              max_bytes=max_bytes)
                rows[i] += batch.num_rows

    try:
        for c in clients:                 # routes and connections before the clock starts
            c.fetch_arrow(topic, 0, 0, 1)
        t0 = time.perf_counter()
        threads = [threading.Thread(target=work, args=(i,)) for i in range(readers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - t0
    finally:
        for c in clients:
            c.close()
    if sum(rows) != records:
        raise RuntimeError(f"read {sum(rows):,} rows, expected {records:,}")
    return sum(rows) / seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--size", type=int, default=1024, help="message bytes")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--readers", type=int, default=2, help="reader threads (Spark local[2]: 2)")
    p.add_argument("--max-bytes", type=int, default=4 << 20, help="max_bytes per fetch")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("storage_service").setLevel(logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="rmq-bench-") as root, contextlib.ExitStack() as stack:
        log.info("starting a plaintext and a TLS + ACL LocalCluster (3 nodes, 4 groups each)")
        plain = stack.enter_context(LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "plain")))
        secure = stack.enter_context(LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "secure"),
                                                  secure=True))
        tls = TlsFiles(secure.tls.ca)
        log.info("producing %s messages of %d B into each", f"{args.records:,}", args.size)
        for make in (lambda: Client(plain.endpoints),
                     lambda: Client(secure.endpoints, tls=tls, token=secure.token)):
            with make() as c:
                c.create_topic("read", queues=QUEUES)
                produce(c, "read", args.records, args.size)
        variants = {
            "plaintext, produce port": (lambda: Client(plain.endpoints), plain),
            "plaintext, gRPC": (lambda: Client(plain.endpoints, produce_port=False), plain),
            "TLS + token, gRPC": (lambda: Client(secure.endpoints, tls=tls, token=secure.token), secure),
        }
        rates: dict[str, list[float]] = {k: [] for k in variants}
        cpu: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(args.rounds + 1):             # round 0 warms up
            for name, (make, cluster) in variants.items():
                c0 = node_cpu_seconds(cluster)
                rate = read_all(make, "read", args.records, args.readers, args.max_bytes)
                if r:
                    rates[name].append(rate)
                    cpu[name].append(node_cpu_seconds(cluster) - c0)
            if r:
                log.info("round %d/%d: %s", r, args.rounds,
                         ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items()))

    base = statistics.median(rates["plaintext, produce port"])
    print(f"\n{args.records:,} messages of {args.size} B, {args.readers} readers, "
          f"{args.rounds} rounds, load {os.getloadavg()[0]:.1f}")
    print(f"{'transport':26s} {'rows/s':>10s} {'rounds min-max':>20s} {'MB/s':>7s} "
          f"{'vs port':>8s} {'node CPU s':>11s}")
    print("-" * 88)
    out = []
    for name in variants:
        m = statistics.median(rates[name])
        out.append({"transport": name, "rows_per_s": m, "rounds": rates[name],
                    "node_cpu_s": statistics.median(cpu[name])})
        print(f"{name:26s} {m:>10,.0f} {min(rates[name]):>9,.0f}-{max(rates[name]):<10,.0f} "
              f"{m * args.size / 1e6:>7.1f} {m / base:>8.0%} {statistics.median(cpu[name]):>11.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
