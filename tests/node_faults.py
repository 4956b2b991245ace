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
- ``clock``: every node runs under libfaketime (``tests/faults/clock.py``);
  the metadata leader's wall clock steps back an hour, then forward a day,
  then back to real time. A tier lease taken before must stay with its
  holder (renewals keep its token and a 120 s expiry), the topic's 10-minute
  retention must delete nothing, and per queue the store timestamps must not
  go back, must lie within the run's real time, and timestamp seeks must
  find exactly the first record at or after a stamp.
- ``power-loss``: every node runs under the power-loss shim
  (``tests/faults/unsynced.c``); a group's leader and one more node lose
  power (SIGKILL, then what they wrote without syncing is dropped, POSIX
  rules), later all three. With ``--fsync always`` nothing acknowledged may
  be lost; ``--fsync none --writeback-s 5`` shows what that mode loses.
- ``bit-rot``: all nodes are killed; a byte is flipped in a sealed segment
  and in an offset index of a group's leader, and in a sealed segment and a
  live raft journal record of a follower; all restart. Every replica's copy
  must read back whole at once (healed reads), and the segments must be
  repaired from peers (and the index rebuilt) within 60 s.
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

__all__ = ["SCENARIOS", "NodeFaultReport", "bounded", "run_node_faults", "run_scenario"]

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

    def start_workload(self, **config) -> None:
        self.client.create_topic(self.topic, queues=self.queues, **config)
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


# ------------------------------------------------------------------- bit rot
def flip(path: str, at: int | None = None) -> int:
    """Invert one byte of a file (its middle by default); returns the position."""
    size = os.path.getsize(path)
    at = size // 2 if at is None else at
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
    return at


def sealed_segments(node_dir: str, group: int | None = None) -> list[str]:
    """Sealed segment logs (every one but the last of its queue) under a node's directory."""
    out = []
    pattern = os.path.join(node_dir, f"group-{group if group is not None else '*'}", "queues", "*")
    for qdir in sorted(glob.glob(pattern)):
        logs = sorted(glob.glob(os.path.join(qdir, "*.log")))
        out += logs[:-1]
    return out


def live_journal_record(group_dir: str) -> tuple[int, str] | None:
    """A byte inside the body of a live journal record in the middle of the group's
    live journal file (read from a copy, so the node's own files stay as they are)."""
    import shutil
    from storage_service.raft.journal import DurableJournal
    with tempfile.TemporaryDirectory() as tmp:
        for f in glob.glob(os.path.join(group_dir, "raft.*")):
            shutil.copy(f, tmp)
        j = DurableJournal(os.path.join(tmp, "raft"))
        if len(j._ends) < 4:
            return None
        k = len(j._ends) // 2
        return (j._ends[k - 1] + j._ends[k]) // 2, os.path.basename(j.file_path)


def _rot(run: _Run, victims: dict[int, list[str]]) -> None:
    """Kill -9 every node, flip bytes as ``victims`` says (node -> kinds: segment,
    index, journal), restart them all."""
    cluster, rep = run.cluster, run.report
    g = run.client.group_of(run.topic, 0)
    for i in range(cluster.nodes):
        cluster.kill(i, signal.SIGKILL)
    for i, kinds in victims.items():
        node_dir = os.path.join(cluster.data_dir, f"node-{i}")
        segs = sealed_segments(node_dir, g)
        # Rot in a segment is repaired by fetching the segment from a peer, which
        # rewrites its index too: index rot goes into another sealed segment.
        at_seg = len(segs) // 2
        at_idx = at_seg - 1 if at_seg > 0 else at_seg + 1
        for kind in kinds:
            if kind in ("segment", "index") and (kind == "segment" or at_idx < len(segs)) and segs:
                seg = segs[at_seg if kind == "segment" else at_idx]
                path = seg if kind == "segment" else seg[:-4] + ".idx"
                if kind == "index" and os.path.getsize(path) < 32:
                    continue
                # an index: the offset of its first entry (the last one is checked at start, the
                # others by reads and the scrub; a segment's first batch has none)
                at = flip(path, None if kind == "segment" else 2)
                rep.faults.append(f"node {i}: byte {at} of {os.path.relpath(path, node_dir)} flipped")
            elif kind == "journal":
                found = live_journal_record(os.path.join(node_dir, f"group-{g}"))
                if found:
                    at, name = found
                    flip(os.path.join(node_dir, f"group-{g}", name), at)
                    rep.faults.append(f"node {i}: byte {at} of group-{g}/{name} (a live journal record) flipped")
    for i in range(cluster.nodes):
        cluster.start_node(i)
    cluster.wait_ready(120)


