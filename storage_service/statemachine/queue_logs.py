"""A data group's queue logs, opened when first used (issue 39: many queues).

Opening a queue reads its directory and recovers its last segment's tail:
~250 us and four file opens on the test VM, so a node holding 100,000 queues
spent about 25 s per group opening them before it could serve. ``QueueLogs``
knows the queues found on disk at start but opens one only when it is used
(a produce, a fetch, a retention or compaction pass that reaches it, a
snapshot install that must check it) or when ``open_some`` gets to it: the
node opens the rest in the background after it serves (``StorageNode``,
"opening queues N/M" in its log and ``Health``).

Mapping reads (``get``, ``[]``, ``in``, ``pop``) see every queue and open it;
iteration (``items``, ``values``, ``keys``, ``len``) sees the open ones, which
is what a sync, a retention pass or a scrub needs: a queue not opened since
start has nothing unsynced and is reached once opened.
"""
from __future__ import annotations

import threading
from typing import Callable, Iterable

from ..log.queue_log import QueueLog

__all__ = ["QueueLogs"]


class QueueLogs(dict):
    """name -> QueueLog; names on disk at start are opened on first use (module doc)."""

    def __init__(self, opener: Callable[[str], QueueLog], closed: Iterable[str] = ()):
        super().__init__()
        self._opener = opener
        self._closed = set(closed)
        self._order = sorted(self._closed)        # open_some's way through them
        self.opened_behind = 0                    # by open_some
        self._lock = threading.Lock()
        self.on_open: Callable[[str, QueueLog], None] | None = None    # e.g. a damage check

    def _open(self, name: str) -> QueueLog | None:
        with self._lock:
            q = dict.get(self, name)
            if q is not None or name not in self._closed:
                return q
            q = self._opener(name)
            dict.__setitem__(self, name, q)
            self._closed.discard(name)
        if self.on_open is not None:
            self.on_open(name, q)
        return q

    # ``_open`` puts a queue in the dict before it leaves ``_closed``: so ``_closed`` is
    # looked at first, and a queue another thread is opening is seen in one or the other.
    def get(self, name, default=None):
        q = self._open(name) if name in self._closed else dict.get(self, name)
        return default if q is None else q

    def __getitem__(self, name) -> QueueLog:
        q = self.get(name)
        if q is None:
            raise KeyError(name)
        return q

    def __contains__(self, name) -> bool:
        return name in self._closed or dict.__contains__(self, name)

    def pop(self, name, *default):
        self.get(name)
        return dict.pop(self, name, *default)

    def closed_names(self) -> set[str]:
        """Queues on disk not opened yet (a copy)."""
        with self._lock:
            return set(self._closed)

    def total(self) -> int:
        """Every queue, open or not."""
        return dict.__len__(self) + len(self._closed)

    def open_some(self, n: int) -> int:
        """Open up to ``n`` queues not opened yet; how many are still closed."""
        while n > 0 and self._order:
            name = self._order.pop()
            if name in self._closed:
                self._open(name)
                self.opened_behind += 1
                n -= 1
        return len(self._closed)
