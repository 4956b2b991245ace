"""A durable raft journal for pysyncobj, with an explicit fsync policy.

pysyncobj's own FileJournal writes through an mmap that is never fsynced, so
an acknowledged entry can vanish with the page cache. This journal implements
the same interface (``pysyncobj.journal.Journal``) over CRC-framed records in
plain files, and ``sync()`` makes everything appended so far durable. RaftGroup
calls ``sync()`` before a follower acknowledges entries and before a leader
counts its own copy towards a commit.

Two files, used in turn (``<name>.0.wal`` and ``<name>.1.wal``)::

    record = u32 len | u32 crc32c(body, seeded with the journal's salt) | body
    body   = u64 epoch | u64 index | u64 term | command bytes

plus ``<name>.meta`` (JSON: currentTerm, votedFor, commitIndex; which file is
live, its base epoch, the epochs reserved, the CRC salt), replaced atomically.
Without its meta file a journal refuses to open (the node's directory can be
wiped: it rebuilds from its peers).

Why two files and epochs: ``fdatasync`` after an append that grows a file
must also commit the new size and blocks to the filesystem journal; over
blocks that were already written it flushes the data alone. On this
project's test VM that is 1.1-1.4 ms and 0.37-0.45 ms of CPU per 360 KiB
sync when growing, 0.5-0.6 ms and 0.16-0.19 ms when overwriting
(``fallocate`` does not help: its blocks are "unwritten" and converting them
is metadata too). So a file is never shrunk: a compaction
(``deleteEntriesTo``, after every raft snapshot) writes the entries it keeps
at the start of the *other* file, syncs it, and switches the meta file to it;
the old file is overwritten at the next compaction. A file therefore holds
old records past the live ones. Every record carries the epoch it was
written in, and the reader stops at the first record that does not parse,
fails its CRC, has a lower epoch than the record before it or than the
file's base epoch (stored at the switch), or does not follow its index.
Epochs only grow and are reserved in the meta file (durably, in blocks)
before use; a new one starts at every open, truncation and compaction, so
no old record can pass for a live one. A truncation (``deleteEntriesFrom``)
also zeroes the header of the first dropped record. The salt (random per
journal) keeps message bytes left in a recycled file that happen (or are
made) to look like a record from reading as one. I/O errors after a file
switch or truncation began stop the node (``errors.fatal``): memory and
files would no longer agree.

fsync policies:
  ``always``  sync per group commit / per acknowledged append (default): an
              acknowledged produce is on disk on a majority of nodes.
  ``none``    never sync: an acknowledged produce is in the page cache of a
              majority; it survives process crashes (kill -9) but not a
              power loss of a majority.

A journal written by an older version (one ``<name>.log`` without epochs) is
read once and rewritten in this layout.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time

import crc32c
from pysyncobj.journal import Journal

from ..log.durability import fatal, fsync_dir
from .journal_scan import _HEAD, _REC, JournalScan, _Entry

__all__ = ["DurableJournal", "FSYNC_POLICIES"]

log = logging.getLogger(__name__)
FSYNC_POLICIES = ("always", "none")
CACHE_BYTES = 32 << 20
EPOCH_BLOCK = 1024                 # epochs reserved per durable meta write
WAL_VERSION = 2


def _ignore(seconds: float) -> None:
    pass


class DurableJournal(JournalScan, Journal):
    def __init__(self, path: str, fsync: str = "always"):
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy {fsync!r}; allowed: {', '.join(FSYNC_POLICIES)}")
        self.path = path
        self.fsync = fsync == "always"
        self.observe_fsync = _ignore     # gets each fdatasync's seconds (the node's metrics)
        self._entries: list[_Entry] = []
        self._ends: list[int] = []   # file position after each entry
        self._cache: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._cache_bytes = 0
        self._bytes = 0
        self._synced_bytes = 0      # _bytes as of the last sync (unsynced_bytes)
        self._dirty = False
        # Files are switched, truncated and closed under this lock, and a sync
        # from another thread (``sync_behind``) holds it while it runs.
        self._io = threading.RLock()
        self.truncations = 0       # tail (or all) entries dropped: replies about them are void
        # Entries up to this index were on disk past a record that failed its check
        # (bit rot): until the log holds them again this replica must not vote.
        self.lost_through = 0
        self._meta = self._load_meta()
        self._stored_commit = self._meta.get("commitIndex")
        self._active = self._meta.get("active", 0)
        self._epoch = self._reserved = self._meta.get("epochs", 0)
        legacy = self._load_legacy() if self._meta.get("wal") != WAL_VERSION else None
        if legacy is None:
            # The marker is stored (with the first epoch reservation) only when
            # no old-layout journal waits to be converted.
            self._meta.setdefault("salt", int.from_bytes(os.urandom(4), "little"))
            self._meta["wal"] = WAL_VERSION
        self._salt = self._meta.get("salt", 0)
        self._fd = os.open(self.file_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if legacy is None:
                self._load()
            # Every epoch used before this open is below the new one. (The
            # reservation's meta write also makes the new file's directory
            # entry durable: it fsyncs the same directory.)
            self._next_epoch()
            if legacy is not None:
                self._meta["salt"] = self._salt = int.from_bytes(os.urandom(4), "little")
                self._rewrite_locked(legacy)
                os.remove(path + ".log")
            # After a kill -9 the unsynced tail is still in the page cache and reads
            # back like the rest: sync it before any of it counts as durable.
            if self.fsync:
                os.fsync(self._fd)
        except BaseException:
            os.close(self._fd)
            raise
        self.durable_idx = self.last_idx

    @property
    def file_path(self) -> str:
        """The file the live entries are in (the other one is overwritten next)."""
        return self._wal(self._active)

    def _wal(self, n: int) -> str:
        return f"{self.path}.{n}.wal"

    # -------------------------------------------------------------- persistence
    def _load_meta(self) -> dict:
        try:
            with open(self.path + ".meta") as f:
                meta = json.load(f)
        except (FileNotFoundError, ValueError) as e:
            if any(os.path.exists(self._wal(n)) for n in (0, 1)):
                # Which file is live, its base epoch and the CRC salt are in it:
                # guessing could read stale entries as live ones.
                raise RuntimeError(
                    f"journal {self.path}: {self.path}.meta is missing or unreadable ({e}) "
                    f"but its entry files exist; the journal cannot be read safely. "
                    f"Remove this node's data directory to rebuild it from its peers.") from e
            if isinstance(e, ValueError):
                log.warning("journal %s: unreadable meta file, starting with defaults", self.path)
            return {}
        return meta

    def _store_meta(self, durable: bool = False) -> None:
        self._write_meta()
        if durable and self.fsync:       # the rename itself survives a power loss
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    def _write_meta(self) -> None:
        tmp = self.path + ".meta.tmp"
        with open(tmp, "w") as f:
            json.dump(self._meta, f)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self.path + ".meta")

    def _next_epoch(self) -> None:
        """Start a new epoch, higher than any record in either file can carry.

        Reserved durably before use; nothing changes when the reservation fails.
        """
        epoch = self._epoch + 1
        if epoch > self._reserved:
            reserved = epoch + EPOCH_BLOCK
            before = self._meta.get("epochs")
            self._meta["epochs"] = reserved
            try:
                self._store_meta(durable=True)
            except BaseException:
                self._meta["epochs"] = before
                raise
            self._reserved = reserved
        self._epoch = epoch

    def _write(self, fd: int, pos: int, command: bytes, idx: int, term: int) -> int:
        """Write one record at ``pos``; returns its length."""
        # Header and command go out with one pwritev: no 100 KiB concatenation
        # (a fresh buffer, page faults and a copy) per entry.
        head = _HEAD.pack(self._epoch, idx, term)
        crc = crc32c.crc32c(command, crc32c.crc32c(head, self._salt))
        n = _REC.size + len(head) + len(command)
        if os.pwritev(fd, (_REC.pack(len(head) + len(command), crc), head, command), pos) != n:
            raise OSError(f"journal {self.path}: short write")
        return n

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
            if self._fd is not None:
                self._sync_locked()

    @property
    def unsynced_bytes(self) -> int:
        """About how much a sync now would write back (the journal's own records)."""
        return max(0, self._bytes - self._synced_bytes)

    def _sync_locked(self) -> None:
        last, size, took = self.last_idx, self._bytes, None
        if self._dirty or last > self.durable_idx:
            self._dirty = False          # an append from now on sets it again
            if self.fsync:
                try:
                    t0 = time.perf_counter()
                    os.fdatasync(self._fd)
                    took = time.perf_counter() - t0
                except OSError:
                    # Linux reports a lost write-back once; a retry would "succeed"
                    # over lost pages. Nothing past durable_idx may ever count.
                    self._dirty = True
                    raise
        self.durable_idx = max(self.durable_idx, last) if last else 0
        self._synced_bytes = size
        if took is not None:
            try:                         # a metrics failure must not hold back what is durable
                self.observe_fsync(took)
            except Exception:
                log.exception("journal %s: recording an fdatasync's time failed", self.path)

    @property
    def last_idx(self) -> int:
        return self._entries[-1].idx if self._entries else 0

    @property
    def size_bytes(self) -> int:
        """Bytes of live entries (the file itself may be longer: see the module docstring)."""
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
        start = (self._ends[i - 1] if i else 0) + _REC.size + _HEAD.size
        cmd = os.pread(self._fd, self._ends[i] - start, start)
        self._remember(idx, cmd)
        return cmd

    def kind(self, idx: int) -> int:
        """The first byte of entry ``idx``'s command (pysyncobj's command type), read
        without the rest of it."""
        cmd = self._cache.get(idx)
        if cmd is not None:
            return cmd[0] if cmd else -1
        i = idx - self._entries[0].idx
        if not 0 <= i < len(self._entries) or self._entries[i].idx != idx:
            raise KeyError(f"journal {self.path}: no entry {idx}")
        start = (self._ends[i - 1] if i else 0) + _REC.size + _HEAD.size
        if self._ends[i] <= start:
            return -1
        return os.pread(self._fd, 1, start)[0]

    def commands_after(self, idx: int, kind: int) -> list[bytes]:
        """Commands of type ``kind`` of the entries past ``idx``, oldest first."""
        return [self.command(e.idx) for e in self._entries if e.idx > idx and self.kind(e.idx) == kind]

    # ------------------------------------------------------- Journal interface
    def add(self, command, idx, term):
        command = bytes(command)
        n = self._write(self._fd, self._bytes, command, idx, term)
        # Dirty before the entry is visible: a sync on another thread that sees
        # the entry must also see that there is something to sync.
        self._dirty = True
        self._bytes += n
        self._entries.append(_Entry(self, idx, term))
        self._ends.append(self._bytes)
        self._remember(idx, command)
        if not self.fsync:
            # Written is all the none policy asks: the entry counts at once, with no
            # round through the syncer thread (two thread wake-ups on a follower's
            # reply, ~1 ms of an idle node's commit latency).
            with self._io:
                self.durable_idx = max(self.durable_idx, self.last_idx)

    def clear(self):
        with self._io:
            self.truncations += 1
            self._rewrite_locked([])

    def deleteEntriesFrom(self, entryFrom):
        if entryFrom >= len(self._entries):
            return
        with self._io:
            # Records appended from here on outrank the dropped ones (one may
            # start exactly where a new one ends): reserved before anything changes.
            self._next_epoch()
            self.truncations += 1
            # The dropped records stay in the file past the zeroed one: recorded, so a
            # start never takes them for live entries behind a rotten record.
            self._meta["cut"] = [self._entries[entryFrom].idx, self._epoch]
            self._store_meta(durable=True)
            keep = self._ends[entryFrom - 1] if entryFrom > 0 else 0
            self._forget_from(self._entries[entryFrom].idx)
            del self._entries[entryFrom:]
            del self._ends[entryFrom:]
            self._bytes = keep
            self._dirty = True
            self.durable_idx = min(self.durable_idx, self.last_idx)
            try:
                # The first dropped record stops parsing.
                os.pwrite(self._fd, bytes(_REC.size), keep)
                self._sync_locked()
            except OSError as e:        # the file no longer matches memory
                fatal(f"journal {self.path}: truncation failed ({e})")

    def deleteEntriesTo(self, entryTo):
        if entryTo <= 0:
            return
        with self._io:
            self._rewrite_locked(self._entries[entryTo:])

    def _rewrite_locked(self, entries) -> None:
        """Write ``entries`` at the start of the other file, sync it, switch to it."""
        other = 1 - self._active
        self._next_epoch()
        fd = os.open(self._wal(other), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            ends, pos, kept = [], 0, []
            for e in entries:
                cmd, idx, term = tuple(e)
                pos += self._write(fd, pos, bytes(cmd), idx, term)
                ends.append(pos)
                kept.append(_Entry(self, idx, term))
            if self.fsync:
                os.fdatasync(fd)
            # The switch: from here on only records of this epoch or later count.
            before = dict(self._meta)
            self._meta.update(wal=WAL_VERSION, active=other, base=self._epoch)
            try:
                self._write_meta()
            except BaseException:       # os.replace did not happen: the old file stays live
                self._meta = before
                raise
        except BaseException:
            os.close(fd)
            raise
        old, self._fd, self._active = self._fd, fd, other
        try:
            if self.fsync:
                fsync_dir(os.path.dirname(os.path.abspath(self.path)))
            os.close(old)
        except OSError as e:            # the switch is on disk, maybe not durably
            fatal(f"journal {self.path}: switching files failed ({e})")
        live = {e.idx for e in kept}
        for k in [k for k in self._cache if k not in live]:
            self._cache_bytes -= len(self._cache.pop(k))
        self._entries, self._ends, self._bytes = kept, ends, pos
        self._synced_bytes = pos
        self._dirty = False
        self.durable_idx = self.last_idx   # the new file was written and synced as a whole

    def __getitem__(self, item):
        return self._entries[item]

    def __len__(self):
        return len(self._entries)

    def _destroy(self):
        with self._io:
            if self._fd is not None:
                self._sync_locked()
                os.close(self._fd)
                self._fd = None
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