def bit_rot(run: _Run, seconds: float) -> None:
    cluster, client, rep = run.cluster, run.client, run.report
    time.sleep(seconds * 0.3)
    g = client.group_of(run.topic, 0)
    leader = leader_index(client, cluster, g)
    leader = 0 if leader is None else leader
    follower = (leader + 1) % cluster.nodes
    rep.measured["rot_on"] = f"leader{leader}+follower{follower}"
    # The leader's segment and index rot need two sealed segments (a busy machine
    # may not have rolled two in the first part of the run).
    leader_dir = os.path.join(cluster.data_dir, f"node-{leader}")
    if wait_for(lambda: len(sealed_segments(leader_dir, g)) >= 2, timeout=60) is None:
        rep.problems.append(f"node {leader} sealed fewer than 2 segments of group {g} in 60 s")
    _rot(run, {leader: ["segment", "index"], follower: ["segment", "journal"]})
    if sum("flipped" in f for f in rep.faults) < 4:
        rep.problems.append(f"not every kind of rot could be placed: {rep.faults}")
    # Every replica's copy of every queue of the group reads back whole right away.
    for q in range(run.queues):
        if client.group_of(run.topic, q) != g:
            continue
        for addr in cluster.addresses:
            client.fetch(run.topic, q, 0, max_bytes=64 * MiB, address=addr, from_follower=True)
    time.sleep(seconds * 0.4)
    took = wait_for(lambda: not unrepaired(cluster), timeout=60)
    rep.measured["repaired_s"] = f"{took:.1f}" if took is not None else "none"
    if took is None:
        rep.problems.append(f"segments still bad 60 s after the restart: {unrepaired(cluster)[:3]}")
    rep.measured["healed_reads"] = _log_count(cluster, "from a peer, repairing the segment")
    rep.measured["segments_repaired"] = _log_count(cluster, "repaired from a peer")
    rep.measured["indexes_rebuilt"] = _log_count(cluster, "rebuilt")


def unrepaired(cluster: LocalCluster) -> list[str]:
    """Segment files (every queue, every node) whose batches or index do not check out."""
    from storage_service.log.segment import Segment, check_segment
    bad = []
    for qdir in glob.glob(os.path.join(cluster.data_dir, "node-*", "group-*", "queues", "*")):
        for path in sorted(glob.glob(os.path.join(qdir, "*.log")))[:-1]:     # sealed ones: no writer
            base, size = int(os.path.basename(path)[:-4]), os.path.getsize(path)
            seg = Segment(base, qdir, 1 << 62, size)
            try:
                whole, index_ok, _ = check_segment(seg, size)
            except FileNotFoundError:
                continue
            if not (whole and index_ok):
                bad.append(path)
    return bad


def _log_count(cluster: LocalCluster, needle: str) -> int:
    n = 0
    for path in glob.glob(os.path.join(cluster.log_dir, "node-*.log")):
        with open(path, errors="replace") as f:
            n += sum(1 for line in f if needle in line)
    return n


# ---------------------------------------------------------------- power loss
class PowerCluster(LocalCluster):
    """Every node under the power-loss shim (``tests/faults/unsynced.c``): node *i*'s
    unsynced writes are kept apart in ``<data_dir>/undo-i`` and dropped by ``power_off``."""

    writeback_s: float | None = None

    def node_command(self, i: int) -> list[str]:
        from .faults.powerloss import shim_env
        env = shim_env(os.path.join(self.data_dir, f"node-{i}"), self.undo_dir(i), self.writeback_s)
        return ["env", *[f"{k}={v}" for k, v in env.items()], *super().node_command(i)]

    def undo_dir(self, i: int) -> str:
        return os.path.join(self.data_dir, f"undo-{i}")

    def power_off(self, nodes: list[int]) -> list:
        """Cut the power of ``nodes`` at once: SIGKILL, then what they wrote and did
        not sync is gone (``drop_unsynced``, POSIX rules: names need a directory sync)."""
        from .faults.powerloss import drop_unsynced
        for i in nodes:
            self.kill(i, signal.SIGKILL)
        for i in nodes:
            proc = self.procs[i]
            if proc is not None:
                proc.wait(10)
        return [drop_unsynced(self.undo_dir(i)) for i in nodes]


