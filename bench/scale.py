#!/usr/bin/env python
"""Many queues on one local cluster: what each node pays per queue.

For each queue count (``--queues``, default 1,000 and 10,000; add 100000 for
the issue-19 run) a fresh 3-node cluster (4 data groups, ``--fsync always``)
gets topics of up to 4,000 queues, one message per queue, and the run
measures:

* create: creating the topics (the metadata group records every queue's group);
* produce: one 100-byte message to every queue (``produce_batches``, 500
  queues per call: each queue's files are created on its first append);
* read: the message back from every queue's leader (``fetch``);
* per node: RSS, open descriptors and disk after the produce, and the
  restart time of the whole cluster (stop, start, every group led);
* per node: one scrape of ``/metrics`` (the largest: bytes, seconds, series,
  and queues whose per-queue series were left out past
  ``--metrics-max-queue-series``);
* per queue: RSS and metadata bytes (the topic configs, as the metadata
  snapshot holds them), and what 1,000,000 queues
  (RIP-20's "100w") would take per node at that rate.

On 3 nodes every node holds a replica of every queue, so per-node cost is
per-cluster cost. There is no peer in this table: the question is how the
cost grows with the queue count.

Then the same produce workload on 3 and on 5 local nodes (``--nodes-runs``;
10 data groups of 3 replicas, 20 queues, 1 KiB messages from 4 threads for
``--seconds``): one host cannot show scaling, so the table reports
throughput, node CPU per message and the balance between nodes (replicas,
leaders and CPU seconds, least and most). And the placement simulation
(``bench/placement_sim.py``: 100 nodes, 10,000 groups)::

    .venv/bin/python bench/scale.py                        # 1k, 10k; 3 vs 5 nodes; simulation
    .venv/bin/python bench/scale.py --queues 1000 --queues 10000 --queues 100000
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rmq_spark.client import Client, Message  # noqa: E402
from storage_service.local import LocalCluster  # noqa: E402

MAX_PER_TOPIC = 4000
PER_CALL = 500


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _du_mb(path: str) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total / (1 << 20)


def _nodes(cluster: LocalCluster) -> list[int]:
    return [p.pid for p in cluster.procs]


def _topics(n: int) -> list[tuple[str, int]]:
    out, left, i = [], n, 0
    while left:
        k = min(MAX_PER_TOPIC, left)
        out.append((f"scale-{i}", k))
        left -= k
        i += 1
    return out


def one(queues: int, where: str, say) -> dict:
    data = tempfile.mkdtemp(prefix=f"scale-{queues}-", dir=where)
    cluster = LocalCluster(nodes=3, groups=4, data_dir=data)
    cluster.start(timeout=120)
    row: dict = {"queues": queues}
    try:
        base_rss = [_rss_mb(p) for p in _nodes(cluster)]
        with Client(cluster.endpoints, timeout=120) as c:
            topics = _topics(queues)
            t = time.perf_counter()
            for name, k in topics:
                c.create_topic(name, queues=k)
            row["create_s"] = time.perf_counter() - t
            say(f"  {queues:,} queues: created in {row['create_s']:.1f} s")
            pairs = [(name, q) for name, k in topics for q in range(k)]
            t = time.perf_counter()
            for i in range(0, len(pairs), PER_CALL):
                c.produce_batches([(name, q, [Message(b"v" * 100)]) for name, q in pairs[i:i + PER_CALL]])
                if (i // PER_CALL) % 20 == 19:
                    say(f"  {queues:,} queues: produced to {i + PER_CALL:,}")
            row["produce_s"] = time.perf_counter() - t
            say(f"  {queues:,} queues: one message each in {row['produce_s']:.1f} s")
            t = time.perf_counter()
            step = max(1, len(pairs) // 2000)            # reads: a sample of 2,000 queues
            for name, q in pairs[::step]:
                assert len(c.fetch(name, q, 0).records) == 1, (name, q)
            row["read_ms_per_queue"] = 1e3 * (time.perf_counter() - t) / len(pairs[::step])
            pids = _nodes(cluster)
            rss = [_rss_mb(p) for p in pids]
            row["rss_mb"] = max(rss)
            row["rss_kb_per_queue"] = 1024 * max(r - b for r, b in zip(rss, base_rss)) / queues
            row["open_files"] = max(_fds(p) for p in pids)
            row["disk_mb_per_node"] = max(_du_mb(os.path.join(data, f"node-{i}")) for i in range(3))
            # The metadata snapshot is the topic configs (with every queue's group) as JSON.
            row["meta_snapshot_kb"] = len(json.dumps(c.list_topics())) / 1024
            row.update(_scrapes(cluster))
            say(f"  {queues:,} queues: /metrics {row['scrape_kb']:.0f} KB, {row['scrape_series']:,} series in "
                f"{row['scrape_s']:.2f} s ({row['queues_omitted']:,} queues per-topic only)")
        t = time.perf_counter()
        cluster.stop()
        cluster.start(timeout=600)
        row["restart_s"] = time.perf_counter() - t
        say(f"  {queues:,} queues: restarted in {row['restart_s']:.1f} s")
        with Client(cluster.endpoints, timeout=120) as c:
            name, q = _topics(queues)[-1][0], 0
            assert len(c.fetch(name, q, 0).records) == 1
        row["rss_after_restart_mb"] = max(_rss_mb(p) for p in _nodes(cluster))
    finally:
        cluster.stop()
        shutil.rmtree(data, ignore_errors=True)
    return row


def _scrapes(cluster: LocalCluster) -> dict:
    """The largest of one /metrics scrape per node: KB, seconds, series, queues omitted."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    from storage_service.protocol.placement import http_address
    out = {"scrape_kb": 0.0, "scrape_s": 0.0, "scrape_series": 0, "queues_omitted": 0}
    for a in cluster.addresses:
        t = time.perf_counter()
        text = requests.get(f"http://{http_address(a)}/metrics", timeout=120).text
        took = time.perf_counter() - t
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        omitted = next((int(s.value) for s in samples if s.name == "rmq_metrics_queues_omitted"), 0)
        out = {"scrape_kb": max(out["scrape_kb"], len(text) / 1024), "scrape_s": max(out["scrape_s"], took),
               "scrape_series": max(out["scrape_series"], len(samples)),
               "queues_omitted": max(out["queues_omitted"], omitted)}
    return out


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def nodes_run(nodes: int, seconds: float, where: str, say) -> dict:
    """The same produce workload on ``nodes`` nodes: throughput, CPU per message, balance."""
    import threading
    data = tempfile.mkdtemp(prefix=f"scale-n{nodes}-", dir=where)
    cluster = LocalCluster(nodes=nodes, groups=10, data_dir=data)
    cluster.start(timeout=120)
    try:
        with Client(cluster.endpoints, timeout=60) as c:
            c.create_topic("spread", queues=20)
            st = c.cluster_status()
            pids = _nodes(cluster)
            cpu0 = [_cpu_s(p) for p in pids]
            acked, stop, lock = [0], threading.Event(), threading.Lock()

            def work(k: int) -> None:
                msgs = [Message(b"x" * 1024)] * 100
                q = k
                while not stop.is_set():
                    c.produce_batches([("spread", (q + j) % 20, msgs) for j in range(0, 20, 4)])
                    with lock:
                        acked[0] += 500
                    q += 1
            threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(4)]
            t = time.perf_counter()
            for th in threads:
                th.start()
            time.sleep(seconds)
            stop.set()
            for th in threads:
                th.join()
            elapsed = time.perf_counter() - t
            cpu = [_cpu_s(p) - c0 for p, c0 in zip(pids, cpu0)]
        replicas = [sum(a in r for r in st["placement"].values()) for a in cluster.addresses]
        leaders = [sum(1 for g in n["groups"] if g["group"] and g["leader"] == n["address"])
                   for n in st["nodes"]]
        row = dict(nodes=nodes, msgs_per_s=acked[0] / elapsed, cpu_us_per_msg=1e6 * sum(cpu) / acked[0],
                   replicas=(min(replicas), max(replicas)), leaders=(min(leaders), max(leaders)),
                   cpu_s=(min(cpu), max(cpu)))
        say(f"  {nodes} nodes: {row}")
        return row
    finally:
        cluster.stop()
        shutil.rmtree(data, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--queues", type=int, action="append", help="queue counts (repeatable; default 1000, 10000)")
    p.add_argument("--dir", default=None, help="where the clusters' data go (default: the temp dir)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--nodes-runs", type=int, action="append", help="node counts of the produce comparison "
                                                                      "(default 3, 5; 0 to skip)")
    p.add_argument("--seconds", type=float, default=20.0, help="length of each produce run")
    a = p.parse_args(argv)
    counts = a.queues or [1000, 10000]
    rows = []
    for n in counts:
        rows.append(one(n, a.dir or tempfile.gettempdir(), lambda line: print(line, flush=True)))
    head = ["queues", "create s", "produce s", "read ms/q", "RSS MB", "RSS KB/q", "open files",
            "disk MB/node", "meta KB", "restart s", "/metrics KB", "/metrics s", "series", "queues per-topic only"]
    print("\n| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print(f"| {r['queues']:,} | {r['create_s']:.1f} | {r['produce_s']:.1f} | {r['read_ms_per_queue']:.2f} | "
              f"{r['rss_mb']:.0f} | {r['rss_kb_per_queue']:.1f} | {r['open_files']} | "
              f"{r['disk_mb_per_node']:.0f} | {r['meta_snapshot_kb']:.0f} | {r['restart_s']:.1f} | "
              f"{r['scrape_kb']:.0f} | {r['scrape_s']:.2f} | {r['scrape_series']:,} | {r['queues_omitted']:,} |")
    big = rows[-1]
    print(f"\n1,000,000 queues at the {big['queues']:,}-queue rates, per node: RSS ~"
          f"{big['rss_kb_per_queue'] * 1e6 / (1 << 20):.1f} GB more, metadata snapshot ~"
          f"{big['meta_snapshot_kb'] * 1e6 / big['queues'] / 1024:.0f} MB, restart ~"
          f"{big['restart_s'] * 1e6 / big['queues']:.0f} s (if it grows linearly)")
    runs = [n for n in (a.nodes_runs or [3, 5]) if n]
    spread = [nodes_run(n, a.seconds, a.dir or tempfile.gettempdir(), lambda line: print(line, flush=True))
              for n in runs]
    if spread:
        head = ["nodes", "msgs/s", "node CPU us/msg", "replicas/node (min-max)", "leaders/node (min-max)",
                "CPU s/node (min-max)"]
        print("\n| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in spread:
            print(f"| {r['nodes']} | {r['msgs_per_s']:,.0f} | {r['cpu_us_per_msg']:.1f} | "
                  f"{r['replicas'][0]}-{r['replicas'][1]} | {r['leaders'][0]}-{r['leaders'][1]} | "
                  f"{r['cpu_s'][0]:.1f}-{r['cpu_s'][1]:.1f} |")
    from bench import placement_sim
    print("\nplacement simulation: 90 nodes + 10 joining, 10,000 groups of 3 replicas")
    print(placement_sim.table(placement_sim.run(say=lambda line: None)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"queues": rows, "nodes": spread}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
