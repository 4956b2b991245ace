"""Chaos run: idempotent producers against a local cluster under faults.

    python -m tests.chaos_harness --seconds 60

Producers append numbered messages with a fixed producer id and sequence, and
retry a failed batch with the same id/sequence until it is acknowledged. A
fault thread meanwhile changes the cluster's membership: a fourth node joins,
a rebalance moves replicas onto it and a node taking part in a replica move
is SIGKILLed mid-move and restarted; later a fifth node joins (another
rebalance) and a founding node is decommissioned, then stopped for good.
Between those it SIGKILLs the leader of a random group and restarts it and
pauses a node (SIGSTOP/SIGCONT); at the end it kills every node at once and
restarts them all. Then every queue is read from every replica of its group
and checked: every acknowledged message present exactly once, in each
producer's order, offsets contiguous, replicas identical. Beside the
producers, three clients increment a counter by compare-and-set
(``tests/kv_workload.py``): no acknowledged increment may be lost and the
counter's history must be linearizable. Prints a one-line summary.
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

from storage_service.local import LocalCluster

from .kv_workload import KvCounter
from .workload import Producer, Verdict, harness_parser, leader_index, run_for, verify

__all__ = ["ChaosReport", "run_chaos"]


@dataclass
class ChaosReport(Verdict):
    faults: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"chaos summary: {self.counts()} faults={len(self.faults)} "
                f"produce_calls={self.produce_calls} retries={self.retries}")


def _moving(client) -> tuple[int, list[str]] | None:
    """(group, nodes joining or leaving it) of a replica move under way, if any."""
    from rmq_spark.cli._status import moving_groups
    st = client.cluster_status()
    for g in moving_groups(st):
        voters = next((gs["replicas"] for n in st["nodes"] for gs in n["groups"]
                       if gs["group"] == g and gs["leader"] == n["address"]), [])
        return g, sorted(set(voters) ^ set(st["placement"][g]))
    return None


def _join_and_move(client, cluster: LocalCluster, stop: threading.Event, report: ChaosReport,
                   rng: random.Random, kill_mid_move: bool) -> None:
    i = cluster.add_node(timeout=60)
    report.faults.append(f"node {i} joins")
    client.cluster_command("rebalance")
    report.faults.append("rebalance")
    deadline = time.monotonic() + 10
    while kill_mid_move and not stop.is_set() and time.monotonic() < deadline:
        move = _moving(client)
        if move and move[1] and move[1][0] in cluster.addresses:
            victim = cluster.addresses.index(rng.choice(move[1]))
            if cluster.pid(victim) is None:
                break
            report.faults.append(f"kill -9 node {victim} while group {move[0]} moves")
            cluster.kill(victim, signal.SIGKILL)
            stop.wait(rng.uniform(0.3, 1.5))
            cluster.start_node(victim)
            return
        time.sleep(0.05)


def _decommission(client, cluster: LocalCluster, report: ChaosReport, removed: set[int]) -> None:
    victim = 0
    client.cluster_command("decommission", cluster.addresses[victim])
    report.faults.append(f"decommission node {victim}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = client.cluster_status()
        if any(m["address"] == cluster.addresses[victim] and m["state"] == "removed" for m in st["members"]):
            cluster.kill(victim, signal.SIGKILL)
            removed.add(victim)
            report.faults.append(f"node {victim} removed, stopped for good")
            return
        time.sleep(0.5)


def _faults(client, cluster: LocalCluster, stop: threading.Event, report: ChaosReport,
            rng: random.Random, seconds: float, removed: set[int]) -> None:
    t0 = time.monotonic()
    plan = [(0.5, lambda: _join_and_move(client, cluster, stop, report, rng, kill_mid_move=True)),
            (0.4 * seconds, lambda: _join_and_move(client, cluster, stop, report, rng, False)),
            (0.65 * seconds, lambda: _decommission(client, cluster, report, removed))]
    while not stop.is_set():
        if stop.wait(rng.uniform(0.5, 1.5)):
            return
        if plan and time.monotonic() - t0 >= plan[0][0]:
            try:
                plan.pop(0)[1]()
            except Exception as e:            # the cluster was busy (a kill, a pause): not a verdict
                report.faults.append(f"membership change failed for now: {e}")
            continue
        if rng.random() < 0.7:
            g = rng.randint(1, cluster.groups)
            victim = leader_index(client, cluster, g)
            if victim is None or cluster.pid(victim) is None:
                continue
            report.faults.append(f"kill -9 node {victim} (leader of group {g})")
            cluster.kill(victim, signal.SIGKILL)
            stop.wait(rng.uniform(0.3, 1.5))
            cluster.start_node(victim)
        else:
            victim = rng.randrange(cluster.nodes)
            if cluster.pid(victim) is None or victim in removed:
                continue
            report.faults.append(f"SIGSTOP node {victim}")
            cluster.kill(victim, signal.SIGSTOP)
            stop.wait(rng.uniform(0.5, 2.5))
            cluster.kill(victim, signal.SIGCONT)


def run_chaos(data_dir: str, seconds: float = 20.0, producers: int = 4, queues: int = 6,
              groups: int = 3, seed: int = 1, log=print, secure: bool = False) -> ChaosReport:
    """``secure``: the cluster runs TLS on every port (the raft port's TLS judged by the
    same faults) and ACLs; the producers come as the admin, with its token."""
    from rmq_spark.client import Client, TlsFiles

    report, lock, rng = ChaosReport(), threading.Lock(), random.Random(seed)
    cluster = LocalCluster(nodes=3, groups=groups, data_dir=data_dir,
                           extra_args=["--compaction-entries", "200"], secure=secure)
    cluster.start(timeout=90)
    creds = dict(tls=TlsFiles(cluster.tls.ca), token=cluster.token) if secure else {}
    try:
        with Client(cluster.endpoints, timeout=30, attempt_timeout=2.0, **creds) as client:
            client.create_topic("chaos", queues=queues)
            client.create_topic("chaos-kv", queues=groups, cleanup_policy="compact")
            stop = threading.Event()
            counter = KvCounter(lambda: Client(cluster.endpoints, timeout=30, attempt_timeout=2.0, **creds),
                                "chaos-kv", stop)
            counter.start(client)
            prods = [Producer(client, "chaos", i, [q for q in range(queues) if q % producers == i % producers
                                                    or q % 2 == i % 2], stop, report, lock)
                     for i in range(producers)]
            for p in prods:
                p.start()
            removed: set[int] = set()
            faults = threading.Thread(target=_faults, args=(client, cluster, stop, report, rng, seconds, removed),
                                      daemon=True)
            faults.start()
            run_for(seconds, prods, lambda line: log("  chaos" + line),
                    lambda: f"{len(report.faults)} faults, {report.retries} retries")
            stop.set()
            faults.join()
            for p in prods:
                p.join(timeout=60)
            for i in range(cluster.nodes):
                if cluster.procs[i] is not None:
                    cluster.kill(i, signal.SIGCONT)
            report.faults.append("kill -9 all nodes, restart all")
            for i in range(cluster.nodes):
                cluster.kill(i, signal.SIGKILL)
            live = [i for i in range(cluster.nodes) if i not in removed]
            for i in live:
                cluster.start_node(i)
            cluster.wait_ready(90, nodes=live)
            verify(client, cluster, "chaos", prods, queues, report)
            counter.judge(client, report)
    finally:
        cluster.stop()
    return report


def main(argv=None) -> int:
    ap = harness_parser("python -m tests.chaos_harness", __doc__)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--secure", action="store_true", help="TLS on every port (raft too) and ACLs")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rmq-chaos-") as tmp:
        rep = run_chaos(a.data_dir or tmp, a.seconds, a.producers, seed=a.seed, secure=a.secure)
    print(rep.summary())
    if a.json:
        print(json.dumps({**rep.__dict__, "ok": rep.ok}, indent=2))
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
