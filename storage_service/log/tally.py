"""What a group's background passes would otherwise find by visiting every queue.

At 100,000 queues, passes over all of a group's queues became a node's work
of its own (issue 39.5, py-spy on a node during the first produce to fresh
queues): the background sync looked at every open queue four times a
second to find the few written since, and every status call (the
controller asks each node once a second) summed every queue's segment
sizes. A pass over a million queues takes about a second of a core. So the
queues tell their owner instead:

* ``Unsynced``: the queues with appends the background sync has not synced
  (``QueueLog.append`` adds itself; ``DataState.sync_behind`` takes them).
  A queue missed here is still synced by the full sync a snapshot makes
  (``DataState.sync``): this only keeps the dirty data small between them.
* ``ByteCount``: a group's segment bytes, changed by each queue as its
  segments change (``QueueLog._resized``), read in O(1) by the node's status.
"""
from __future__ import annotations

import threading

__all__ = ["ByteCount", "Unsynced"]


class Unsynced:
    def __init__(self):
        self._queues: set = set()
        self._lock = threading.Lock()

    def add(self, queue) -> None:
        with self._lock:
            self._queues.add(queue)

    def take(self) -> list:
        """The queues added since the last take (each once), and forget them."""
        with self._lock:
            queues, self._queues = self._queues, set()
        return list(queues)

    def __len__(self) -> int:
        return len(self._queues)


class ByteCount:
    def __init__(self):
        self.total = 0
        self._lock = threading.Lock()

    def add(self, delta: int) -> None:
        with self._lock:
            self.total += delta
