"""The node process's cyclic garbage collector: fewer long pauses (issue 39.6).

Python's collector stops the whole process (it holds the GIL) while it walks
the objects of the generations it collects. A node's young objects are not
all garbage soon: every long-polling fetch holds a coroutine chain, futures,
a context and a timer for its whole wait (seconds), ~20 tracked objects each.
With 2,000 consumers polling, a node carried 40,000-50,000 such objects in its
young generations; with CPython's default thresholds (700, 10, 10) it walked
them in a generation-1 collection about once a second (12-24 ms of CPU each,
measured with ``gc.callbacks``) and in a full collection every ~10-20 s
(60-105 ms). A produce arriving meanwhile waited: that was the slow tail of
``bench/many_clients.py``.

``tune_collector`` (``rmq-storage node`` only: a process that embeds a node
keeps its own settings) makes generation-1 collections 20 times rarer: every
200 young collections instead of 10. A waiting fetch's objects, promoted once,
now mostly end their wait (and are freed by their reference counts) before a
generation-1 collection would walk them, and full collections (every 10 of
those) are as much rarer. Young collections stay as often as before, so a
reference cycle made and dropped by one request is still found within a few
hundred allocations; a cycle that outlives a young collection waits for the
next generation-1 one: seconds to minutes under load, longer when idle. The
node's own resources never wait for it (files and sockets are closed
explicitly; an HTTP connection slot comes back by a timer, ``http/server.py``).

Measured (``bench/RESULTS.md``, many waiting consumers): over 60 s no node
paused more than 5 ms but young collections (at most 4 ms); the 2,000-poller
row's produce p99 fell in 12 of 12 alternating pairs, median 29 against 42 ms.

CPython 3.14's collector is incremental: its thresholds mean something else,
and this leaves them alone there.
"""
from __future__ import annotations

import gc
import logging
import sys

__all__ = ["THRESHOLDS", "tune_collector"]

log = logging.getLogger(__name__)
THRESHOLDS = (700, 200, 10)     # (young allocations, young collections per gen-1, gen-1 per full)


def tune_collector() -> tuple[int, ...]:
    """Set this process's collector thresholds (``THRESHOLDS``) where the collector is
    generational (CPython before 3.14); returns the thresholds in force."""
    if sys.version_info < (3, 14):
        gc.set_threshold(*THRESHOLDS)
    got = gc.get_threshold()
    log.info("garbage collector thresholds %s", got)
    return got
