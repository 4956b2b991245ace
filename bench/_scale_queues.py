"""``bench/scale.py --only queues``: many queues on one local 3-node cluster, what each node
pays per queue (create, first produce, read, RSS, open files, disk, metadata, /metrics,
restart). The program's docstring says what each column measures."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from rmq_spark.client import Client, Message
from storage_service.local import LocalCluster

MAX_PER_TOPIC = 4000
PER_CALL = 500


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def node_pids(cluster: LocalCluster) -> list[int]:
    return [p.pid for p in cluster.procs]


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


def _topics(n: int) -> list[tuple[str, int]]:
    out, left, i = [], n, 0
    while left:
        k = min(MAX_PER_TOPIC, left)
        out.append((f"scale-{i}", k))
        left -= k
        i += 1
    return out


def one(queues: int, where: str, say, in_flight: int = 0) -> dict:
    data = tempfile.mkdtemp(prefix=f"scale-{queues}-", dir=where)
    cluster = LocalCluster(nodes=3, groups=4, data_dir=data)
    cluster.start(timeout=120)
    row: dict = {"queues": queues}
    try:
        base_rss = [_rss_mb(p) for p in node_pids(cluster)]
        with Client(cluster.endpoints, timeout=120) as c:
            topics = _topics(queues)
            t = time.perf_counter()
            for name, k in topics:
                c.create_topic(name, queues=k)
            row["create_s"] = time.perf_counter() - t
            say(f"  {queues:,} queues: created in {row['create_s']:.1f} s")
            pairs = [(name, q) for name, k in topics for q in range(k)]
            t = time.perf_counter()
            if in_flight:                   # one pipelined producer: a message to each queue, then flush
                with c.producer(max_in_flight=in_flight) as p:
                    sent = [p.send(name, q, [Message(b"v" * 100)]) for name, q in pairs]
                    p.flush()
                assert all(f.result().count == 1 for f in sent)
            else:
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
            pids = node_pids(cluster)
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
        row["rss_after_restart_mb"] = max(_rss_mb(p) for p in node_pids(cluster))
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


def file_system(path: str) -> str:
    """The file system under ``path`` as /proc/mounts names it, and whether an ext4 one
    journals: without a journal, ext4 skips the inodes freed in the last minutes (up to
    six) when it makes a file or directory (``recently_deleted`` in its inode allocator),
    and after many deletions a new name cost this VM's root file system 0.2-0.5 ms of
    CPU instead of 0.02-0.04 (issue 39.5; perf). Queue creation rates depend on it."""
    path = os.path.realpath(path)
    best = ("", "?", "?")
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, kind = line.split()[:3]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[1]):
                best = (dev, mnt, kind)
    dev, mnt, kind = best
    if kind == "ext4":
        name = os.path.basename(dev)
        journal = any(e.startswith(name + "-") for e in os.listdir("/proc/fs/jbd2")) \
            if os.path.isdir("/proc/fs/jbd2") else False
        kind += " (journal)" if journal else " (no journal)"
    return f"{kind} on {mnt} ({dev})"


def queues_part(counts: list[int], where: str, say, in_flight: int = 0) -> list[dict]:
    print(f"data in {where}: {file_system(where)}; first produce: "
          + (f"one producer, {in_flight} requests in flight a node" if in_flight else
             f"produce_batches of {PER_CALL} queues, one call at a time"))
    rows = [one(n, where, say, in_flight) for n in counts]
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
          f"{big['meta_snapshot_kb'] * 1e6 / big['queues'] / 1024:.0f} MB; restart "
          + " -> ".join(f"{r['restart_s']:.1f} s" for r in rows) + " over the rows (queues open "
          "lazily after a restart: it grows with the queues used, not those held)")
    return rows
