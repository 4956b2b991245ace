"""What the chaos and partition harnesses share: idempotent producers and the verifier.

A ``Producer`` appends numbered messages ``p<pid>:<queue>:<n>`` with a fixed
producer id and sequence, and retries a failed batch with the same id/sequence
until it is acknowledged (odd pids through ``produce_batches``, the produce
port; even pids through ``produce`` over gRPC). ``verify`` then reads every
queue from every replica of its group (once replica moves are done): every acknowledged message present exactly once, in
each producer's order, offsets contiguous, replicas identical.
"""
from __future__ import annotations

import argparse
import random
import threading
import time
from dataclasses import dataclass

from storage_service.local import LocalCluster

__all__ = ["Verdict", "Producer", "Acks", "AckingProducer", "verify", "leader_index", "harness_parser", "replicas_of_queues", "run_for",
           "settle"]


@dataclass
class Verdict:
    """What ``verify`` found, and how hard the producers had to try."""
    acked: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    replica_mismatches: int = 0
    offset_gaps: int = 0
    produce_calls: int = 0
    retries: int = 0
    # the key-value counter (tests/kv_workload.py), where the run had one
    kv_ops: int = 0
    kv_increments: int = 0
    kv_unknown: int = 0
    kv_final: int = 0
    kv_lost: int = 0
    kv_nonlinearizable: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.reordered or self.replica_mismatches
                    or self.offset_gaps or self.kv_lost or self.kv_nonlinearizable)

    def counts(self) -> str:
        kv = (f" kv_ops={self.kv_ops} kv_increments={self.kv_increments} kv_unknown={self.kv_unknown} "
              f"kv_final={self.kv_final} kv_lost={self.kv_lost} kv_nonlinearizable={self.kv_nonlinearizable}"
              if self.kv_ops else "")
        return (f"acked={self.acked} lost={self.lost} duplicated={self.duplicated} "
                f"reordered={self.reordered} replica_mismatches={self.replica_mismatches} "
                f"offset_gaps={self.offset_gaps}" + kv)


def harness_parser(prog: str, doc: str | None, seconds_help: str = "") -> argparse.ArgumentParser:
    """The options every harness program takes: --seconds, --seed, --data-dir, --json."""
    ap = argparse.ArgumentParser(prog=prog, description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60, help=seconds_help or None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", action="store_true")
    return ap


class Producer(threading.Thread):
    def __init__(self, client, topic: str, pid: int, queues: list[int], stop: threading.Event,
                 report: Verdict, lock: threading.Lock):
        super().__init__(daemon=True, name=f"producer-{pid}")
        self.client, self.topic, self.pid, self.queues = client, topic, pid, queues
        self.stop_event, self.report, self.lock = stop, report, lock
        self.acked: dict[int, int] = {q: 0 for q in queues}     # queue -> messages acked

    def on_ack(self, queue: int, result) -> None:
        """Called with each acknowledged batch's ``ProduceResult``; for subclasses."""

    def run(self) -> None:
        rng = random.Random(self.pid)
        while not self.stop_event.is_set():
            q = rng.choice(self.queues)
            start, n = self.acked[q], rng.randint(1, 20)
            values = [f"p{self.pid}:{q}:{start + i}".encode() for i in range(n)]
            result = self._send(q, start, values)
            if result is None:
                return          # stopped with this batch unacknowledged: it may or may not exist
            self.acked[q] += n
            self.on_ack(q, result)

    def _send(self, q: int, seq: int, values: list[bytes]):
        while True:
            try:
                with self.lock:
                    self.report.produce_calls += 1
                if self.pid % 2:   # ProduceBatches: the produce port, calls of all such producers shared
                    return self.client.produce_batches(
                        [(self.topic, q, values, f"producer-{self.pid}", seq)], timeout=10)[0]
                return self.client.produce(self.topic, values, queue=q, producer_id=f"producer-{self.pid}",
                                           sequence=seq, timeout=10)[0]
            except Exception:
                with self.lock:
                    self.report.retries += 1
                if self.stop_event.wait(0.05):
                    return None


class Acks:
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


class AckingProducer(Producer):
    def __init__(self, *args, acks: Acks, group: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.acks, self.group = acks, group

    def on_ack(self, queue: int, result) -> None:
        self.acks.record(queue, self.group, result)


def run_for(seconds: float, producers: list[Producer], log, progress) -> None:
    """Let the run go on for ``seconds``, logging every 5 s ``<what> <elapsed>s: <N> acked, <progress()>``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(min(5.0, max(0.1, seconds - (time.monotonic() - t0))))
        log(f"  {time.monotonic() - t0:5.1f}s: {sum(sum(p.acked.values()) for p in producers)} acked, "
            f"{progress()}")


def leader_index(client, cluster: LocalCluster, group: int) -> int | None:
    """The node that a node's cluster status names leader of ``group``, if any."""
    try:
        st = client.cluster_status()
    except Exception:
        return None
    for n in st["nodes"]:
        for g in n["groups"]:
            if g["group"] == group and g["leader"] in cluster.addresses:
                return cluster.addresses.index(g["leader"])
    return None


def _read_queue(client, topic: str, q: int, address: str) -> list[tuple[int, bytes]]:
    out, off = [], 0
    while True:
        res = client.fetch(topic, q, off, max_bytes=4 << 20, from_follower=True, address=address)
        if not res.records:
            return out
        out += [(r.offset, r.value) for r in res.records]
        off = res.next_offset


def replicas_of_queues(client, cluster: LocalCluster, topic: str, queues: int) -> dict[int, list[str]]:
    """queue -> the nodes holding its replicas (the recorded placement; every node of
    a cluster that records none)."""
    placement = client.cluster_status().get("placement") or {}
    return {q: placement.get(client.group_of(topic, q)) or list(cluster.addresses) for q in range(queues)}


def settle(client, timeout: float = 120) -> None:
    """Wait until no data group is moving (its voters are the recorded replicas)."""
    from rmq_spark.cli._status import moving_groups
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not moving_groups(client.cluster_status()):
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise AssertionError(f"data groups still moving after {timeout}s")


def _wait_converged(client, where: dict[int, list[str]], topic: str, timeout: float = 60) -> None:
    def converged():
        ends = {(a, q): client.call("Offsets", _offsets_req(topic), address=a).queues[q].latest
                for q, nodes in where.items() for a in nodes}
        return all(len({ends[(a, q)] for a in nodes}) == 1 for q, nodes in where.items())
    deadline = time.monotonic() + timeout
    while not converged() and time.monotonic() < deadline:
        time.sleep(0.2)


def verify(client, cluster: LocalCluster, topic: str, producers: list[Producer],
           queues: int, report: Verdict) -> None:
    """Wait until replica moves are done and (up to 60 s) the replicas agree on every
    queue's end, then count into ``report``."""
    settle(client)
    where = replicas_of_queues(client, cluster, topic, queues)
    _wait_converged(client, where, topic)
    for q in range(queues):
        replicas = [_read_queue(client, topic, q, a) for a in where[q]]
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
