"""Group commit: concurrent produce calls for one raft group share raft entries.

Callers ``submit`` a batch item and wait on the returned future. One thread
per group takes a free in-flight slot, then drains everything queued (up to
``max_entry_bytes``) into a single raft command. While the slots are busy,
new calls pile up and go out together, so throughput does not depend on the
number of raft round trips.
"""
from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future

from pysyncobj import FAIL_REASON

__all__ = ["GroupCommitter", "CommitFailed"]

log = logging.getLogger(__name__)
_FAIL_NAMES = {v: k for k, v in vars(FAIL_REASON).items() if k.isupper()}


class CommitFailed(Exception):
    def __init__(self, reason: int):
        super().__init__(f"raft did not commit the entry: {_FAIL_NAMES.get(reason, reason)}")
        self.reason = reason


class GroupCommitter:
    def __init__(self, raft, max_entry_bytes: int = 32 << 20, max_in_flight: int = 2,
                 slot_timeout: float = 5.0):
        self.raft = raft
        self.max_entry_bytes = max_entry_bytes
        self.slot_timeout = slot_timeout
        self._queue: queue.Queue = queue.Queue()
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._running = True
        self._thread = threading.Thread(target=self._loop, name=f"commit-{raft.group_id}", daemon=True)
        self._thread.start()

    def submit(self, item: tuple, size: int) -> Future:
        fut: Future = Future()
        self._queue.put((item, size, fut))
        return fut

    def _loop(self) -> None:
        while self._running:
            acquired = self._slots.acquire(timeout=self.slot_timeout)
            first = self._queue.get()
            if first is None:
                break
            batch, total = [first], first[1]
            while total < self.max_entry_bytes:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._running = False
                    break
                batch.append(nxt)
                total += nxt[1]
            self._propose(batch, acquired)

    def _propose(self, batch, acquired: bool) -> None:
        futures = [f for _, _, f in batch]

        def done(result, error):
            if acquired:
                self._slots.release()
            for i, fut in enumerate(futures):
                if error != FAIL_REASON.SUCCESS:
                    fut.set_exception(CommitFailed(error))
                else:
                    fut.set_result(result[i])

        try:
            self.raft.submit(("produce", [item for item, _, _ in batch]), done)
        except Exception as e:   # never leave a caller hanging
            log.exception("group %d: submit failed", self.raft.group_id)
            if acquired:
                self._slots.release()
            for fut in futures:
                fut.set_exception(e)

    def stop(self) -> None:
        self._running = False
        self._queue.put(None)
        self._thread.join(timeout=5)
