"""Reading a raft journal file back (``journal.py`` has the layout and why): its
records checked one by one, the live entries past a record that fails its check
(bit rot), and a journal of the layout before epochs. A mixin of ``DurableJournal``.
"""
from __future__ import annotations

import logging
import mmap
import os
import struct

import crc32c

__all__ = ["JournalScan"]

log = logging.getLogger(__name__)
_REC = struct.Struct("<II")
_HEAD = struct.Struct("<QQQ")      # epoch, index, term
_LEGACY_HEAD = struct.Struct("<QQ")


class _Entry:
    """A journal entry as pysyncobj sees it, ``(command, index, term)``.

    Only index and term live in memory; the command is read from the file
    (or the recent-entries cache) when pysyncobj looks at ``entry[0]``, so
    the node's memory does not grow with the payloads in the journal.
    """
    __slots__ = ("_journal", "idx", "term")

    def __init__(self, journal, idx: int, term: int):     # journal: a DurableJournal
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


class JournalScan:
    def _load(self) -> None:
        size = os.fstat(self._fd).st_size
        if not size:
            return
        floor, ceiling = self._meta.get("base", 0), self._reserved
        with mmap.mmap(self._fd, size, prot=mmap.PROT_READ) as m, memoryview(m) as data:
            pos = 0
            while pos + _REC.size + _HEAD.size <= size:
                n, crc = _REC.unpack_from(data, pos)
                end = pos + _REC.size + n
                if n < _HEAD.size or end > size:
                    break
                epoch, idx, term = _HEAD.unpack_from(data, pos + _REC.size)
                if not floor <= epoch <= ceiling or (self._entries and idx != self._entries[-1].idx + 1):
                    break
                if crc32c.crc32c(data[pos + _REC.size:end], self._salt) != crc:
                    break
                floor = epoch
                self._entries.append(_Entry(self, idx, term))
                self._ends.append(end)
                pos = end
            if self._entries and pos < size:
                self.lost_through = self._entries_past(m, pos, self._entries[-1].idx + 1, floor, ceiling)
        self._bytes = pos
        if self.lost_through:
            log.error("journal %s: the record of entry %d fails its check (bit rot?) but entries up to %d "
                      "follow it: they are dropped here, and this replica neither votes nor stands for "
                      "election until the leader has sent them again", self.file_path,
                      self.last_idx + 1, self.lost_through)

    def _entries_past(self, m, pos: int, bad: int, floor: int, ceiling: int) -> int:
        """After a record that does not read (entry ``bad``): the last index of live
        records that follow it (0: none; ``pos`` is the journal's end, as after a torn
        write). Found by the index field of the records after it, each checked whole."""
        size, at = len(m), 0
        for want in range(bad + 1, bad + 9):          # a few bad records in a row at most
            key = _HEAD.pack(0, want, 0)[8:16]
            hit = m.find(key, pos)
            while hit != -1 and not at:
                start = hit - _REC.size - 8
                if start > pos and self._record_ok(m, start, size, want, floor, ceiling):
                    at = start
                hit = m.find(key, hit + 1) if not at else -1
            if at:
                break
        if not at:
            return 0
        last, idx = 0, want
        while at + _REC.size + _HEAD.size <= size and self._record_ok(m, at, size, idx, floor, ceiling):
            last = idx
            at += _REC.size + _REC.unpack_from(m, at)[0]
            idx += 1
        return last

    def _record_ok(self, m, at: int, size: int, idx: int, floor: int, ceiling: int) -> bool:
        n, crc = _REC.unpack_from(m, at)
        end = at + _REC.size + n
        if n < _HEAD.size or end > size:
            return False
        epoch, got, _ = _HEAD.unpack_from(m, at + _REC.size)
        cut = self._meta.get("cut")
        if cut and got >= cut[0] and epoch < cut[1]:
            return False                         # dropped by a truncation, not live
        return got == idx and floor <= epoch <= ceiling and crc32c.crc32c(m[at + _REC.size:end], self._salt) == crc

    def _load_legacy(self) -> list[tuple[bytes, int, int]] | None:
        """Entries of a journal in the layout before epochs (``<name>.log``), if any."""
        try:
            with open(self.path + ".log", "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        pos, entries = 0, []
        while pos + _REC.size <= len(data):
            n, crc = _REC.unpack_from(data, pos)
            end = pos + _REC.size + n
            if n < _LEGACY_HEAD.size or end > len(data) or crc32c.crc32c(data[pos + _REC.size:end]) != crc:
                break
            idx, term = _LEGACY_HEAD.unpack_from(data, pos + _REC.size)
            entries.append((data[pos + _REC.size + _LEGACY_HEAD.size:end], idx, term))
            pos = end
        log.warning("journal %s: rewriting %d entries of the old layout", self.path, len(entries))
        return entries
