"""A node's disk running out: told apart from disk failure, and answered without stopping.

A write that fails for want of space or descriptors (ENOSPC, EDQUOT, EMFILE,
ENFILE) is a shortage, not a broken disk: nothing reached the file that is
kept (the writer cuts its partial write back), and the same write succeeds
once space is freed. ``Shortage`` carries it up; the node then

* refuses produce while its data directory has less than ``reserve`` bytes
  free (RESOURCE_EXHAUSTED naming the node, the path and the figures; the
  client retries, and the groups this node leads move to a replica with
  room: ``cluster/upkeep.py``);
* as a follower, takes no new entries into its journal (they would need
  the same space again in the segments when applied) and so acknowledges
  none: the other replicas keep the group available;
* retries the apply of an entry that met a shortage on the next tick,
  without advancing past it (``raft/group.py``).

A failed ``fdatasync`` still stops the node (``durability.fatal``): after it
the kernel may have dropped pages that were written, whatever the errno.
"""
from __future__ import annotations

import errno
import os
import threading
import time

__all__ = ["DiskSpace", "LOOKUP_EVERY", "Shortage", "SHORTAGE_ERRNOS", "is_shortage"]

SHORTAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE})
LOOKUP_EVERY = 0.1      # seconds a free-space lookup is reused (a statvfs per produce otherwise)


def is_shortage(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in SHORTAGE_ERRNOS


class Shortage(OSError):
    """A write refused for want of space or descriptors; nothing partial was kept."""


class DiskSpace:
    """Free space of a node's data directory, looked up at most every ``every`` s."""

    def __init__(self, path: str, reserve: int, every: float = LOOKUP_EVERY):
        self.path, self.reserve, self.every = path, reserve, every
        self._free, self._at = None, 0.0
        self._lock = threading.Lock()
        self.short_since: float | None = None     # monotonic time of the last shortage met

    def free(self) -> int:
        now = time.monotonic()
        with self._lock:
            if self._free is None or now - self._at >= self.every:
                st = os.statvfs(self.path)
                self._free, self._at = st.f_bavail * st.f_frsize, now
            return self._free

    def low(self) -> bool:
        """Below the reserve: take no new data."""
        return self.reserve > 0 and self.free() < self.reserve

    def met_shortage(self) -> None:
        self.short_since = time.monotonic()
        with self._lock:
            self._free = None           # look again next time

    def shortfall(self) -> str:
        return (f"data directory {self.path} has {self.free():,} bytes free, below its reserve "
                f"of {self.reserve:,} (--min-free-bytes)")

    def describe(self, node: str) -> str:
        return f"node {node}: {self.shortfall()}; produce is refused here until space is freed"
