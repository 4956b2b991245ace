"""Partition run: idempotent producers and readers while the network between nodes is cut.

    python -m tests.partition_harness --seconds 60 [--scenarios isolate-leader,split] [--fsync always]

``make jepsen`` runs every scenario for 60 s (``JEPSEN_SECONDS``) with ``--fsync always``.

Every storage node runs in its own network namespace (``tests/netns.py``);
this process, the client, sits in the root namespace and reaches them all
over a bridge. Per scenario a fresh topic gets two idempotent producers for
each data group (``tests/workload.py``; one over gRPC, one over the produce
port) and a reader of ``Client.offsets`` while links are cut and healed:

- ``isolate-leader``: the leader of a data group is cut from its peers; the
  client still reaches it.
- ``split``: a majority and a minority (a random node) cannot talk.
- ``bridge``: two nodes cannot talk to each other; the third reaches both.
- ``cut-off``: one node's link goes down; nobody reaches it, the client neither.
- ``flap``: the leader of a data group isolated and healed again every 1-2 s.
- ``move``: on a cluster of four (each group on three), a replica of a data
  group is moved to the node without one (its leader's replica every other
  time, so the leadership moves too), and at once the group's leader, the
  node taking the replica or the one giving it up is isolated; the
  controller finishes the move once the partition heals.

Beside them, three clients increment a counter in a compact topic with
compare-and-set (``tests/kv_workload.py``): after the last heal no
acknowledged increment may be missing and the history of the counter must be
linearizable (``kv_*`` fields of the summary).

After the last heal the run verifies the topic (every acknowledged message
exactly once, per-producer order, contiguous offsets, identical replicas) and
prints one summary line per scenario:

- ``acked lost duplicated reordered replica_mismatches offset_gaps``: the
  verification.
- ``stale_reads``: leader answers (``Client.offsets``) older than a write
  acknowledged before the read began; ``leader_reads`` how many were made.
- ``max_unavailable_s``: the longest time no produce to a data group
  succeeded (the 3 s after the last heal included).
- ``failover_s``: median and max over the cuts that left a group's leader
  apart from its peers, of the longest time no produce to that group was
  acknowledged from the cut to 1 s after its heal (in-flight writes answered
  just after the cut do not count as recovery).
- ``handler_errors``: tracebacks the nodes logged during the scenario.
- ``deposed_on_heal``: heals after which a group's leader changed although
  it had stayed with a majority of its peers throughout the cut (a rejoining
  node must not depose it: pre-vote).
"""
from __future__ import annotations

import json
import os
import random
import statistics
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from storage_service.local import LocalCluster
from storage_service.raft.journal import FSYNC_POLICIES

from .kv_workload import KvCounter
from .netns import Netns
from .workload import AckingProducer, Acks, Verdict, harness_parser, leader_index, run_for, verify

__all__ = ["SCENARIOS", "NetnsCluster", "PartitionReport", "run_partition"]

NODE_PORT = 20000       # each node has its namespace's ports to itself: any fixed block will do


@dataclass
class PartitionReport(Verdict):
    scenario: str = ""
    faults: list[str] = field(default_factory=list)
    unavailable_s: dict[int, float] = field(default_factory=dict)   # data group -> longest gap
    stale_reads: int = 0
    leader_reads: int = 0
    failover_s: list[float] = field(default_factory=list)   # per cut that parted a leader
    handler_errors: int = 0
    deposed_on_heal: int = 0
    heals_checked: int = 0

    @property
    def held(self) -> bool:
        """The guarantees beyond the verification: fresh leader reads, no handler
        errors, no leader deposed by a rejoining node."""
        return not (self.stale_reads or self.handler_errors or self.deposed_on_heal)

    @property
    def max_unavailable_s(self) -> float:
        return max(self.unavailable_s.values(), default=0.0)

    @property
    def failover_median_s(self) -> float:
        return statistics.median(self.failover_s) if self.failover_s else 0.0

    def summary(self) -> str:
        per_group = ",".join(f"g{g}:{s:.1f}" for g, s in sorted(self.unavailable_s.items()))
        failover = (f"{self.failover_median_s:.2f}/{max(self.failover_s):.2f}(n={len(self.failover_s)})"
                    if self.failover_s else "-")
        return (f"partition summary: scenario={self.scenario} {self.counts()} "
                f"stale_reads={self.stale_reads} max_unavailable_s={self.max_unavailable_s:.1f} "
                f"failover_s={failover} handler_errors={self.handler_errors} "
                f"deposed_on_heal={self.deposed_on_heal}/{self.heals_checked} "
                f"leader_reads={self.leader_reads} faults={len(self.faults)} unavailable_s={per_group} "
                f"produce_calls={self.produce_calls} retries={self.retries}")


