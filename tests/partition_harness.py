"""Partition run: idempotent producers and readers while the network between nodes is cut.

    python -m tests.partition_harness --seconds 60 [--scenarios isolate-leader,split]

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

After the last heal the run verifies the topic (every acknowledged message
exactly once, per-producer order, contiguous offsets, identical replicas) and
prints one summary line per scenario, with the longest time no produce to a
data group succeeded and the count of stale leader reads.
"""
from __future__ import annotations

import json
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from storage_service.local import LocalCluster

from .netns import Netns
from .workload import Producer, Verdict, harness_parser, leader_index, run_for, verify

__all__ = ["SCENARIOS", "NetnsCluster", "PartitionReport", "run_partition"]

NODE_PORT = 20000       # each node has its namespace's ports to itself: any fixed block will do


@dataclass
class PartitionReport(Verdict):
    scenario: str = ""
    faults: list[str] = field(default_factory=list)
    unavailable_s: dict[int, float] = field(default_factory=dict)   # data group -> longest gap
    stale_leader_reads: int = 0
    leader_reads: int = 0

    @property
    def unavailable_max_s(self) -> float:
        return max(self.unavailable_s.values(), default=0.0)

    def summary(self) -> str:
        per_group = ",".join(f"g{g}:{s:.1f}" for g, s in sorted(self.unavailable_s.items()))
        return (f"partition summary: scenario={self.scenario} {self.counts()} "
                f"unavailable_max_s={self.unavailable_max_s:.1f} stale_leader_reads={self.stale_leader_reads} "
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


class _Acks:
    """What producers had acknowledged, and when: per queue the end of the acked
    offsets, per data group the times of acknowledgements."""

    def __init__(self):
        self._lock = threading.Lock()
        self.ends: dict[int, int] = {}
        self.times: dict[int, list[float]] = {}

    def record(self, queue: int, group: int, result) -> None:
        now = time.monotonic()
        with self._lock:
            if result.base_offset >= 0:
                self.ends[queue] = max(self.ends.get(queue, 0), result.base_offset + result.count)
            self.times.setdefault(group, []).append(now)

    def snapshot(self) -> dict[int, int]:
        with self._lock:
            return dict(self.ends)

    def longest_gap(self, group: int, start: float, end: float) -> float:
        with self._lock:
            ts = [start, *(t for t in self.times.get(group, ()) if start < t < end), end]
        return max(b - a for a, b in zip(ts, ts[1:]))


class _AckingProducer(Producer):
    def __init__(self, *args, acks: _Acks, group: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.acks, self.group = acks, group

    def on_ack(self, queue: int, result) -> None:
        self.acks.record(queue, self.group, result)


def _leader_reader(endpoints: str, topic: str, acks: _Acks, stop: threading.Event,
                   report: PartitionReport) -> None:
    """Count ``Client.offsets`` answers older than a write acknowledged before the read began.

    The proto promises these answers come from each group's leader, fresh
    (read-your-writes); issue 18 found a leader cut off from its peers keeps
    answering as leader. The reader has its own client, as a consumer in another
    process would: the producers' client learns the new leader when a produce
    fails, a reader's does not while the old leader keeps answering. Reported
    only: the change that makes leader reads linearizable turns this count into
    an assertion (== 0) in test_partition.py.
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
                report.stale_leader_reads += 1
            stop.wait(0.05)


@dataclass
class _Run:
    net: Netns
    cluster: NetnsCluster
    client: object
    groups: list[int]           # the data groups holding the topic's queues
    report: PartitionReport
    rng: random.Random


def _isolate_leader(run: _Run) -> str | None:
    g = run.rng.choice(run.groups)
    victim = leader_index(run.client, run.cluster, g)
    if victim is None:
        return None
    run.net.isolate(victim)
    return f"isolate node {victim} (leader of group {g})"


def _split(run: _Run) -> str:
    minority = run.rng.randrange(run.net.nodes)
    run.net.split([[n for n in range(run.net.nodes) if n != minority], [minority]])
    return f"split: node {minority} alone"


def _bridge(run: _Run) -> str:
    a, b, via = run.rng.sample(range(run.net.nodes), 3)
    run.net.bridge(a, b, via)
    return f"bridge: {a} x {b}, via {via}"


def _cut_off(run: _Run) -> str:
    node = run.rng.randrange(run.net.nodes)
    run.net.cut_off(node)
    return f"cut off node {node} (client included)"


# scenario -> (apply one fault, seconds the fault holds, seconds healed before the next)
SCENARIOS: dict[str, tuple[Callable[[_Run], str | None], tuple[float, float], tuple[float, float]]] = {
    "isolate-leader": (_isolate_leader, (4.0, 6.0), (2.0, 3.0)),
    "split": (_split, (4.0, 6.0), (2.0, 3.0)),
    "bridge": (_bridge, (4.0, 6.0), (2.0, 3.0)),
    "cut-off": (_cut_off, (4.0, 6.0), (2.0, 3.0)),
    "flap": (_isolate_leader, (1.0, 2.0), (1.0, 2.0)),
}


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
            stop.wait(run.rng.uniform(*rest))
    finally:
        run.net.heal()


def _run_scenario(cluster: NetnsCluster, client, scenario: str, seconds: float, queues: int,
                  seed: int, log) -> PartitionReport:
    report, lock = PartitionReport(scenario=scenario), threading.Lock()
    topic = f"part-{scenario}"
    client.create_topic(topic, queues=queues)
    by_group: dict[int, list[int]] = {}
    for q in range(queues):
        by_group.setdefault(client.group_of(topic, q), []).append(q)
    acks, stop, fault_stop = _Acks(), threading.Event(), threading.Event()
    # Two producers per group (one gRPC, one produce port) and none shared between
    # groups: a producer stuck on a cut group must not hide another group's progress.
    prods = [_AckingProducer(client, topic, 2 * k + kind, qs, stop, report, lock, acks=acks, group=g)
             for k, (g, qs) in enumerate(sorted(by_group.items())) for kind in (0, 1)]
    run = _Run(cluster.net, cluster, client, sorted(by_group), report, random.Random(seed))
    reader = threading.Thread(target=_leader_reader, args=(cluster.endpoints, topic, acks, stop, report), daemon=True)
    faults = threading.Thread(target=_faults, args=(run, scenario, fault_stop), daemon=True)
    for t in (*prods, reader):
        t.start()
    time.sleep(1.0)                     # producing before the first cut
    t0 = time.monotonic()
    faults.start()
    run_for(seconds, prods, lambda line: log(f"  {scenario}" + line),
            lambda: f"{len(report.faults)} faults, {report.retries} retries, "
                    f"{report.stale_leader_reads} stale reads")
    fault_stop.set()
    faults.join()
    time.sleep(3.0)                     # healed: the time to recover counts as unavailable
    stop.set()
    t1 = time.monotonic()
    for t in (*prods, reader):
        t.join(timeout=60)
    report.unavailable_s = {g: acks.longest_gap(g, t0, t1) for g in by_group}
    cluster.wait_ready(timeout=60)
    verify(client, cluster, topic, prods, queues, report)
    return report


def run_partition(data_dir: str, scenarios: list[str], seconds: float = 60.0, queues: int = 6,
                  groups: int = 3, seed: int = 1, log=print) -> list[PartitionReport]:
    """Run ``scenarios`` one after another on one cluster of 3 nodes in namespaces."""
    from rmq_spark.client import Client

    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    reports = []
    with Netns(3) as net:
        cluster = NetnsCluster(net, data_dir, groups=groups, extra_args=["--compaction-entries", "200"])
        cluster.start(timeout=90)
        try:
            with Client(cluster.endpoints, timeout=30, attempt_timeout=2.0) as client:
                for k, scenario in enumerate(scenarios):
                    reports.append(_run_scenario(cluster, client, scenario, seconds, queues, seed + k, log))
                    log(reports[-1].summary())
        finally:
            cluster.stop()
    return reports


def main(argv=None) -> int:
    ap = harness_parser("python -m tests.partition_harness", __doc__, seconds_help="per scenario")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # unwinds: nodes stopped, namespaces removed
    with tempfile.TemporaryDirectory(prefix="rmq-partition-") as tmp:
        reports = run_partition(a.data_dir or tmp, a.scenarios.split(","), a.seconds, seed=a.seed,
                                log=lambda line: print(line, flush=True))
    if a.json:
        print(json.dumps([{**r.__dict__, "ok": r.ok} for r in reports], indent=2))
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
