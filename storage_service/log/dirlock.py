"""One writer per data directory: an exclusive lock held while the process lives.

Two nodes (or two local clusters) on one data directory would append to the
same segments and journals and destroy both. ``DirectoryLock`` takes
``flock(LOCK_EX | LOCK_NB)`` on ``DIR/LOCK`` and writes its pid and command
line there; the kernel drops the lock when the process ends, however it
ends (``kill -9`` included), so a stale file never blocks a restart. A second
taker fails at once with ``DirectoryInUse`` naming the holder's pid.
"""
from __future__ import annotations

import fcntl
import os
import sys

import grpc

from ..protocol.errors import StorageError

__all__ = ["DirectoryInUse", "DirectoryLock"]

LOCK_FILE = "LOCK"


class DirectoryInUse(StorageError):
    """Another live process holds the data directory."""

    def __init__(self, path: str, holder: str):
        super().__init__(f"data directory {path} is in use by {holder}: stop that process first, "
                         "or use another data directory", grpc.StatusCode.FAILED_PRECONDITION)
        self.path = path
        self.holder = holder


class DirectoryLock:
    """``with DirectoryLock(path):`` or ``acquire()``/``release()``."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self._fd: int | None = None

    def acquire(self) -> "DirectoryLock":
        """Take the lock (a no-op while this object holds it); DirectoryInUse if another does."""
        if self._fd is not None:
            return self
        os.makedirs(self.path, exist_ok=True)
        fd = os.open(os.path.join(self.path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            os.close(fd)
            pid, _, cmd = holder.partition(" ")
            raise DirectoryInUse(self.path, f"pid {pid} ({cmd})" if pid else "another process") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {' '.join(sys.argv)}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)           # closing the only descriptor drops the flock
            self._fd = None

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
