"""Node faults: a node's own resources fail under a running workload.

    python -m tests.node_faults --seconds 60 [--scenarios disk-full,bit-rot] [--fsync always]

``make jepsen`` runs every scenario (after the partition scenarios) for
``JEPSEN_SECONDS``. Each scenario starts a fresh 3-node local cluster, runs
idempotent producers on every data group (``tests/workload.py``), injects
its fault, heals it, kills every node with SIGKILL and restarts them all,
then verifies the topic on every replica: every acknowledged message exactly
once, in each producer's order, offsets contiguous, replicas identical. One
summary line per scenario:
``acked lost duplicated reordered replica_mismatches max_unavailable_s``
(the longest time no produce to some data group was acknowledged), then
what the scenario itself measured.

- ``disk-full``: node 2's data directory is a 64 MiB tmpfs. A filler file
  leaves it below its reserve (``--min-free-bytes``): the node refuses
  produce with RESOURCE_EXHAUSTED, hands the groups it leads to replicas with
  room and takes no new entries; the other two keep every group available.
  Then the filler goes and node 2 catches up. Reports how long the hand-over
  took, what was acknowledged while node 2 was full, and whether any node
  stopped itself (it must not: a full disk is not a broken one).
"""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from storage_service.local import LocalCluster
from storage_service.raft.journal import FSYNC_POLICIES

from .workload import AckingProducer, Acks, Verdict, harness_parser, leader_index, verify

__all__ = ["SCENARIOS", "NodeFaultReport", "run_node_faults", "run_scenario"]

MiB = 1 << 20


@dataclass
class NodeFaultReport(Verdict):
    scenario: str = ""
    faults: list[str] = field(default_factory=list)
    unavailable_s: dict[int, float] = field(default_factory=dict)
    measured: dict = field(default_factory=dict)      # what the scenario itself reports
    problems: list[str] = field(default_factory=list)  # guarantees of the scenario that failed

    @property
    def max_unavailable_s(self) -> float:
        return max(self.unavailable_s.values(), default=0.0)

    @property
    def held(self) -> bool:
        return self.ok and not self.problems

    def summary(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.measured.items())
        return (f"node-fault summary: scenario={self.scenario} acked={self.acked} lost={self.lost} "
                f"duplicated={self.duplicated} reordered={self.reordered} "
                f"replica_mismatches={self.replica_mismatches} max_unavailable_s={self.max_unavailable_s:.1f} "
                f"offset_gaps={self.offset_gaps} faults={len(self.faults)} {extra} "
                f"problems={len(self.problems)} produce_calls={self.produce_calls} retries={self.retries}")


class _Run:
    """One scenario's cluster, client and workload."""

    def __init__(self, cluster: LocalCluster, client, report: NodeFaultReport, queues: int = 6):
        self.cluster, self.client, self.report, self.queues = cluster, client, report, queues
        self.topic = "faults"
        self.stop = threading.Event()
        self.acks = Acks()
        self.lock = threading.Lock()
        self.prods: list[AckingProducer] = []
        self.t0 = 0.0

    def start_workload(self) -> None:
        self.client.create_topic(self.topic, queues=self.queues)
        by_group: dict[int, list[int]] = {}
        for q in range(self.queues):
            by_group.setdefault(self.client.group_of(self.topic, q), []).append(q)
        for g, qs in sorted(by_group.items()):
            for _ in range(2):             # even pids over gRPC, odd ones over the produce port
                self.prods.append(AckingProducer(self.client, self.topic, len(self.prods), qs,
                                                 self.stop, self.report, self.lock, acks=self.acks, group=g))
        self.t0 = time.monotonic()
        for p in self.prods:
            p.start()

    def acked(self) -> int:
        return sum(sum(p.acked.values()) for p in self.prods)

    def finish(self) -> None:
        """Stop producing, kill -9 every node, restart them all, verify."""
        end = time.monotonic()
        self.stop.set()
        for p in self.prods:
            p.join(timeout=60)
        for g in {p.group for p in self.prods}:
            self.report.unavailable_s[g] = self.acks.longest_gap(g, self.t0, end)
        self.report.faults.append("kill -9 all nodes, restart all")
        for i in range(self.cluster.nodes):
            self.cluster.kill(i, signal.SIGKILL)
        for i in range(self.cluster.nodes):
            self.cluster.start_node(i)
        self.cluster.wait_ready(120)
        verify(self.client, self.cluster, self.topic, self.prods, self.queues, self.report)
        stopped = fatal_stops(self.cluster)
        if stopped:
            self.report.problems.append(f"nodes stopped themselves: {stopped}")


def fatal_stops(cluster: LocalCluster) -> dict[str, int]:
    """Node log -> how often the node stopped itself (``durability.fatal``)."""
    out = {}
    for path in glob.glob(os.path.join(cluster.log_dir, "node-*.log")):
        with open(path, errors="replace") as f:
            n = sum(1 for line in f if "stopping this node" in line)
        if n:
            out[os.path.basename(path)] = n
    return out


