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

import json
import logging
import os
import struct

import crc32c
from pysyncobj.journal import Journal

__all__ = ["DurableJournal", "FSYNC_POLICIES"]

log = logging.getLogger(__name__)
FSYNC_POLICIES = ("always", "none")
_REC = struct.Struct("<II")
_IDX = struct.Struct("<QQ")


class DurableJournal(Journal):
    def __init__(self, path: str, fsync: str = "always"):
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy {fsync!r}; allowed: {', '.join(FSYNC_POLICIES)}")
        self.path = path
        self.fsync = fsync == "always"
        self._entries: list[tuple[bytes, int, int]] = []
        self._ends: list[int] = []   # file position after each entry
        self._bytes = 0
        self._dirty = False
        self._meta = self._load_meta()
        self._stored_commit = self._meta.get("commitIndex")
        self._load()
        self._f = open(path + ".log", "ab")

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

    def _store_meta(self) -> None:
        tmp = self.path + ".meta.tmp"
        with open(tmp, "w") as f:
            json.dump(self._meta, f)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self.path + ".meta")

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
            self._entries.append((data[pos + _REC.size + _IDX.size:end], idx, term))
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
        if self._dirty:
            self._f.flush()
            if self.fsync:
                os.fdatasync(self._f.fileno())
            self._dirty = False

    @property
    def size_bytes(self) -> int:
        return self._bytes

    # ------------------------------------------------------- Journal interface
    def add(self, command, idx, term):
        command = bytes(command)
        frame = self._frame(command, idx, term)
        self._f.write(frame)
        self._bytes += len(frame)
        self._entries.append((command, idx, term))
        self._ends.append(self._bytes)
        self._dirty = True

    def clear(self):
        self._rewrite([])

    def deleteEntriesFrom(self, entryFrom):
        if entryFrom >= len(self._entries):
            return
        self._f.flush()
        keep = self._ends[entryFrom - 1] if entryFrom > 0 else 0
        del self._entries[entryFrom:]
        del self._ends[entryFrom:]
        self._f.truncate(keep)
        self._f.seek(keep)
        self._bytes = keep
        self._dirty = True
        self.sync()

    def deleteEntriesTo(self, entryTo):
        self._rewrite(self._entries[entryTo:])

    def _rewrite(self, entries) -> None:
        tmp = self.path + ".log.tmp"
        ends, pos = [], 0
        with open(tmp, "wb") as f:
            for e in entries:
                frame = self._frame(*e)
                f.write(frame)
                pos += len(frame)
                ends.append(pos)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        self._f.close()
        os.replace(tmp, self.path + ".log")
        self._f = open(self.path + ".log", "ab")
        self._entries, self._ends, self._bytes = list(entries), ends, pos
        self._dirty = False

    def __getitem__(self, item):
        return self._entries[item]

    def __len__(self):
        return len(self._entries)

    def _destroy(self):
        if not self._f.closed:
            self.sync()
            self._f.close()
            self._store_meta()

    def setRaftCommitIndex(self, raftCommitIndex):
        self._meta["commitIndex"] = raftCommitIndex

    def getRaftCommitIndex(self):
        return self._meta.get("commitIndex", 1)

    def setCurrentTerm(self, term, votedForNodeId):
        # Raft: term and vote are durable before any message reflecting them.
        self._meta["currentTerm"] = term
        self._meta["votedFor"] = votedForNodeId
        self._store_meta()

    def getCurrentTerm(self):
        return self._meta.get("currentTerm", 0)

    def getVotedForNodeId(self):
        return self._meta.get("votedFor")

    def onOneSecondTimer(self):
        if self._meta.get("commitIndex") != self._stored_commit:
            self._stored_commit = self._meta.get("commitIndex")
            self._store_meta()