def power_loss(run: _Run, seconds: float) -> None:
    """Twice a power loss of a majority (a group's leader and one more, then all
    three), each restarted after its unsynced writes were dropped."""
    cluster, client, rep = run.cluster, run.client, run.report
    dropped = 0
    for k, share in enumerate((0.3, 0.3)):
        time.sleep(seconds * share)
        g = client.group_of(run.topic, 0)
        leader = leader_index(client, cluster, g)
        leader = 0 if leader is None else leader
        nodes = [leader, (leader + 1) % cluster.nodes] if k == 0 else list(range(cluster.nodes))
        losses = cluster.power_off(nodes)
        for i, loss in zip(nodes, losses):
            rep.faults.append(f"node {i}: {loss.summary()}")
            dropped += loss.bytes_dropped
            if loss.skipped:
                rep.problems.append(f"node {i}: the shim could not undo {loss.skipped[:2]}")
        for i in nodes:
            cluster.start_node(i)
        cluster.wait_ready(120)
    rep.measured["unsynced_bytes_dropped"] = dropped
    time.sleep(seconds * 0.2)


# --------------------------------------------------------------- clock jumps
def _clock_cluster(*args, **kwargs):
    from .faults.clock import ClockCluster, SteppableClock
    return ClockCluster(*args, clocks={i: SteppableClock() for i in range(3)}, **kwargs)


def _read_all(client, topic: str, q: int) -> list:
    out, off = [], 0
    while True:
        got = client.fetch(topic, q, off, max_bytes=8 * MiB)
        if not got.records:
            return out
        out += got.records
        off = got.next_offset