class NetnsCluster(LocalCluster):
    """A ``LocalCluster`` whose node *i* runs in namespace *i* on that namespace's address."""

    def __init__(self, net: Netns, data_dir: str, groups: int = 3, **kwargs):
        self.net = net
        super().__init__(nodes=net.nodes, groups=groups, data_dir=data_dir, port=NODE_PORT,
                         hosts=net.addresses, **kwargs)

    def node_command(self, i: int) -> list[str]:
        return self.net.exec_prefix(i) + super().node_command(i)


def _leader_reader(endpoints: str, topic: str, acks: Acks, stop: threading.Event,
                   report: PartitionReport) -> None:
    """Count ``Client.offsets`` answers older than a write acknowledged before the read began.

    The proto promises these answers come from each group's leader, fresh
    (read-your-writes). Before leader leases (issue 18) a leader cut off from
    its peers kept answering as leader. The reader has its own client, as a
    consumer in another process would: the producers' client learns the new
    leader when a produce fails, a reader's does not while the old leader
    keeps answering.
    """
    from rmq_spark.client import Client

    with Client(endpoints, timeout=30, attempt_timeout=2.0) as client:
        while not stop.is_set():
            before = acks.snapshot()
            try:
                answer = client.offsets(topic)
            except Exception:
                stop.wait(0.1)
                continue
            report.leader_reads += 1
            if any(o.latest < before.get(o.queue, 0) for o in answer):
                report.stale_reads += 1
            stop.wait(0.05)


@dataclass
class _Run:
    net: Netns
    cluster: NetnsCluster
    client: object
    groups: list[int]           # the data groups holding the topic's queues
    report: PartitionReport
    rng: random.Random
    parted: list[list] = field(default_factory=list)   # [cut time, group whose leader was parted, heal time]
    kept: dict[int, tuple[int, int]] = field(default_factory=dict)   # group -> (leader, term) that kept a majority
    cut_logs: dict[str, int] = field(default_factory=dict)   # node log sizes at the last cut
    log: Callable[[str], None] = print
    first: int | None = None    # the group the first isolate-leader cut goes to (the counter's)


def _leaders(run: _Run) -> dict[int, tuple[int, int]]:
    """data group -> (index, term) of the node that reports itself its leader."""
    try:
        st = run.client.cluster_status()
    except Exception:
        return {}
    out = {}
    for n in st["nodes"]:
        for g in n["groups"]:
            if g["group"] in run.groups and g["leader"] == n["address"] and n["address"] in run.cluster.addresses:
                out[g["group"]] = (run.cluster.addresses.index(n["address"]), g["term"])
    return out


def _cut(run: _Run, apart: set[int], cut: Callable[[], None]) -> None:
    """Apply ``cut``, which parts the nodes ``apart`` from a majority of their peers;
    note the groups whose leader that parts, and the leaders that keep a majority."""
    leaders = _leaders(run)
    run.cut_logs = _log_sizes(run.cluster)
    t = time.monotonic()
    cut()
    run.parted += [[t, g, None] for g, (i, _) in leaders.items() if i in apart]
    run.kept = {g: lead for g, lead in leaders.items() if lead[0] not in apart}


def _isolate_leader(run: _Run) -> str | None:
    g = run.first if run.first in run.groups and not run.report.faults else run.rng.choice(run.groups)
    victim = leader_index(run.client, run.cluster, g)
    if victim is None:
        return None
    _cut(run, {victim}, lambda: run.net.isolate(victim))
    return f"isolate node {victim} (leader of group {g})"


def _split(run: _Run) -> str:
    minority = run.rng.randrange(run.net.nodes)
    _cut(run, {minority}, lambda: run.net.split([[n for n in range(run.net.nodes) if n != minority], [minority]]))
    return f"split: node {minority} alone"


def _bridge(run: _Run) -> str:
    a, b, via = run.rng.sample(range(run.net.nodes), 3)
    # Every node still reaches a majority (itself and ``via``): nobody is parted.
    _cut(run, set(), lambda: run.net.bridge(a, b, via))
    return f"bridge: {a} x {b}, via {via}"


def _cut_off(run: _Run) -> str:
    node = run.rng.randrange(run.net.nodes)
    _cut(run, {node}, lambda: run.net.cut_off(node))
    return f"cut off node {node} (client included)"


