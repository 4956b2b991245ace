"""Group commit: concurrent produce calls for one raft group share raft entries.

Callers ``submit`` a batch item and wait on the returned future. The group's
raft tick thread drains everything queued (up to ``max_entry_bytes`` and
``max_entry_items``) into a single raft command whenever fewer than ``max_in_flight`` of its entries await
commit, right before it appends new commands to its log. While entries are in
flight, new calls pile up and go out together, so throughput does not depend
on the number of raft round trips.

Draining on the tick thread (not on a thread of its own) saves a thread
hand-off per produce call: on a 2-core node every wake-up of another Python
thread costs a GIL hand-over and a context switch.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future
from typing import Callable

import grpc
from pysyncobj import FAIL_REASON

from ..protocol.errors import StorageError

__all__ = ["GroupCommitter", "CommitFailed"]

log = logging.getLogger(__name__)
_FAIL_NAMES = {v: k for k, v in vars(FAIL_REASON).items() if k.isupper()}
# Items (a queue's batch each) in one entry. Every replica applies an entry whole, on the
# node's one raft thread, between the ticks of all its groups; an item that creates its
# queue costs ~0.3 ms there (the directory and its file). One call producing to 10,000
# fresh queues made entries of thousands of items: seconds without a tick, every group
# of the node missing its heartbeats, elections, and the call retried into more of them
# (issue 39.5, the pipelined producer; at 256 a producer to 30,000 fresh queues still
# did). 64 such items hold a tick ~20 ms.
MAX_ENTRY_ITEMS = 64


class CommitFailed(StorageError):
    """Raft dropped the entry (leadership lost, queue full): the node answers not-leader."""
    retriable = True

    def __init__(self, reason: int):
        super().__init__(f"raft did not commit the entry: {_FAIL_NAMES.get(reason, reason)}",
                         grpc.StatusCode.UNAVAILABLE)
        self.reason = reason


class GroupCommitter:
    """Coalesces produce items into raft entries; ``drain`` runs on the raft tick thread."""

    def __init__(self, raft, make_entry: Callable[[list], tuple], max_entry_bytes: int = 32 << 20,
                 max_in_flight: int = 2, slot_timeout: float = 5.0, max_entry_items: int = MAX_ENTRY_ITEMS):
        """``make_entry(items)`` is the replicated command of the items drained together."""
        self.raft = raft
        self.make_entry = make_entry
        self.max_entry_bytes = max_entry_bytes
        self.max_entry_items = max_entry_items
        self.max_in_flight = max_in_flight
        self.slot_timeout = slot_timeout
        self._pending: collections.deque = collections.deque()
        self._waiting = 0                          # bytes in _pending
        self._lock = threading.Lock()
        self._in_flight: dict[int, float] = {}   # entry number -> proposed at (tick thread only)
        self._entries = 0
        self._running = True
        raft.set_committer(self)

    def waiting_bytes(self) -> int:
        """Bytes submitted and not yet proposed (the node bounds it: ``Backlog``)."""
        return self._waiting

    def waiting_items(self) -> int:
        """Items submitted and not yet proposed (the node bounds it too: ``Backlog``)."""
        return len(self._pending)

    def submit(self, item: tuple, size: int) -> Future:
        fut: Future = Future()
        if not self._running:
            fut.set_exception(CommitFailed(FAIL_REASON.REQUEST_DENIED))
            return fut
        with self._lock:
            wake = not self._pending
            self._pending.append((item, size, fut))
            self._waiting += size
        if wake:
            self.raft.wake()
        return fut

    def will_propose(self) -> bool:
        """Whether ``drain`` would propose an entry now (tick thread)."""
        return bool(self._pending) and self._slot_free()

    def _slot_free(self) -> bool:
        if len(self._in_flight) < self.max_in_flight:
            return True
        # A callback that never came (it should not happen) must not stall the group.
        return time.monotonic() - min(self._in_flight.values()) > self.slot_timeout

    def drain(self) -> None:
        """Propose what is queued as one raft entry, if a slot is free (tick thread)."""
        if not self.will_propose():
            return
        batch, total = [], 0
        with self._lock:
            while self._pending and (not batch or (total + self._pending[0][1] <= self.max_entry_bytes
                                                   and len(batch) < self.max_entry_items)):
                entry = self._pending.popleft()
                batch.append(entry)
                total += entry[1]
            self._waiting -= total
        self._entries += 1
        self._propose(self._entries, batch)

    def _propose(self, number: int, batch) -> None:
        futures = [f for _, _, f in batch]
        self._in_flight[number] = time.monotonic()

        def done(result, error):
            self._in_flight.pop(number, None)
            for i, fut in enumerate(futures):
                if error != FAIL_REASON.SUCCESS:
                    fut.set_exception(CommitFailed(error))
                else:
                    fut.set_result(result[i])

        try:
            self.raft.propose(self.make_entry([item for item, _, _ in batch]), done)
        except Exception as e:   # never leave a caller hanging
            log.exception("group %d: propose failed", self.raft.group_id)
            self._in_flight.pop(number, None)
            for fut in futures:
                fut.set_exception(e)

    def stop(self) -> None:
        self._running = False
        with self._lock:
            left, self._pending = list(self._pending), collections.deque()
            self._waiting = 0
        for _, _, fut in left:
            fut.set_exception(CommitFailed(FAIL_REASON.REQUEST_DENIED))
