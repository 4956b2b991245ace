"""Whole-segment swaps of a queue (a mixin of ``QueueLog``): compaction's cleaned
segment, a rotten segment repaired from a peer's batches, a rebuilt index, and
sealing the active segment so that it can be swapped.

A swap writes the new files aside (``.cleaned``), syncs them, drops a ``.swap``
marker, renames them over the old ones and removes the marker
(``segment.finish_swaps`` completes or discards one cut short by a crash).
Readers holding the old file keep reading it (``read`` dups the fd).
"""
from __future__ import annotations

import os

from ..protocol import framing
from .durability import fsync_dir
from .segment import IDX_ENTRY, SEGMENT_FILES, TIX_ENTRY, Segment, index_entries, rewrite_index

__all__ = ["SegmentSwaps"]


class SegmentSwaps:
    def replace_segment(self, seg: Segment, frames: list[bytes]) -> bool:
        """Swap a sealed segment's batches for ``frames`` (compaction).

        The frames must cover the same offset range (the segment's last record
        kept). Written to ``.cleaned`` files first; returns False and changes
        nothing when the segment was deleted (retention) in the meantime.
        Readers holding the old file keep reading it (``read`` dups the fd).
        """
        cleaned = {ext: seg.file(ext) + ".cleaned" for ext in SEGMENT_FILES}
        try:
            idx, tix, pos, since, first_ts = [], [], 0, 0, -1   # no entry for byte 0
            with open(cleaned["log"], "wb") as f:
                for frame in frames:
                    h = next(framing.iter_batches(frame, verify=False))
                    if since >= self.index_interval:
                        idx.append((h.base_offset, pos))
                        tix.append((h.store_ts, h.base_offset))
                        since = 0
                    if first_ts < 0:
                        first_ts = h.store_ts
                    f.write(frame)
                    since += len(frame)
                    pos += len(frame)
                f.flush()
                os.fsync(f.fileno())
            for ext, st, pairs in (("idx", IDX_ENTRY, idx), ("tix", TIX_ENTRY, tix)):
                with open(cleaned[ext], "wb") as f:      # empty too: the swap renames all three
                    f.write(b"".join(st.pack(*p) for p in pairs))
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException:          # a full disk: no half-written file stays
            for path in cleaned.values():
                if os.path.exists(path):
                    os.unlink(path)
            raise
        with self.lock:
            if not any(s is seg for s in self.segments):
                for path in cleaned.values():
                    os.unlink(path)
                return False
            marker = os.path.join(self.path, f"{seg.base:020d}.swap")
            open(marker, "wb").close()
            fsync_dir(self.path)
            for ext in SEGMENT_FILES:
                os.replace(cleaned[ext], seg.file(ext))
            os.unlink(marker)
            fsync_dir(self.path)
            seg.close()
            seg.size = pos
            self._resized()
            seg.first_ts = first_ts
            if seg is self._tail_seg:       # its batches moved: the known positions are gone
                self._tail, self._tail_seg = [], None
            self._note_files()
        return True

    def repair_segment(self, seg: Segment, frames: list[bytes]) -> bool:
        """Swap a sealed segment for a healthy replica's batches of its offset range
        (bit rot; ``cluster/repair.py``); False if the segment went meanwhile."""
        last = next(framing.iter_batches(frames[-1]))
        if not self.replace_segment(seg, frames):
            return False
        with self.lock:
            seg.next_offset = max(seg.next_offset, last.next_offset)
            seg.last_ts, seg.last_position = last.store_ts, last.apply_position
            seg.damaged = False
        return True

    def damaged(self) -> list[Segment]:
        with self.lock:
            return [seg for seg in self.segments if seg.damaged]

    def seal_active(self) -> Segment | None:
        """Roll the active segment now (it holds a bad batch or index entry: a sealed
        segment can be swapped whole); the sealed one, or None if it is empty."""
        with self.lock:
            seg = self.segments[-1]
            if seg.size == 0:
                return None
            if self._wfd is None:
                self._open_writer()
            self._roll()
            return seg

    def rebuild_index(self, seg: Segment, headers) -> None:
        """Rewrite a sealed segment's index files from its batches' headers."""
        idx, tix, _ = index_entries(headers, self.index_interval)
        with self.lock:
            if seg is self.segments[-1]:
                raise ValueError(f"segment {seg.file('log')} is active: seal it first")
            rewrite_index(seg, idx, tix)
