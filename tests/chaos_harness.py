"""Chaos run: idempotent producers against a local cluster under faults.

    python -m tests.chaos_harness --seconds 60

Producers append numbered messages with a fixed producer id and sequence, and
retry a failed batch with the same id/sequence until it is acknowledged. A
fault thread meanwhile SIGKILLs the leader of a random group and restarts it,
pauses a node (SIGSTOP/SIGCONT), and at the end kills every node at once and
restarts them all. Then every queue is read from every replica and checked:
every acknowledged message present exactly once, in each producer's order,
offsets contiguous, replicas identical. Prints a one-line summary.
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from storage_service.local import LocalCluster

__all__ = ["ChaosReport", "run_chaos"]


@dataclass
class ChaosReport:
    acked: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    replica_mismatches: int = 0
    offset_gaps: int = 0
    faults: list[str] = field(default_factory=list)
    produce_calls: int = 0
    retries: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.reordered or self.replica_mismatches
                    or self.offset_gaps)

    def summary(self) -> str:
        return (f"chaos summary: acked={self.acked} lost={self.lost} duplicated={self.duplicated} "
                f"reordered={self.reordered} replica_mismatches={self.replica_mismatches} "
                f"offset_gaps={self.offset_gaps} faults={len(self.faults)} "
                f"produce_calls={self.produce_calls} retries={self.retries}")


class _Producer(threading.Thread):
    def __init__(self, client, topic: str, pid: int, queues: list[int], stop: threading.Event,
                 report: ChaosReport, lock: threading.Lock):
        super().__init__(daemon=True, name=f"chaos-producer-{pid}")
        self.client, self.topic, self.pid, self.queues = client, topic, pid, queues
        self.stop_event, self.report, self.lock = stop, report, lock
        self.acked: dict[int, int] = {q: 0 for q in queues}     # queue -> messages acked

    def run(self) -> None:
        rng = random.Random(self.pid)
        while not self.stop_event.is_set():
            q = rng.choice(self.queues)
            start, n = self.acked[q], rng.randint(1, 20)
            values = [f"p{self.pid}:{q}:{start + i}".encode() for i in range(n)]
            if not self._send(q, start, values):
                return          # stopped with this batch unacknowledged: it may or may not exist
            self.acked[q] += n

    def _send(self, q: int, seq: int, values: list[bytes]) -> bool:
        while True:
            try:
                with self.lock:
                    self.report.produce_calls += 1
                if self.pid % 2:   # ProduceBatches: the produce port, calls of all such producers shared
                    self.client.produce_batches([(self.topic, q, values, f"chaos-{self.pid}", seq)],
                                                timeout=10)
                else:              # Produce over gRPC
                    self.client.produce(self.topic, values, queue=q, producer_id=f"chaos-{self.pid}",
                                        sequence=seq, timeout=10)
                return True
            except Exception:
                with self.lock:
                    self.report.retries += 1
                if self.stop_event.wait(0.05):
                    return False


def _leader_index(client, cluster: LocalCluster, group: int) -> int | None:
    try:
        st = client.cluster_status()
    except Exception:
        return None
    for n in st["nodes"]:
        for g in n["groups"]:
            if g["group"] == group and g["leader"] in cluster.addresses:
                return cluster.addresses.index(g["leader"])
    return None


def _faults(client, cluster: LocalCluster, stop: threading.Event, report: ChaosReport,
            rng: random.Random) -> None:
    while not stop.is_set():
        if stop.wait(rng.uniform(0.5, 1.5)):
            return
        if rng.random() < 0.7:
            g = rng.randint(1, cluster.groups)
            victim = _leader_index(client, cluster, g)
            if victim is None or cluster.pid(victim) is None:
                continue
            report.faults.append(f"kill -9 node {victim} (leader of group {g})")
            cluster.kill(victim, signal.SIGKILL)
            stop.wait(rng.uniform(0.3, 1.5))
            cluster.start_node(victim)
        else:
            victim = rng.randrange(cluster.nodes)
            if cluster.pid(victim) is None:
                continue
            report.faults.append(f"SIGSTOP node {victim}")
            cluster.kill(victim, signal.SIGSTOP)
            stop.wait(rng.uniform(0.5, 2.5))
            cluster.kill(victim, signal.SIGCONT)


def _read_queue(client, topic: str, q: int, address: str) -> list[tuple[int, bytes]]:
    out, off = [], 0
    while True:
        res = client.fetch(topic, q, off, max_bytes=4 << 20, from_follower=True, address=address)
        if not res.records:
            return out
        out += [(r.offset, r.value) for r in res.records]
        off = res.next_offset


def _verify(client, cluster: LocalCluster, topic: str, producers: list[_Producer],
            queues: int, report: ChaosReport) -> None:
    def converged():
        ends = {(i, q): client.call("Offsets", _offsets_req(topic), address=a).queues[q].latest
                for i, a in enumerate(cluster.addresses) for q in range(queues)}
        return all(len({ends[(i, q)] for i in range(cluster.nodes)}) == 1 for q in range(queues))
    deadline = time.monotonic() + 60
    while not converged() and time.monotonic() < deadline:
        time.sleep(0.2)
    for q in range(queues):
        replicas = [_read_queue(client, topic, q, a) for a in cluster.addresses]
        report.replica_mismatches += sum(1 for r in replicas[1:] if r != replicas[0])
        records = replicas[0]
        report.offset_gaps += sum(1 for i, (off, _) in enumerate(records) if off != i)
        last: dict[str, int] = {}
        seen: set[bytes] = set()
        for _, v in records:
            if v in seen:
                report.duplicated += 1
            seen.add(v)
            p, _, n = v.decode().split(":")
            if int(n) <= last.get(p, -1):
                report.reordered += 1
            last[p] = int(n)
        for pr in producers:
            if q in pr.acked:
                report.acked += pr.acked[q]
                report.lost += sum(1 for i in range(pr.acked[q])
                                   if f"p{pr.pid}:{q}:{i}".encode() not in seen)


def _offsets_req(topic: str):
    from storage_service.proto import rmq_pb2
    return rmq_pb2.OffsetsRequest(topic=topic)


def run_chaos(data_dir: str, seconds: float = 20.0, producers: int = 4, queues: int = 6,
              groups: int = 3, seed: int = 1, log=print) -> ChaosReport:
    from rmq_spark.client import Client

    report, lock, rng = ChaosReport(), threading.Lock(), random.Random(seed)
    cluster = LocalCluster(nodes=3, groups=groups, data_dir=data_dir,
                           extra_args=["--compaction-entries", "200"])
    cluster.start(timeout=90)
    try:
        with Client(cluster.endpoints, timeout=30, attempt_timeout=2.0) as client:
            client.create_topic("chaos", queues=queues)
            stop = threading.Event()
            prods = [_Producer(client, "chaos", i, [q for q in range(queues) if q % producers == i % producers
                                                    or q % 2 == i % 2], stop, report, lock)
                     for i in range(producers)]
            for p in prods:
                p.start()
            faults = threading.Thread(target=_faults, args=(client, cluster, stop, report, rng), daemon=True)
            faults.start()
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                time.sleep(min(5.0, max(0.1, seconds - (time.monotonic() - t0))))
                log(f"  chaos {time.monotonic() - t0:5.1f}s: {sum(sum(p.acked.values()) for p in prods)} acked, "
                    f"{len(report.faults)} faults, {report.retries} retries")
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
            cluster.start(timeout=90)
            _verify(client, cluster, "chaos", prods, queues, report)
    finally:
        cluster.stop()
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos_harness", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rmq-chaos-") as tmp:
        rep = run_chaos(a.data_dir or tmp, a.seconds, a.producers, seed=a.seed)
    print(rep.summary())
    if a.json:
        print(json.dumps({**rep.__dict__, "ok": rep.ok}, indent=2))
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