def wait_for(pred, timeout: float, interval: float = 0.2) -> float | None:
    """Seconds until ``pred()`` held, or None after ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if pred():
                return time.monotonic() - t0
        except Exception:           # the cluster is busy: ask again
            pass
        time.sleep(interval)
    return None


# ------------------------------------------------------------------ disk full
class Tmpfs:
    """A sized tmpfs at ``path`` (root): the small disk a node's data lives on."""

    def __init__(self, path: str, size: int):
        self.path = path
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], check=True,
                       capture_output=True)

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int, name: str = ".filler") -> str:
        """Write a file that leaves ``leave`` bytes free."""
        path = os.path.join(self.path, name)
        with open(path, "ab") as f:
            chunk = b"\0" * MiB
            while self.free() > leave + MiB:
                f.write(chunk)
                f.flush()
            rest = self.free() - leave
            if rest > 0:
                f.write(b"\0" * rest)
        return path

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", self.path], capture_output=True)


RESERVE = 8 * MiB


def _leads_data_group(client, cluster: LocalCluster, i: int) -> bool:
    return any(leader_index(client, cluster, g) == i for g in range(1, cluster.groups + 1))


def disk_full(run: _Run, seconds: float) -> None:
    cluster, client, rep = run.cluster, run.client, run.report
    disk: Tmpfs = run.disk
    time.sleep(seconds * 0.2)
    filler = disk.fill(leave=RESERVE - 2 * MiB)
    rep.faults.append(f"node 2's disk filled: {disk.free() // 1024} KiB free, reserve {RESERVE // 1024} KiB")
    before = run.acked()
    took = wait_for(lambda: not _leads_data_group(client, cluster, 2), timeout=30)
    rep.measured["handover_s"] = f"{took:.1f}" if took is not None else "none"
    if took is None:
        rep.problems.append("node 2 still leads a data group 30 s after its disk filled")
    time.sleep(seconds * 0.4)
    rep.measured["acked_while_full"] = run.acked() - before
    if run.acked() - before <= 0:
        rep.problems.append("nothing was acknowledged while node 2 was full")
    os.unlink(filler)
    rep.faults.append("node 2's disk freed")
    time.sleep(seconds * 0.2)


def _disk_full_setup(data_dir: str) -> Tmpfs:
    return Tmpfs(os.path.join(data_dir, "node-2"), 64 * MiB)


SCENARIOS = {"disk-full": (disk_full, _disk_full_setup,
                           ["--min-free-bytes", str(RESERVE), "--segment-bytes", str(4 * MiB),
                            "--retention-interval", "1"])}


def run_scenario(name: str, data_dir: str, seconds: float = 60.0, fsync: str = "always",
                 log=print) -> NodeFaultReport:
    from rmq_spark.client import Client

    fault, setup, args = SCENARIOS[name]
    report = NodeFaultReport(scenario=name)
    resource = setup(data_dir) if setup else None
    try:
        cluster = LocalCluster(nodes=3, groups=3, data_dir=data_dir, fsync=fsync, extra_args=args)
        cluster.start(timeout=90)
        try:
            with Client(cluster.endpoints, timeout=30, attempt_timeout=2.0) as client:
                run = _Run(cluster, client, report)
                run.disk = resource
                run.start_workload()
                t = threading.Thread(target=fault, args=(run, seconds), daemon=True)
                t.start()
                while t.is_alive():
                    t.join(5)
                    log(f"  {name} {time.monotonic() - run.t0:5.1f}s: {run.acked()} acked, "
                        f"{len(report.faults)} faults, {report.retries} retries")
                run.finish()
        finally:
            cluster.stop()
    finally:
        if resource is not None:
            resource.unmount()
    return report


def run_node_faults(data_dir: str, scenarios: list[str], seconds: float = 60.0, fsync: str = "always",
                    log=print) -> list[NodeFaultReport]:
    out = []
    for name in scenarios:
        d = os.path.join(data_dir, name)
        os.makedirs(d, exist_ok=True)
        log(f"node faults: {name}, {seconds:.0f} s")
        rep = run_scenario(name, d, seconds, fsync, log)
        log(rep.summary())
        out.append(rep)
    return out


def main(argv=None) -> int:
    ap = harness_parser("python -m tests.node_faults", __doc__)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--fsync", choices=FSYNC_POLICIES, default="always")
    a = ap.parse_args(argv)
    names = [s for s in a.scenarios.split(",") if s]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}: choose from {', '.join(SCENARIOS)}")
    with tempfile.TemporaryDirectory(prefix="rmq-node-faults-") as tmp:
        reports = run_node_faults(a.data_dir or tmp, names, a.seconds, a.fsync)
    if a.json:
        print(json.dumps([{**r.__dict__, "held": r.held} for r in reports], indent=2))
    for r in reports:
        for p in r.problems:
            print(f"  {r.scenario}: {p}")
    return 0 if all(r.held for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
