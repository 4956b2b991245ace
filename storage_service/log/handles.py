"""A node's budget of open segment files: idle queues hold none.

Every queue used to keep its active segment's three files (``.log``, ``.idx``,
``.tix``) open for appends, and every segment it had served a read from open
for reads, for as long as the node ran: three descriptors or more per queue on
every node. Around 6,600 queues used up a node's 20,000 descriptors; the next
``dup`` failed with EMFILE, which the segment-sync thread took for a disk
error, and every node stopped at once (issue 19).

``OpenFiles`` counts the descriptors a node's queue logs hold. Past its limit
it closes the files of the queues used least recently (each syncs what it
wrote first); their next append or read opens them again. A queue whose lock
is held at that moment is passed over, so no thread ever waits on another
queue's lock here. ``open_files_limit`` picks the limit from the process's
descriptor limit (raised to its hard limit first), leaving room for sockets.
"""
from __future__ import annotations

import logging
import resource
import threading
from typing import Protocol

__all__ = ["FileHolder", "OpenFiles", "open_files_limit"]

log = logging.getLogger(__name__)

EVICT_TO = 0.8        # past the limit, close files down to this share of it


class FileHolder(Protocol):
    last_use: float

    def release_files(self, clean_only: bool = False) -> bool: ...


class OpenFiles:
    def __init__(self, limit: int):
        if limit < 8:
            raise ValueError(f"open files limit {limit}: at least 8")
        self.limit = limit
        self._lock = threading.Lock()
        self._evicting = threading.Lock()
        self._held: dict[FileHolder, int] = {}
        self.count = 0
        self.evictions = 0      # queues whose files were closed to stay under the limit

    def changed(self, holder: FileHolder, held: int) -> None:
        """``holder`` holds ``held`` descriptors now (call after opening or closing)."""
        with self._lock:
            self.count += held - self._held.get(holder, 0)
            if held:
                self._held[holder] = held
            else:
                self._held.pop(holder, None)
            over = self.count > self.limit
        if over:
            self._evict(keep=holder)

    def _evict(self, keep: FileHolder) -> None:
        if not self._evicting.acquire(blocking=False):
            return                          # another thread is at it
        try:
            with self._lock:
                holders = sorted((h for h in self._held if h is not keep), key=lambda h: h.last_use)
            target = int(self.limit * EVICT_TO)
            # Clean ones first: a holder with unsynced writes syncs them before it closes, on
            # the thread that opened a file (the raft thread, in apply). Thousands of fresh
            # queues written within one background sync round made an eviction seconds of
            # fdatasync there (issue 39.5); the background sync cleans them soon anyway.
            for clean_only in (True, False):
                for h in holders:
                    if self.count <= target:
                        return
                    if h.release_files(clean_only):
                        self.evictions += 1
        finally:
            self._evicting.release()


def open_files_limit(configured: int = 0, share: float = 0.5) -> int:
    """The segment-file budget: ``configured`` if given, else ``share`` of the
    process's descriptor limit after raising its soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:
            log.warning("could not raise the open files limit from %d to %d: %s", soft, hard, e)
    if configured:
        if configured >= soft:
            raise ValueError(f"--max-open-files {configured}: the process may open only {soft} "
                             "files (ulimit -n); give less, leaving room for sockets")
        return configured
    return max(64, int(soft * share))
