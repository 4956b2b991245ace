"""The read side of a queue (``queue_log.QueueLog``): batches from an offset, where they
lie in a file (for a reader on the node's host), a batch by its raft position, a
record's store time, and the first offset at or after a time.

Reads run on many threads beside the one writer: the segment list, its sizes and
the tail's known batch positions are read under the queue's lock, then each read
works on a private descriptor (compaction or retention may close the segment's).
"""
from __future__ import annotations

import bisect
import os
import time

from ..protocol import framing
from .segment import (IDX_ENTRY, TIX_ENTRY, FileSpan, Segment, index_position, read_batch_holding, read_pairs,
                      read_segment, span_in)

__all__ = ["QueueReads"]

_NOT_FOUND = object()


class QueueReads:
    """Mixed into ``QueueLog`` (its ``lock``, ``segments``, ``_earliest``, ``next_offset``,
    ``_tail``/``_tail_seg``, ``recent``, ``last_use`` and ``_note_files``)."""

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``offset``, about max_bytes (at least one batch).

        After compaction ``offset`` may fall in a gap: the read starts at the
        next batch with a record at or after it.
        """
        data = self.read_view(offset, max_bytes)
        return data if isinstance(data, bytes) else data.tobytes()

    def read_view(self, offset: int, max_bytes: int) -> bytes | memoryview:
        """``read``, but the answer may be a view of what was read from the file
        (the batches before ``offset`` cut off) instead of a copy."""
        return self._in_segments(offset, b"", lambda seg, fd, size, idx, off: read_segment(
            seg, fd, size, idx, off, max_bytes))

    def batch_holding(self, offset: int) -> bytes | None:
        """The one batch holding ``offset`` (CRC-checked), found from its neighbours'
        headers; None when not found that way: ``read`` then (``segment.read_batch_holding``)."""
        def in_segment(seg: Segment, fd: int, size: int, idx, off: int):
            # Never on to the next segment: the batch holding ``offset`` is in this one
            # or nowhere sure (the caller's careful read goes on from here).
            return read_batch_holding(fd, size, idx, off) or _NOT_FOUND

        found = self._in_segments(offset, None, in_segment)
        return None if found is _NOT_FOUND else found

    def locate(self, offset: int, max_bytes: int) -> FileSpan | None:
        """Where ``read_view(offset, max_bytes)`` would read, without reading the batches.

        For a reader on this host (``storage_service.localread``): whole batches
        from the one holding ``offset``, about ``max_bytes``, within one segment
        (the next call continues in the next). Only batch headers are looked at,
        through a map of the file; the reader CRC-checks what it reads. None
        when nothing is at or after ``offset``.
        """
        def in_segment(seg: Segment, fd: int, size: int, idx, off: int) -> FileSpan | None:
            span = span_in(fd, size, idx, off, max_bytes)
            if span is None:
                return None
            first, stop, nxt = span
            st = os.fstat(fd)
            return FileSpan(os.path.abspath(seg.file("log")), first, stop - first, nxt,
                            st.st_ino, st.st_dev)

        return self._in_segments(offset, None, in_segment)

    def batch_at_position(self, position: int) -> tuple[int, int] | None:
        """(base offset, store ts) of the batch applied at raft ``position``, or None
        when the queue holds none (never stored, or compacted away). Positions grow
        with offsets, so only the first segment whose last batch is at or past it is
        read (its headers). For journal replay after a restart: the batches of the
        last segment at open are in ``recent`` already."""
        hit = self.recent.get(position)
        if hit is not None:
            return hit
        with self.lock:
            seg = next((sg for sg in self.segments if sg.last_position >= position), None)
            if seg is None:
                return None
            try:
                with open(seg.file("log"), "rb") as f:
                    data = f.read(seg.size)
            except FileNotFoundError:
                return None
        # Kept with ``recent``: a replay asks for many positions of one segment.
        self.recent.update((h.apply_position, (h.base_offset, h.store_ts))
                           for h in framing.iter_batches(data, verify=False))
        return self.recent.get(position)

    def store_ts_at(self, offset: int) -> int | None:
        """Store time of the batch holding ``offset``, from batch headers only (a few
        small reads from the sparse index's entry on); None when nothing is there."""
        head = framing.BATCH_HEADER.size + framing.BODY_HEADER.size

        def find(seg: Segment, fd: int, size: int, idx, off: int) -> int | None:
            pos, ts = index_position(idx, off), None
            while pos + head <= size:
                b = os.pread(fd, head, pos)
                if len(b) < head:
                    break
                body_len, _ = framing.BATCH_HEADER.unpack_from(b, 0)
                base, store_ts, _, _ = framing.BODY_HEADER.unpack_from(b, framing.BATCH_HEADER.size)
                if base > off:
                    break
                ts, pos = store_ts, pos + framing.BATCH_HEADER.size + body_len
            return ts
        return self._in_segments(offset, None, find)

    def _in_segments(self, offset: int, nothing, fn):
        """``fn(segment, fd, size, sparse index, offset)`` on the segment holding
        ``offset``, then on the following ones until it finds something there."""
        while True:
            with self.lock:
                if offset < self._earliest or offset >= self.next_offset:
                    return nothing
                i = max(0, bisect.bisect_right([s.base for s in self.segments], offset) - 1)
                seg = self.segments[i]
                following = self.segments[i + 1].base if i + 1 < len(self.segments) else None
                # A private fd: compaction or retention may close the segment's.
                self.last_use = time.monotonic()
                opened = seg.fd is None
                fd = os.dup(seg.open_fd())
                if opened:
                    self._note_files()
                size = seg.size
                idx = read_pairs(seg.file("idx"), IDX_ENTRY)
                if seg is self._tail_seg and self._tail:
                    idx += self._tail           # (past the file's last entry: still in order)
            try:
                out = fn(seg, fd, size, idx, offset)
            finally:
                os.close(fd)
            if out or following is None:
                return out if out else nothing
            offset = max(offset, following)   # nothing at or after offset here: the next segment

    def offset_for_timestamp(self, ts: int) -> int:
        """First offset whose store timestamp is >= ts (next_offset if none)."""
        with self.lock:
            segs = list(self.segments)
            earliest = self._earliest
            nxt = self.next_offset
        for seg in segs:
            if seg.last_ts < ts or seg.next_offset <= earliest:
                continue
            start = max(seg.base, earliest)
            tix = read_pairs(seg.file("tix"), TIX_ENTRY)
            i = bisect.bisect_left([t for t, _ in tix], ts) - 1
            if i >= 0:
                start = max(start, tix[i][1])
            off = start
            while off < seg.next_offset:
                data = self.read(off, 1 << 20)
                if not data:
                    break
                for h in framing.iter_batches(data, verify=False):
                    if h.store_ts >= ts and h.next_offset > earliest:
                        return max(h.base_offset, earliest)
                    off = h.next_offset
        return nxt
