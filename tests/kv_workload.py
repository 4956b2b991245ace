"""The key-value workload of the partition and chaos harnesses (issue 40): compare-and-set
increments of one counter from several clients, each call recorded for the
linearizability checker (``tests/linearizable.py``).

Each worker reads the counter (a leader read), then writes ``count + 1`` with
``if_revision`` set to the revision it read; a ``KvConflict`` means another
worker got there first. Every value written is unique (``count:worker:n``), so a
condition on a revision is one on the value read with it, which is what the
single-register model checks. A call that failed without an answer (a timeout,
no leader within the client's deadline) has an unknown outcome: the checker
lets it take effect at any point after its call, or never.

The verdict, after the faults healed and one last read:
- ``kv_lost``: the final count is below the increments acknowledged (an
  acknowledged update is gone) or above them plus the unknown ones (a write
  took effect twice);
- ``kv_nonlinearizable``: 1 if no order of the calls explains every answer
  (a stale read, two compare-and-sets won from one revision, a refused one
  that should have won).
"""
from __future__ import annotations

import threading
import time

from .linearizable import Op, linearizable

__all__ = ["KvCounter"]

INITIAL = b"0:init"


def _count(value: bytes | None) -> int:
    return int(value.split(b":", 1)[0]) if value else 0


class KvCounter:
    """``workers`` threads incrementing ``key`` of the compact topic ``topic`` until
    ``stop``; ``client_factory()`` gives each worker its own client (a call stuck on a
    cut node must not hold the others)."""

    def __init__(self, client_factory, topic: str, stop: threading.Event, workers: int = 3,
                 key: str = "counter", pause: float = 0.0):
        self.client_factory, self.topic, self.key, self.stop, self.pause = client_factory, topic, key, stop, pause
        self.history: list[Op] = []
        self.increments = 0             # compare-and-sets acknowledged
        self.unknown = 0                # compare-and-sets with no answer
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._work, args=(w,), name=f"kv-counter-{w}", daemon=True)
                         for w in range(workers)]

    def start(self, client) -> None:
        """Write the first value (before any worker starts), then start the workers."""
        t0 = time.monotonic()
        client.kv_put(self.topic, self.key, INITIAL)
        self.history.append(Op(-1, "write", INITIAL, True, t0, time.monotonic()))
        for t in self._threads:
            t.start()

    def join(self, timeout: float = 60.0) -> None:
        for t in self._threads:
            t.join(timeout=timeout)

    def _record(self, op: Op) -> None:
        with self._lock:
            self.history.append(op)

    def _work(self, w: int) -> None:
        from rmq_spark.client import KvConflict, RmqError
        n = 0
        with self.client_factory() as c:
            while not self.stop.is_set():
                t0 = time.monotonic()
                try:
                    cur = c.kv_get(self.topic, self.key)
                except RmqError:
                    continue                # a failed read changes nothing: left out of the history
                seen = cur.value if cur else None
                self._record(Op(w, "read", None, seen, t0, time.monotonic()))
                n += 1
                new = b"%d:%d:%d" % (_count(seen) + 1, w, n)
                t0 = time.monotonic()
                try:
                    if cur is None:
                        c.kv_put(self.topic, self.key, new, if_absent=True)
                    else:
                        c.kv_put(self.topic, self.key, new, if_revision=cur.revision)
                    won = True
                except KvConflict:
                    won = False
                except RmqError as e:
                    self._record(Op(w, "cas", (seen, new), None, t0, None))
                    with self._lock:
                        self.unknown += 1
                        self.errors.append(f"{type(e).__name__}: {e}"[:200])
                    continue
                self._record(Op(w, "cas", (seen, new), won, t0, time.monotonic()))
                if won:
                    with self._lock:
                        self.increments += 1
                if self.pause:
                    self.stop.wait(self.pause)

    def judge(self, client, report) -> None:
        """After the workers stopped and the cluster healed: one last read, then the
        count and the checker; fills ``report``'s kv fields (``workload.Verdict``)."""
        self.join()
        t0 = time.monotonic()
        last = client.kv_get(self.topic, self.key)
        self.history.append(Op(-2, "read", None, last.value if last else None, t0, time.monotonic()))
        final = _count(last.value if last else None)
        report.kv_ops = len(self.history)
        report.kv_increments = self.increments
        report.kv_unknown = self.unknown
        report.kv_final = final
        report.kv_lost = int(not self.increments <= final <= self.increments + self.unknown)
        report.kv_nonlinearizable = int(not linearizable(self.history))
