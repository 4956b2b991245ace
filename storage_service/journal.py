"""A durable raft journal for pysyncobj, with an explicit fsync policy.

pysyncobj's own FileJournal writes through an mmap that is never fsynced, so
an acknowledged entry can vanish with the page cache. This journal implements
the same interface (``pysyncobj.journal.Journal``) over a plain append-only
file of CRC-framed records, and ``sync()`` makes everything appended so far
durable. RaftGroup calls ``sync()`` before a follower acknowledges entries and
before a leader counts its own copy towards a commit.

File layout (``<name>.log``)::

    record = u32 len | u32 crc32c(payload) | payload
    payload = u64 index | u64 term | command bytes

plus ``<name>.meta`` (JSON: currentTerm, votedFor, commitIndex), replaced
atomically. A torn or corrupt tail record is dropped when the file is opened.

fsync policies:
  ``always``  sync per group commit / per acknowledged append (default): an
              acknowledged produce is on disk on a majority of nodes.
  ``none``    never sync: an acknowledged produce is in the page cache of a
              majority; it survives process crashes (kill -9) but not a
              power loss of a majority.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import struct
import threading

import crc32c
from pysyncobj.journal import Journal

from .segment import fsync_dir

__all__ = ["DurableJournal", "FSYNC_POLICIES"]

log = logging.getLogger(__name__)
FSYNC_POLICIES = ("always", "none")
_REC = struct.Struct("<II")
_IDX = struct.Struct("<QQ")
CACHE_BYTES = 32 << 20


class _Entry:
    """A journal entry as pysyncobj sees it, ``(command, index, term)``.

    Only index and term live in memory; the command is read from the file
    (or the recent-entries cache) when pysyncobj looks at ``entry[0]``, so
    the node's memory does not grow with the payloads in the journal.
    """
    __slots__ = ("_journal", "idx", "term")

    def __init__(self, journal: "DurableJournal", idx: int, term: int):
        self._journal, self.idx, self.term = journal, idx, term

    def __getitem__(self, k):
        if isinstance(k, slice):
            return tuple(self)[k]
        k = k + 3 if k < 0 else k
        if k == 0:
            return self._journal.command(self.idx)
        if k == 1:
            return self.idx
        if k == 2:
            return self.term
        raise IndexError(k)

    def __len__(self) -> int:
        return 3

    def __iter__(self):
        return iter((self[0], self.idx, self.term))

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash((self.idx, self.term))

    def __reduce__(self):   # pickled (sent to a follower) as a plain tuple
        return tuple, ((self[0], self.idx, self.term),)

    def __repr__(self) -> str:
        return f"_Entry(idx={self.idx}, term={self.term})"


class DurableJournal(Journal):
    def __init__(self, path: str, fsync: str = "always"):
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy {fsync!r}; allowed: {', '.join(FSYNC_POLICIES)}")
        self.path = path
        self.fsync = fsync == "always"
        self._entries: list[_Entry] = []
        self._ends: list[int] = []   # file position after each entry
        self._cache: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._cache_bytes = 0
        self._bytes = 0
        self._dirty = False
        # Files are replaced, truncated and closed under this lock, and a sync
        # from another thread (``sync_behind``) holds it while it runs.
        self._io = threading.RLock()
        self.truncations = 0       # tail (or all) entries dropped: replies about them are void
        self._meta = self._load_meta()
        self._stored_commit = self._meta.get("commitIndex")
        self._load()
        self._f = open(path + ".log", "ab")
        self._rfd = os.open(path + ".log", os.O_RDONLY)
        # After a kill -9 the unsynced tail is still in the page cache and reads
        # back like the rest: sync it before any of it counts as durable.
        if self.fsync:
            os.fsync(self._f.fileno())
            fsync_dir(os.path.dirname(os.path.abspath(path)))
        self.durable_idx = self._entries[-1].idx if self._entries else 0

    # -------------------------------------------------------------- persistence
    def _load_meta(self) -> dict:
        try:
            with open(self.path + ".meta") as f:
                return json.load(f)
        except FileNotFoundError:
            return {}
        except ValueError:
            log.warning("journal %s: unreadable meta file, starting with defaults", self.path)
            return {}

    def _store_meta(self, durable: bool = False) -> None:
        tmp = self.path + ".meta.tmp"
        with open(tmp, "w") as f:
            json.dump(self._meta, f)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self.path + ".meta")
        if durable and self.fsync:       # the rename itself survives a power loss
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    def _load(self) -> None:
        try:
            with open(self.path + ".log", "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        pos = 0
        while pos + _REC.size <= len(data):
            n, crc = _REC.unpack_from(data, pos)
            end = pos + _REC.size + n
            if n < _IDX.size or end > len(data) or crc32c.crc32c(data[pos + _REC.size:end]) != crc:
                break
            idx, term = _IDX.unpack_from(data, pos + _REC.size)
            self._entries.append(_Entry(self, idx, term))
            self._ends.append(end)
            pos = end
        if pos != len(data):
            log.warning("journal %s: dropping %d bytes of torn/corrupt tail", self.path, len(data) - pos)
            with open(self.path + ".log", "r+b") as f:
                f.truncate(pos)
        self._bytes = pos

    @staticmethod
    def _frame(command: bytes, idx: int, term: int) -> bytes:
        payload = _IDX.pack(idx, term) + command
        return _REC.pack(len(payload), crc32c.crc32c(payload)) + payload

    def sync(self) -> None:
        """Make every entry appended so far durable (per the fsync policy)."""
        with self._io:
            self._sync_locked()

    def sync_behind(self) -> None:
        """``sync`` for a thread other than the one appending (the node's syncer).

        Entries appended while it runs are not claimed: ``durable_idx`` moves
        to the last entry present when the sync began.
        """
        with self._io:
            if not self._f.closed:
                self._sync_locked()

    def _sync_locked(self) -> None:
        last = self.last_idx
        if self._dirty or last > self.durable_idx:
            self._dirty = False          # an append from now on sets it again
            if self.fsync:
                try:
                    os.fdatasync(self._f.fileno())
                except OSError:
                    # Linux reports a lost write-back once; a retry would "succeed"
                    # over lost pages. Nothing past durable_idx may ever count.
                    self._dirty = True
                    raise
        self.durable_idx = max(self.durable_idx, last) if last else 0

    @property
    def last_idx(self) -> int:
        return self._entries[-1].idx if self._entries else 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    # ----------------------------------------------------------- payloads
    def _remember(self, idx: int, command: bytes) -> None:
        self._cache[idx] = command
        self._cache_bytes += len(command)
        while self._cache_bytes > CACHE_BYTES and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= len(old)

    def _forget_from(self, idx: int) -> None:
        for k in [k for k in self._cache if k >= idx]:
            self._cache_bytes -= len(self._cache.pop(k))

    def command(self, idx: int) -> bytes:
        """The command of entry ``idx``: from the cache, else from the file."""
        cmd = self._cache.get(idx)
        if cmd is not None:
            return cmd
        i = idx - self._entries[0].idx
        if not 0 <= i < len(self._entries) or self._entries[i].idx != idx:
            raise KeyError(f"journal {self.path}: no entry {idx}")
        start = (self._ends[i - 1] if i else 0) + _REC.size + _IDX.size
        self._f.flush()
        cmd = os.pread(self._rfd, self._ends[i] - start, start)
        self._remember(idx, cmd)
        return cmd

    # ------------------------------------------------------- Journal interface
    def add(self, command, idx, term):
        command = bytes(command)
        # Header and command go out with one writev: no 100 KiB concatenation
        # (a fresh buffer, page faults and a copy) per entry.
        head = _IDX.pack(idx, term)
        crc = crc32c.crc32c(command, crc32c.crc32c(head))
        n = _REC.size + len(head) + len(command)
        if os.writev(self._f.fileno(), (_REC.pack(len(head) + len(command), crc), head, command)) != n:
            raise OSError(f"journal {self.path}: short write")
        # Dirty before the entry is visible: a sync on another thread that sees
        # the entry must also see that there is something to sync.
        self._dirty = True
        self._bytes += n
        self._entries.append(_Entry(self, idx, term))
        self._ends.append(self._bytes)
        self._remember(idx, command)

    def clear(self):
        with self._io:
            self.truncations += 1
            self._rewrite([])

    def deleteEntriesFrom(self, entryFrom):
        if entryFrom >= len(self._entries):
            return
        with self._io:
            self.truncations += 1
            keep = self._ends[entryFrom - 1] if entryFrom > 0 else 0
            self._forget_from(self._entries[entryFrom].idx)
            del self._entries[entryFrom:]
            del self._ends[entryFrom:]
            self._f.truncate(keep)
            self._f.seek(keep)
            self._bytes = keep
            self._dirty = True
            self.durable_idx = min(self.durable_idx, self.last_idx)
            self._sync_locked()

    def deleteEntriesTo(self, entryTo):
        self._rewrite(self._entries[entryTo:])

    def _rewrite(self, entries) -> None:
        with self._io:
            self._rewrite_locked(entries)

    def _rewrite_locked(self, entries) -> None:
        tmp = self.path + ".log.tmp"
        ends, pos, kept = [], 0, []
        with open(tmp, "wb") as f:
            for e in entries:
                cmd, idx, term = tuple(e)
                frame = self._frame(cmd, idx, term)
                f.write(frame)
                pos += len(frame)
                ends.append(pos)
                kept.append(_Entry(self, idx, term))
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        self._f.close()
        os.close(self._rfd)
        os.replace(tmp, self.path + ".log")
        if self.fsync:               # the new file is the journal only once the rename is durable
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        self._f = open(self.path + ".log", "ab")
        self._rfd = os.open(self.path + ".log", os.O_RDONLY)
        live = {e.idx for e in kept}
        for k in [k for k in self._cache if k not in live]:
            self._cache_bytes -= len(self._cache.pop(k))
        self._entries, self._ends, self._bytes = kept, ends, pos
        self._dirty = False
        self.durable_idx = self.last_idx   # the new file was written and synced as a whole

    def __getitem__(self, item):
        return self._entries[item]

    def __len__(self):
        return len(self._entries)

    def _destroy(self):
        with self._io:
            if not self._f.closed:
                self._sync_locked()
                self._f.close()
                os.close(self._rfd)
                self._store_meta()

    def setRaftCommitIndex(self, raftCommitIndex):
        self._meta["commitIndex"] = raftCommitIndex

    def getRaftCommitIndex(self):
        return self._meta.get("commitIndex", 1)

    def setCurrentTerm(self, term, votedForNodeId):
        # Raft: term and vote are durable before any message reflecting them.
        self._meta["currentTerm"] = term
        self._meta["votedFor"] = votedForNodeId
        self._store_meta(durable=True)

    def getCurrentTerm(self):
        return self._meta.get("currentTerm", 0)

    def getVotedForNodeId(self):
        return self._meta.get("votedFor")

    def onOneSecondTimer(self):
        if self._meta.get("commitIndex") != self._stored_commit:
            self._stored_commit = self._meta.get("commitIndex")
            self._store_meta()
