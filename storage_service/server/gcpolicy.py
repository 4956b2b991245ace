"""The node process's cyclic garbage collector: fewer, shorter pauses (issue 39.6).

Python's collector stops the whole process (it holds the GIL) while it walks
the objects of the generations it collects. A node's young objects are not
all garbage soon: every long-polling fetch holds a coroutine chain, futures,
a context and a timer for its whole wait (seconds), ~20 tracked objects each.
With 2,000 consumers polling, a node carried 40,000-50,000 such objects in its
young generations; with CPython's default thresholds (700, 10, 10) it walked
them in a generation-1 collection about once a second (12-24 ms of CPU each,
measured with ``gc.callbacks``) and in a full collection every ~10 s (60-105
ms, with the ~50,000 objects of its startup). A produce arriving meanwhile
waited: that was the slow tail of ``bench/many_clients.py``.

Two changes, for the node process only (``rmq-storage node``; a process that
embeds a node, Spark's or a test's, keeps its own settings):

* ``tune_collector`` at start: a generation-1 collection every 200 young
  collections instead of 10. A waiting fetch's objects, promoted once, now
  mostly end their wait (and are freed by their reference counts) before a
  generation-1 collection would walk them. Young collections stay as often as
  before, so garbage in cycles made and dropped by a request is still found
  within a few hundred allocations; cycles that outlive a young collection
  wait for the next generation-1 one (seconds under load, longer when idle).
* ``freeze_startup`` once the node serves: what startup built (modules,
  classes, the groups' state) moves to the permanent generation, where no
  collection walks it again (``gc.freeze``). The price: a structure built at
  startup that is dropped later while it holds a reference cycle (a group's
  state after its replica moved away) is never freed, at most what startup
  built, once.

Measured (``bench/many_clients.py --pollers 2000 --seconds 60``, 2-core VM,
``bench/RESULTS.md``): no node pause over 5 ms but young collections (max
4 ms); produce p99 21.9 / 22.6 ms against 44.9 / 47.5 ms without.
"""
from __future__ import annotations

import gc
import logging
import time

__all__ = ["THRESHOLDS", "freeze_startup", "tune_collector"]

log = logging.getLogger(__name__)
THRESHOLDS = (700, 200, 10)     # (young allocations, young collections per gen-1, gen-1 per full)


def tune_collector() -> None:
    """This process's collector thresholds (``THRESHOLDS``)."""
    gc.set_threshold(*THRESHOLDS)


def freeze_startup() -> int:
    """Collect what startup left as garbage, then freeze every object left (never
    walked again by a collection); returns how many were frozen."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("garbage collector: %d objects of the node's startup frozen (%.0f ms)", frozen,
             (time.perf_counter() - t0) * 1000)
    return frozen
