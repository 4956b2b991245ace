#!/usr/bin/env python
"""Key-value against NATS JetStream KV, in one run (issue 40, RIP-22).

Both systems: 3 local nodes, replication 3, file storage, every write synced
before it is acknowledged (rmq-spark ``--fsync always``; nats-server
``sync_interval: always``). ``--keys`` keys of ``--value-bytes`` bytes are
loaded first; then each workload runs ``--seconds`` with ``--clients``
concurrent callers (threads on one ``Client``; asyncio tasks on one NATS
connection), each waiting for its call before the next:

* put: unconditional puts to the loaded keys;
* get: gets of random loaded keys (ours: the leader's, linearizable; NATS KV
  direct gets, which any replica answers);
* cas: each caller updates its own key on the revision its last update
  returned (``kv_put(if_revision=)``; ``kv.update(last=)``).

Prints ops/s and p50/p99 per workload and system, and our rate over NATS'::

    .venv/bin/python bench/kv.py                          # 8 clients, 10 s each
    .venv/bin/python bench/kv.py --clients 32 --seconds 20
    .venv/bin/python bench/kv.py --queues 1                # one raft group, as a NATS bucket

``--capacity N`` instead loads N keys of 1 KiB (keyed produces, as a bulk
load would: every produce to a compact topic is a put) into a 3-node
cluster and measures what issue 40 asks at 1,000,000: the key index built
from the log (first get per queue), node RSS, get p50/p99 over 2,000
random keys, and a restart until the first get answers::

    .venv/bin/python bench/kv.py --capacity 1000000
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import _peers  # noqa: E402
from bench.produce import percentiles_ms  # noqa: E402
from bench._scale_queues import _rss_mb  # noqa: E402
from rmq_spark.client import Client, KvConflict  # noqa: E402
from storage_service.local import LocalCluster  # noqa: E402

log = logging.getLogger("bench.kv")
WORKLOADS = ("put", "get", "cas")


def _row(system: str, work: str, lat: list[float], seconds: float) -> dict:
    p50, p99 = percentiles_ms(lat)
    return {"system": system, "workload": work, "ops_per_s": len(lat) / seconds, "p50_ms": p50, "p99_ms": p99}


# ------------------------------------------------------------------ rmq-spark
def ours(a, root: str) -> list[dict]:
    rows = []
    with LocalCluster(nodes=3, groups=3, data_dir=os.path.join(root, "rmq"), fsync="always") as cluster, \
            Client(cluster.endpoints, timeout=60) as c:
        c.create_topic("kv", queues=a.queues, cleanup_policy="compact")
        value = b"v" * a.value_bytes
        keys = [f"key-{i}" for i in range(a.keys)]
        for k in keys:
            c.kv_put("kv", k, value)
        log.info("rmq-spark: %d keys loaded", len(keys))
        for work in WORKLOADS:
            lat: list[float] = []
            lock = threading.Lock()
            end = time.monotonic() + a.seconds

            def caller(n: int) -> None:
                rng = random.Random(n)
                mine, rev = f"cas-{n}", c.kv_put("kv", f"cas-{n}", value)
                got = []
                while time.monotonic() < end:
                    t = time.perf_counter()
                    if work == "put":
                        c.kv_put("kv", rng.choice(keys), value)
                    elif work == "get":
                        c.kv_get("kv", rng.choice(keys))
                    else:
                        try:
                            rev = c.kv_put("kv", mine, value, if_revision=rev)
                        except KvConflict as e:      # a retried call stored it already: not counted
                            log.warning("rmq-spark cas %s: %s (skipped)", mine, e)
                            rev = e.current_revision
                            continue
                    got.append(time.perf_counter() - t)
                with lock:
                    lat.extend(got)
            threads = [threading.Thread(target=caller, args=(n,)) for n in range(a.clients)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rows.append(_row("rmq-spark", work, lat, time.monotonic() - t0))
            log.info("rmq-spark %s: %.0f ops/s", work, rows[-1]["ops_per_s"])
    return rows


# ----------------------------------------------------------------------- NATS
async def _nats(a, urls: list[str]) -> list[dict]:
    import nats
    from nats.js.api import StorageType
    from nats.js.errors import KeyWrongLastSequenceError
    nc = await nats.connect(servers=urls)
    try:
        js = nc.jetstream(timeout=30)
        kv = await js.create_key_value(bucket="kv", replicas=3, storage=StorageType.FILE, history=1)
        value = b"v" * a.value_bytes
        keys = [f"key-{i}" for i in range(a.keys)]
        for k in keys:
            await kv.put(k, value)
        log.info("NATS: %d keys loaded", len(keys))
        rows = []
        for work in WORKLOADS:
            lat: list[float] = []
            end = time.monotonic() + a.seconds

            async def caller(n: int) -> None:
                rng = random.Random(n)
                mine = f"cas-{n}"
                rev = await kv.put(mine, value)
                while time.monotonic() < end:
                    t = time.perf_counter()
                    if work == "put":
                        await kv.put(rng.choice(keys), value)
                    elif work == "get":
                        await kv.get(rng.choice(keys))
                    else:
                        try:
                            rev = await kv.update(mine, value, last=rev)
                        except KeyWrongLastSequenceError:    # nats-py retried a publish: not counted
                            log.warning("NATS cas %s: wrong last sequence %d (skipped)", mine, rev)
                            rev = (await kv.get(mine)).revision
                            continue
                    lat.append(time.perf_counter() - t)
            t0 = time.monotonic()
            await asyncio.gather(*(caller(n) for n in range(a.clients)))
            rows.append(_row("NATS JetStream KV", work, lat, time.monotonic() - t0))
            log.info("NATS %s: %.0f ops/s", work, rows[-1]["ops_per_s"])
        return rows
    finally:
        await nc.close()


def peer(a, root: str, env: dict) -> list[dict]:
    env["nats_py"] = _peers.ensure_nats_py()
    binary = _peers.nats_server_with_sync(log)
    env["nats_server"] = _peers.nats_server_version(binary)
    with _peers.NatsCluster(binary, os.path.join(root, "nats"), sync_always=True) as cluster:
        cluster.wait_ready()
        return asyncio.run(_nats(a, cluster.urls))


def capacity(a, root: str) -> None:
    import zlib
    queues, n = 6, a.capacity
    with LocalCluster(nodes=3, groups=3, data_dir=os.path.join(root, "cap"), fsync="always") as cluster:
        with Client(cluster.endpoints, timeout=120) as c:
            c.create_topic("big", queues=queues, cleanup_policy="compact")
            value = b"v" * 1024
            t0 = time.monotonic()
            batch: dict[int, list] = {}
            from rmq_spark.client import Message
            for i in range(n):
                k = f"key-{i:08d}".encode()
                batch.setdefault(zlib.crc32(k) % queues, []).append(Message(value, key=k))
                if (i + 1) % 6000 == 0 or i == n - 1:
                    c.produce_batches([("big", q, msgs) for q, msgs in batch.items()])
                    batch = {}
                if (i + 1) % 100_000 == 0:
                    log.info("loaded %d keys (%.0f s)", i + 1, time.monotonic() - t0)
            load_s = time.monotonic() - t0
            t0 = time.monotonic()
            for q in range(queues):        # the first KV call per queue builds its index from the log
                c.kv_keys("big", f"key-{q:08d}", page=1)
            index_s = time.monotonic() - t0
            rss = [_rss_mb(p.pid) for p in cluster.procs]
            rng = random.Random(1)
            lat = []
            for _ in range(2000):
                k = f"key-{rng.randrange(n):08d}"
                t = time.perf_counter()
                assert c.kv_get("big", k).value == value
                lat.append(time.perf_counter() - t)
            p50, p99 = percentiles_ms(lat)
        t0 = time.monotonic()
        cluster.stop()
        cluster.start(timeout=600)
        with Client(cluster.endpoints, timeout=120) as c:
            assert c.kv_get("big", f"key-{n - 1:08d}").value == value
            for q in range(queues):
                c.kv_keys("big", f"key-{q:08d}", page=1)
        restart_s = time.monotonic() - t0
        rss_after = [_rss_mb(p.pid) for p in cluster.procs]
        sizes = [os.path.getsize(f) for f in __import__("glob").glob(os.path.join(root, "cap", "node-*", "**",
                                                                               "kv-index.sqlite3"), recursive=True)]
    print(f"\n{n:,} keys of 1 KiB, compact topic of {queues} queues, 3 nodes, R3, --fsync always\n")
    print("| keys | load s | index built s | node RSS MB (max) | get p50 ms | get p99 ms | restart s (to first get) "
          "| RSS after restart MB | index file MB (max) |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {n:,} | {load_s:.1f} | {index_s:.1f} | {max(rss):.0f} | {p50:.2f} | {p99:.2f} | {restart_s:.1f} | "
          f"{max(rss_after):.0f} | {max(sizes or [0]) / 2**20:.0f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--queues", type=int, default=6,
                   help="queues of our KV topic (6: spread over the cluster's 3 groups and leaders; "
                        "1: one raft group, as a NATS KV bucket is one stream)")
    p.add_argument("--capacity", type=int, default=0, help="load this many 1 KiB keys and measure instead")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    root = tempfile.mkdtemp(prefix="bench-kv-")
    env: dict = {}
    if a.capacity:
        try:
            capacity(a, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return 0
    try:
        rows = ours(a, root) + peer(a, root, env)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{a.clients} clients, {a.seconds:.0f} s per workload, {a.keys:,} keys of {a.value_bytes} B, 3 nodes, R3, "
          f"our topic of {a.queues} queue{'s' if a.queues != 1 else ''}, "
          f"every write synced; {env.get('nats_server', 'nats-server')}, nats-py {env.get('nats_py')}\n")
    print("| workload | rmq-spark ops/s | p50 ms | p99 ms | NATS KV ops/s | p50 ms | p99 ms | rmq-spark / NATS |")
    print("|---|---|---|---|---|---|---|---|")
    by = {(r["system"], r["workload"]): r for r in rows}
    for w in WORKLOADS:
        o, n = by[("rmq-spark", w)], by[("NATS JetStream KV", w)]
        print(f"| {w} | {o['ops_per_s']:,.0f} | {o['p50_ms']:.1f} | {o['p99_ms']:.1f} | {n['ops_per_s']:,.0f} | "
              f"{n['p50_ms']:.1f} | {n['p99_ms']:.1f} | {o['ops_per_s'] / n['ops_per_s']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