def _check_timestamps(run: _Run, since_ms: int) -> None:
    """Per queue: store timestamps non-decreasing, within the real time of the run,
    and a timestamp seek finds exactly the first record at or after a stamp."""
    client, rep = run.client, run.report
    regress = outside = seeks = wrong = 0
    for q in range(run.queues):
        recs = _read_all(client, run.topic, q)
        until = int(time.time() * 1000) + 2000       # the producers go on meanwhile
        stamps = [r.store_timestamp for r in recs]
        regress += sum(1 for a, b in zip(stamps, stamps[1:]) if b < a)
        off = [t for t in stamps if not since_ms - 2000 <= t <= until]
        outside += len(off)
        if off:
            worst = max(off, key=lambda t: abs(t - since_ms))
            rep.measured["ts_worst_s"] = f"{(worst - since_ms) / 1000:+.0f}"
        for r in recs[::max(1, len(recs) // 10)]:
            first = next(x.offset for x in recs if x.store_timestamp >= r.store_timestamp)
            seeks += 1
            wrong += client.offset_for_timestamp(run.topic, q, r.store_timestamp) != first
    rep.measured.update(ts_regressions=regress, ts_outside_run=outside, ts_seeks=seeks, ts_seeks_wrong=wrong)
    if regress or outside or wrong:
        rep.problems.append(f"store timestamps: {regress} went back, {outside} outside the run's real "
                            f"time, {wrong} of {seeks} timestamp seeks wrong")


def clock_jumps(run: _Run, seconds: float) -> None:
    """The metadata leader's clock steps back an hour, then forward a day; it leads a
    data group too. Store timestamps, timestamp seeks, the topic's 10-minute
    retention and a tier lease taken before the steps must not notice."""
    cluster, client, rep = run.cluster, run.client, run.report
    since = int(time.time() * 1000)
    time.sleep(seconds * 0.2)
    victim = leader_index(client, cluster, 0)
    victim = 0 if victim is None else victim
    rep.measured["stepped"] = f"node{victim}"
    granted, _, _, token = client.lease(run.topic, "tier", "job-a", 120_000)
    if not granted:
        rep.problems.append("the tier lease was not granted before the clock steps")
    clock = cluster.clocks[victim]
    for step, share in ((-3600, 0.25), (86_400, 0.25)):
        clock.step(step)
        rep.faults.append(f"node {victim}'s clock stepped {step:+d} s (now {clock.offset:+.0f} s)")
        time.sleep(seconds * share)
        other, holder, expires, _ = client.lease(run.topic, "tier", "job-b", 60_000)
        if other or holder != "job-a":
            rep.problems.append(f"after a {step:+d} s step job-b took the lease job-a holds ({holder})")
        renewed, _, expires, again = client.lease(run.topic, "tier", "job-a", 120_000)
        left = expires - time.time() * 1000
        if not renewed or again != token or not 100_000 <= left <= 125_000:
            rep.problems.append(f"after a {step:+d} s step job-a's renewal: granted={renewed} "
                                f"token kept={again == token} expires in {left / 1000:.0f} s (120 s asked)")
    clock.reset()
    rep.faults.append(f"node {victim}'s clock back to real time")
    time.sleep(seconds * 0.1)
    earliest = {o.queue: o.earliest for o in client.offsets(run.topic)}
    if any(earliest.values()):
        rep.problems.append(f"retention (10 min) deleted data while a clock was a day ahead: {earliest}")
    _check_timestamps(run, since)


SCENARIOS = {"disk-full": (disk_full, _disk_full_setup,
                           ["--min-free-bytes", str(RESERVE), "--segment-bytes", str(4 * MiB),
                            "--retention-interval", "1"]),
             "bit-rot": (bit_rot, None, ["--segment-bytes", str(160 << 10), "--scrub-interval", "3"]),
             "power-loss": (power_loss, None, ["--segment-bytes", str(1 * MiB), "--compaction-entries", "500"]),
             "clock": (clock_jumps, None, ["--retention-interval", "1", "--segment-bytes", str(128 << 10)])}
CLUSTERS = {"power-loss": PowerCluster, "clock": _clock_cluster}
TOPICS = {"clock": {"retention_ms": 600_000}}


def run_scenario(name: str, data_dir: str, seconds: float = 60.0, fsync: str = "always",
                 log=print, writeback_s: float | None = None, node_args: tuple[str, ...] = ()) -> NodeFaultReport:
    from rmq_spark.client import Client

    fault, setup, args = SCENARIOS[name]
    report = NodeFaultReport(scenario=name)
    resource = setup(data_dir) if setup else None
    try:
        cluster = CLUSTERS.get(name, LocalCluster)(nodes=3, groups=3, data_dir=data_dir, fsync=fsync,
                                                   extra_args=[*args, *node_args])
        cluster.writeback_s = writeback_s
        cluster.start(timeout=90)
        try:
            with Client(cluster.endpoints, timeout=30, attempt_timeout=2.0) as client:
                run = _Run(cluster, client, report)
                run.disk = resource
                run.start_workload(**TOPICS.get(name, {}))
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


def bounded(name: str, data_dir: str, seconds: float, node_args: tuple[str, ...] = ()) -> NodeFaultReport:
    """A scenario's bounded run for ``make test``: every acknowledged message read back
    once and in order on identical replicas, and the scenario's own guarantees held.
    ``node_args``: more flags for every node."""
    rep = run_scenario(name, data_dir, seconds=seconds, log=lambda line: None, node_args=node_args)
    print(rep.summary())
    assert rep.acked > 0 and rep.ok, rep.summary()
    assert not rep.problems, rep.problems
    return rep


def run_node_faults(data_dir: str, scenarios: list[str], seconds: float = 60.0, fsync: str = "always",
                    log=print, writeback_s: float | None = None) -> list[NodeFaultReport]:
    out = []
    for name in scenarios:
        d = os.path.join(data_dir, name)
        os.makedirs(d, exist_ok=True)
        log(f"node faults: {name}, {seconds:.0f} s")
        rep = run_scenario(name, d, seconds, fsync, log, writeback_s)
        log(rep.summary())
        out.append(rep)
    return out


def main(argv=None) -> int:
    ap = harness_parser("python -m tests.node_faults", __doc__)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--fsync", choices=FSYNC_POLICIES, default="always")
    ap.add_argument("--writeback-s", type=float, default=None,
                    help="power-loss: the kernel writes back what is older than this (default: never)")
    a = ap.parse_args(argv)
    names = [s for s in a.scenarios.split(",") if s]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}: choose from {', '.join(SCENARIOS)}")
    with tempfile.TemporaryDirectory(prefix="rmq-node-faults-") as tmp:
        reports = run_node_faults(a.data_dir or tmp, names, a.seconds, a.fsync, writeback_s=a.writeback_s)
    if a.json:
        print(json.dumps([{**r.__dict__, "held": r.held} for r in reports], indent=2))
    for r in reports:
        for p in r.problems:
            print(f"  {r.scenario}: {p}")
    return 0 if all(r.held for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