def _move(run: _Run) -> str | None:
    """Ask the controller to move one replica of a group, then isolate a node that
    takes part in the move (the move runs through the cut and after the heal)."""
    from rmq_spark.cli._status import moving_groups
    st = run.client.cluster_status()
    if moving_groups(st):
        return None                          # the last move is not done yet
    g = run.rng.choice(run.groups)
    reps = st["placement"][g]
    spare = [a for a in run.cluster.addresses if a not in reps]
    leader = leader_index(run.client, run.cluster, g)
    if not spare or leader is None:
        return None
    giver = run.cluster.addresses[leader] if run.rng.random() < 0.5 else run.rng.choice(reps)
    run.client.cluster_command("move", giver, g, spare[0])
    victim = run.rng.choice([leader, run.cluster.addresses.index(spare[0]), run.cluster.addresses.index(giver)])
    time.sleep(run.rng.uniform(0.2, 1.5))    # the move under way: adding, catching up or removing
    _cut(run, {victim}, lambda: run.net.isolate(victim))
    run.kept.pop(g, None)                    # its leadership may move on purpose
    return f"move group {g}: {giver} -> {spare[0]}, isolate node {victim}"


def _check_heal(run: _Run) -> None:
    """After a heal: a leader that kept its majority through the cut still leads, in
    the same term. A rejoining node that had raised its term while cut off would
    have deposed it by now (its first message after the heal carries that term)."""
    now = _leaders(run)
    for g, lead in run.kept.items():
        run.report.heals_checked += 1
        if now.get(g) != lead:
            run.report.deposed_on_heal += 1
            what = f"group {g}: leader/term {lead} changed after the heal: {now.get(g)}"
            run.report.faults.append(what)
            run.log(f"  {run.report.scenario}: {what}")
            for line in _node_lines(run.cut_logs, (f"group {g}: ", "held up")):   # why, as the nodes saw it
                run.log(f"    {line}")
    run.kept = {}


# scenario -> (apply one fault, seconds the fault holds, seconds healed before the next)
SCENARIOS: dict[str, tuple[Callable[[_Run], str | None], tuple[float, float], tuple[float, float]]] = {
    "isolate-leader": (_isolate_leader, (4.0, 6.0), (2.0, 3.0)),
    "split": (_split, (4.0, 6.0), (2.0, 3.0)),
    "bridge": (_bridge, (4.0, 6.0), (2.0, 3.0)),
    "cut-off": (_cut_off, (4.0, 6.0), (2.0, 3.0)),
    "flap": (_isolate_leader, (1.0, 2.0), (1.0, 2.0)),
    "move": (_move, (3.0, 5.0), (3.0, 5.0)),
}
NODES = {"move": 4}         # nodes a scenario runs on (3 otherwise)


def _faults(run: _Run, scenario: str, stop: threading.Event) -> None:
    apply, hold, rest = SCENARIOS[scenario]
    try:
        while not stop.is_set():
            what = apply(run)
            if what is None:            # no leader known right now
                stop.wait(0.2)
                continue
            run.report.faults.append(what)
            stop.wait(run.rng.uniform(*hold))
            run.net.heal()
            for cut in run.parted:
                cut[2] = cut[2] or time.monotonic()
            pause = run.rng.uniform(*rest)
            if not stop.wait(min(1.0, pause)):
                _check_heal(run)
                stop.wait(max(0.0, pause - 1.0))
    finally:
        run.net.heal()


def _run_scenario(cluster: NetnsCluster, client, scenario: str, seconds: float, queues: int,
                  seed: int, log, kv: bool = True) -> PartitionReport:
    report, lock = PartitionReport(scenario=scenario), threading.Lock()
    logs_at = _log_sizes(cluster)
    topic = f"part-{scenario}"
    client.create_topic(topic, queues=queues)
    by_group: dict[int, list[int]] = {}
    for q in range(queues):
        by_group.setdefault(client.group_of(topic, q), []).append(q)
    acks, stop, fault_stop = Acks(), threading.Event(), threading.Event()
    # Two producers per group (one gRPC, one produce port) and none shared between
    # groups: a producer stuck on a cut group must not hide another group's progress.
    prods = [AckingProducer(client, topic, 2 * k + kind, qs, stop, report, lock, acks=acks, group=g)
             for k, (g, qs) in enumerate(sorted(by_group.items())) for kind in (0, 1)]
    run = _Run(cluster.net, cluster, client, sorted(by_group), report, random.Random(seed), log=log)
    reader = threading.Thread(target=_leader_reader, args=(cluster.endpoints, topic, acks, stop, report), daemon=True)
    faults = threading.Thread(target=_faults, args=(run, scenario, fault_stop), daemon=True)
    counter = None
    if kv:
        from rmq_spark.client import Client
        # The key-value counter: its key's queue is in one of the topic's groups, which
        # the faults pick from (run.groups); the cuts reach it as often as the others.
        kv_topic = f"kv-{scenario}"
        client.create_topic(kv_topic, queues=len(by_group), cleanup_policy="compact")
        counter = KvCounter(lambda: Client(cluster.endpoints, timeout=10, attempt_timeout=2.0), kv_topic, stop)
        counter.start(client)
        run.first = client.group_of(kv_topic, client.kv_get(kv_topic, counter.key).queue)
    for t in (*prods, reader):
        t.start()
    time.sleep(1.0)                     # producing before the first cut
    t0 = time.monotonic()
    faults.start()
    run_for(seconds, prods, lambda line: log(f"  {scenario}" + line),
            lambda: f"{len(report.faults)} faults, {report.retries} retries, "
                    f"{report.stale_reads} stale reads")
    fault_stop.set()
    faults.join()
    time.sleep(3.0)                     # healed: the time to recover counts as unavailable
    stop.set()
    t1 = time.monotonic()
    for t in (*prods, reader):
        t.join(timeout=60)
    report.unavailable_s = {g: acks.longest_gap(g, t0, t1) for g in by_group}
    for t, g, healed in run.parted:
        report.failover_s.append(acks.longest_gap(g, t, min(t1, (healed or t1) + 1.0)))
    report.handler_errors = _new_tracebacks(cluster, logs_at)
    cluster.wait_ready(timeout=60)
    verify(client, cluster, topic, prods, queues, report)
    if counter is not None:
        counter.judge(client, report)
    return report


