"""What one raft entry costs each replica: one client's sequential key-value puts.

Each put waits for its own entry, so nothing is shared: node CPU (user and
system, from /proc) and voluntary context switches per put are the cost of one
entry on each replica, leader and followers apart. The latency of the same
puts is printed beside them. Run it before and after a change to the commit
path (issues 39 and 40: the per-entry cost is what bounds KV puts and the
9-node rows of ``bench/scale.py``)::

    .venv/bin/python bench/entry_cost.py [--seconds 8] [--fsync always|none]

A 3-node cluster, one data group, R3, 100-byte values.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rmq_spark.client import Client  # noqa: E402
from storage_service.local import LocalCluster  # noqa: E402
from storage_service.raft.journal import FSYNC_POLICIES  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def _usage(pid: int) -> tuple[float, float, int]:
    """(user s, system s, voluntary context switches) of every thread of ``pid``."""
    user = system = switches = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
        except OSError:            # the thread ended meanwhile
            continue
        user += int(fields[11]) / HZ
        system += int(fields[12]) / HZ
        switches += int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
    return user, system, switches


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--fsync", default="always", choices=FSYNC_POLICIES)
    a = p.parse_args()
    root = tempfile.mkdtemp(prefix="rmq-entry-cost-")
    try:
        with LocalCluster(nodes=3, groups=1, data_dir=root, fsync=a.fsync) as cluster, \
                Client(cluster.endpoints, timeout=30) as client:
            client.create_topic("cost", queues=1, cleanup_policy="compact")
            for i in range(200):                                   # warm up
                client.kv_put("cost", b"k%d" % (i % 100), b"v" * 100)
            st = client.cluster_status()
            data = client.group_of("cost", 0)
            leader = next(g["leader"] for n in st["nodes"] for g in n["groups"] if g["group"] == data)
            pids = [proc.pid for proc in cluster.procs]
            before = [_usage(pid) for pid in pids]
            took, t0 = [], time.monotonic()
            while time.monotonic() - t0 < a.seconds:
                t = time.perf_counter()
                client.kv_put("cost", b"k%d" % (len(took) % 100), b"v" * 100)
                took.append((time.perf_counter() - t) * 1000)
            after = [_usage(pid) for pid in pids]
        n = len(took)
        took.sort()
        print(f"\n{n:,} sequential puts in {a.seconds:g} s, 3 nodes, 1 data group, --fsync {a.fsync}: "
              f"p50 {statistics.median(took):.2f} ms, p99 {took[int(0.99 * (n - 1))]:.2f} ms\n")
        print("| node | role | CPU us/put | user | system | voluntary switches/put |")
        print("|---|---|---:|---:|---:|---:|")
        total = 0.0
        for i, (b, e) in enumerate(zip(before, after)):
            user, system, sw = ((e[k] - b[k]) / n for k in range(3))
            total += user + system
            role = "leader" if cluster.addresses[i] == leader else "follower"
            print(f"| {i} | {role} | {(user + system) * 1e6:,.0f} | {user * 1e6:,.0f} | {system * 1e6:,.0f} | {sw:.1f} |")
        print(f"\nall nodes: {total * 1e6:,.0f} us of CPU a put")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
