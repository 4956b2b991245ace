"""CPU seconds per thread role of a node, read from /proc when scraped.

A node is one process with a thread per role: the raft loop and its journal
syncer, a produce-port reader and answerer per client connection, the gRPC
pool, the segment syncer, the placement controller. The process's CPU
(``rmq_process_cpu_seconds_total``) says how busy the node is; this says which
role it went to (``rmq_thread_cpu_seconds_total{thread="raft-node"}``), the
first question when a node's cost per message moves (``bench/scale.py``
prints it for each run). Threads of one role are summed: a thread's name with
its numbers taken out (``raft-node-3-sync`` -> ``raft-node-sync``,
``ThreadPoolExecutor-0_7`` -> ``ThreadPoolExecutor``).

A thread's CPU is read from ``/proc/self/task/<id>/stat`` (user + system). A
thread that ends on its own (a client connection's reader and answerer) says
what it used as it ends (``note_thread_exit``); any other thread that ended
keeps what the scrape before its end saw (the counter never goes down; what
it used after that scrape is not counted). Off Linux, nothing is reported.
"""
from __future__ import annotations

import os
import re
import threading
import time

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

__all__ = ["ThreadCpu", "note_thread_exit", "role_of", "thread_cpu_seconds"]

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_NUMBERS = re.compile(r"[-_]\d+")


def role_of(name: str) -> str:
    """A thread's role: its name without the numbers that tell its instances apart."""
    return _NUMBERS.sub("", name).strip() or "thread"


def thread_cpu_seconds(native_id: int) -> float | None:
    """User + system CPU seconds of one thread of this process; None if it is gone."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _HZ


_exits_lock = threading.Lock()
_exited: dict[str, float] = {}      # role -> CPU s of its threads that said so as they ended
_noted: set[int] = set()            # their native ids, until a scrape saw them gone


def note_thread_exit() -> None:
    """Count the calling thread's CPU for its role as it ends (call it last thing)."""
    t = threading.current_thread()
    role, cpu = role_of(t.name), time.thread_time()
    with _exits_lock:
        _exited[role] = _exited.get(role, 0.0) + cpu
        if t.native_id is not None:
            _noted.add(t.native_id)


class ThreadCpu(Collector):
    """``rmq_thread_cpu_seconds_total`` by thread role (see the module docstring)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._seen: dict[int, tuple[str, float]] = {}    # native id -> (role, CPU s at the last scrape)
        self._ended: dict[str, float] = {}               # role -> CPU s of its threads that ended

    def totals(self) -> dict[str, float]:
        """Role -> CPU seconds of its threads, live and ended, since the node started."""
        live: dict[int, tuple[str, float]] = {}
        for t in threading.enumerate():
            tid = t.native_id
            if tid is None:
                continue
            cpu = thread_cpu_seconds(tid)
            if cpu is not None:
                live[tid] = (role_of(t.name), cpu)
        with self._lock, _exits_lock:
            for tid, (role, cpu) in self._seen.items():
                if tid not in live and tid not in _noted:        # ended without saying so
                    self._ended[role] = self._ended.get(role, 0.0) + cpu
            _noted.difference_update(t for t in list(_noted) if t not in live)
            live = {t: v for t, v in live.items() if t not in _noted}   # (ending: counted already)
            self._seen = live
            out = dict(self._ended)
            for role, cpu in _exited.items():
                out[role] = out.get(role, 0.0) + cpu
        for role, cpu in live.values():
            out[role] = out.get(role, 0.0) + cpu
        return out

    def collect(self):
        fam = CounterMetricFamily("rmq_thread_cpu_seconds", "CPU seconds (user + system) the node's "
                                  "threads of one role used since it started", labels=["thread"])
        if os.path.isdir("/proc/self/task"):
            for role, cpu in sorted(self.totals().items()):
                fam.add_metric([role], cpu)
        yield fam