def _log_sizes(cluster: NetnsCluster) -> dict[str, int]:
    out = {}
    for i in range(cluster.net.nodes):
        path = os.path.join(cluster.log_dir, f"node-{i}.log")
        out[path] = os.path.getsize(path) if os.path.exists(path) else 0
    return out


def _node_lines(since: dict[str, int], needles: tuple[str, ...]) -> list[str]:
    """Lines the nodes logged since ``since`` (``_log_sizes``) holding one of ``needles``."""
    out = []
    for path, size in since.items():
        with open(path, "rb") as f:
            f.seek(size)
            out += [f"{os.path.basename(path)}: {line}" for line in f.read().decode(errors="replace").splitlines()
                    if any(n in line for n in needles)]
    return out


def _new_tracebacks(cluster: NetnsCluster, since: dict[str, int]) -> int:
    """Tracebacks the nodes logged since ``since`` (``_log_sizes``): handler failures."""
    count = 0
    for path, size in since.items():
        with open(path, "rb") as f:
            f.seek(size)
            count += f.read().count(b"Traceback (most recent call last)")
    return count


def run_partition(data_dir: str, scenarios: list[str], seconds: float = 60.0, queues: int = 6,
                  groups: int = 3, seed: int = 1, log=print, fsync: str = "always") -> list[PartitionReport]:
    """Run ``scenarios`` one after another on a cluster of 3 nodes in namespaces (4 for
    ``move``, on a cluster of its own)."""
    from rmq_spark.client import Client

    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    reports = []
    for nodes in sorted({NODES.get(s, 3) for s in scenarios}):
        with Netns(nodes) as net:
            cluster = NetnsCluster(net, os.path.join(data_dir, f"nodes-{nodes}"), groups=groups, fsync=fsync,
                                   extra_args=["--compaction-entries", "200"])
            cluster.start(timeout=90)
            try:
                with Client(cluster.endpoints, timeout=30, attempt_timeout=2.0) as client:
                    for k, scenario in enumerate(scenarios):
                        if NODES.get(scenario, 3) != nodes:
                            continue
                        reports.append(_run_scenario(cluster, client, scenario, seconds, queues, seed + k, log))
                        log(reports[-1].summary())
            finally:
                cluster.stop()
    return reports


def main(argv=None) -> int:
    ap = harness_parser("python -m tests.partition_harness", __doc__, seconds_help="per scenario")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--fsync", choices=FSYNC_POLICIES, default="always",
                    help="the nodes' fsync policy (default: always)")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # unwinds: nodes stopped, namespaces removed
    with tempfile.TemporaryDirectory(prefix="rmq-partition-") as tmp:
        reports = run_partition(a.data_dir or tmp, a.scenarios.split(","), a.seconds, seed=a.seed,
                                log=lambda line: print(line, flush=True), fsync=a.fsync)
    print(f"partition runs: {len(reports)} scenarios, {a.seconds:.0f} s each, --fsync {a.fsync}, "
          f"seed {a.seed}: " + ("all held" if all(r.ok and r.held for r in reports) else "FAILED"))
    if a.json:
        print(json.dumps([{**r.__dict__, "ok": r.ok} for r in reports], indent=2))
    return 0 if all(r.ok and r.held for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
