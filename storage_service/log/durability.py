"""The disk rules every writer of the node follows: what is synced, and what a failed sync means.

* A failed ``fdatasync`` (journal or segment) is never retried: Linux reports
  a lost write-back to one fsync only, and a retry would succeed over pages
  that never reached the disk. ``fatal`` stops the node; a restart recovers
  from the files and from the peers, as after a crash.
* A file created, renamed or removed is durable once its directory is synced
  (``fsync_dir``).
* Synced ranges of append-only files leave the page cache (``drop_pages``).
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
from contextlib import contextmanager

__all__ = ["Damaged", "DirSyncs", "HAS_SYNCFS", "drop_pages", "fatal", "fsync_dir", "syncfs"]

log = logging.getLogger(__name__)


class Damaged(Exception):
    """This replica's copy of ``queue`` failed its check where a decision needed it (a
    key-value condition reads the key index, built from the log). Nothing was
    changed; the copy is being repaired from a peer (``cluster/repair.py``). In
    apply, the raft group applies the entry again on a later tick, as after a
    ``diskspace.Shortage``; a read answers UNAVAILABLE (retry)."""

    def __init__(self, queue: str, why: str):
        super().__init__(f"queue {queue}: this replica's copy is damaged ({why}); it is being repaired from a peer")
        self.queue = queue


def fatal(why: str) -> None:
    """Stop the node process at once: a failed fdatasync cannot be retried."""
    log.critical("%s: stopping this node", why)
    logging.shutdown()
    os._exit(70)


def fsync_dir(path: str) -> None:
    """Make the entries of a directory (files created, renamed, removed) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_syncfs = getattr(_libc, "syncfs", None)      # Linux (glibc 2.14+)


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        got = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    except (AttributeError, ValueError):
        return False
    return got >= (major, minor)


# syncfs reports write-back errors since Linux 5.8; before, it returned 0 over lost pages.
HAS_SYNCFS = _syncfs is not None and _kernel_at_least(5, 8)


def syncfs(fd: int) -> None:
    """Sync the whole file system that holds the open ``fd``: every file's written data
    and every directory entry made, in one journal commit (Linux ``syncfs``; only where
    ``HAS_SYNCFS``). Keep ``fd`` open for the life of the writer: a write-back error is
    reported once per descriptor, to the first ``syncfs`` on it after the error, so a
    descriptor opened for each call could miss one another caller saw first.

    For a round with many files written, where one ``fdatasync`` each is one journal
    commit each: a first produce to thousands of fresh queues wrote more new files a
    second than their syncs kept up with (issue 39.5)."""
    if _syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class DirSyncs:
    """Directories with new entries not synced yet, synced together later.

    A new queue is a directory in the group's data directory and three files
    in it: two directory syncs each, ~1 ms on the test VM, which held the first
    produce to fresh queues to 300-500 queues/s (issue 39). Its entries are in
    the raft journal until a snapshot covers them, and the snapshot is taken
    after ``DataState.sync`` runs ``sync()`` here: until then a power loss
    replays them and the directory is created again. So the data state
    collects the directories and syncs each once per round (its background
    sync, or the snapshot's), one sync of the parent for every queue created
    meanwhile.
    """

    def __init__(self):
        self._pending: set[str] = set()
        self._lock = threading.Lock()       # held through the syncs: a caller that finds
        #                                     nothing pending knows earlier syncs are done

    def add(self, *paths: str) -> None:
        self._pending.update(paths)

    def __len__(self) -> int:
        return len(self._pending)

    @contextmanager
    def covered(self):
        """For a sync of the whole file system (``syncfs``), made inside this block: the
        directories pending now count as synced by it; they go back if it raises."""
        with self._lock:
            taken, self._pending = self._pending, set()
            try:
                yield
            except BaseException:
                self._pending |= taken
                raise

    def sync(self) -> None:
        """Sync every pending directory; an OSError is the caller's (``fatal``)."""
        with self._lock:
            while self._pending:
                path = self._pending.pop()
                try:
                    fsync_dir(path)
                except FileNotFoundError:
                    pass                        # removed since (a dropped queue): nothing to keep
                except BaseException:
                    self._pending.add(path)
                    raise


def drop_pages(fd: int, start: int, length: int) -> None:
    """Let the kernel drop a synced range of a file from the page cache
    (``length`` 0: to the end). Clean pages only: never loses data.

    Why (``QueueLog``): an append-only log touches new page-cache memory with
    every byte it writes. On this project's VMs (Firecracker, free page
    reporting) memory the guest has not used recently is backed by the host
    on first touch: a write into it cost 1.5-3 CPU s/GB against 0.3 s/GB
    into pages freed a moment before (``bench/README.md``). Dropping what is
    synced keeps a node's page cache from growing with the data written, so
    the kernel reuses those pages for the next appends.
    """
    if hasattr(os, "posix_fadvise"):      # Linux; elsewhere the cache just grows
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)
