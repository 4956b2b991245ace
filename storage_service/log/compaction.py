"""Hot-log compaction of a ``compact`` topic's queues: drop superseded records.

Each replica compacts its own sealed segments in the background, as Kafka's
log cleaner does: nothing is replicated, because compaction never changes
what a reader may rely on, only how many superseded records it sees.

What may go (all below the *cleanable end* ``U``)::

    U = min(compaction watermark of the queue,     # the compaction job has the
                                                   #   latest values in its table
            base of the active segment,            # never rewrite the open file
            first offset younger than min-compaction-lag)

A record at offset ``o < U`` is dropped when a later record with the same key
exists below ``U``, or when it is a tombstone (null value) whose batch is
older than ``delete-retention``: a reader starting from earliest then still
sees every delete for that long. The last record of every segment is always
kept (and so is a tombstone of its key that follows it, however old: else the
superseded record would read as the key's value again), so a segment's offset range (and with it the queue's next offset after
a restart) never changes. Offsets of surviving records never change: a batch
keeps its base offset and its records keep their offset deltas, so a batch
can start with a gap, and fetches skip from one kept record to the next.

A segment is rewritten into ``.cleaned`` files that are swapped in under the
queue lock (``QueueLog.replace_segment``; a crash in between is finished or
rolled back on open). Memory is one dict entry per distinct key below ``U``
for the duration of a pass.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from ..protocol import framing, records
from .queue_log import QueueLog
from .segment import Segment

__all__ = ["CompactionPolicy", "CompactionResult", "compact_queue", "cleanable_end"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompactionPolicy:
    watermark: int                  # compaction job's watermark for this queue (0 = none yet)
    now_ms: int
    delete_retention_ms: int
    min_compaction_lag_ms: int


@dataclass(frozen=True)
class CompactionResult:
    cleanable_end: int              # U of this pass
    segments_rewritten: int
    records_dropped: int
    next_tombstone_expiry_ms: int   # when a kept tombstone below U may go (0 = none kept)


def cleanable_end(ql: QueueLog, p: CompactionPolicy) -> int:
    with ql.lock:
        end = min(p.watermark, ql.segments[-1].base)
    if p.min_compaction_lag_ms > 0 and end > ql.earliest:
        end = min(end, ql.offset_for_timestamp(p.now_ms - p.min_compaction_lag_ms))
    return end


def _segment_blocks(seg: Segment) -> tuple[bytes, list[tuple[framing.BatchHeader, records.Columns]]]:
    """A sealed segment's bytes and every batch in it with its parsed records (CRC-checked)."""
    with open(seg.file("log"), "rb") as f:
        data = f.read()
    return data, list(framing.iter_blocks(data, deep_check=False))


def _keys(cols: records.Columns) -> list[bytes]:
    ko = cols.key_off.tolist()
    kd = cols.key_data
    return [bytes(kd[ko[i]:ko[i + 1]]) for i in range(cols.n)]


def compact_queue(ql: QueueLog, p: CompactionPolicy, end: int | None = None) -> CompactionResult:
    """One compaction pass over the sealed segments of ``ql`` below the cleanable end
    (``end``, when the caller has computed ``cleanable_end`` already)."""
    if end is None:
        end = cleanable_end(ql, p)
    earliest = ql.earliest
    with ql.lock:
        segs = [s for s in ql.segments[:-1] if s.base < end and s.next_offset > earliest]
    # Pass 1: the latest offset of every key below the cleanable end, and the keys of
    # the records kept only because they end a segment.
    latest: dict[bytes, int] = {}
    ends: list[tuple[bytes, int]] = []
    for seg in segs:
        blocks = _segment_blocks(seg)[1]
        for h, cols in blocks:
            offsets = (h.base_offset + cols.offset_delta.astype("int64")).tolist()
            for key, off in zip(_keys(cols), offsets):
                if earliest <= off < end:
                    latest[key] = off
        if blocks:
            h, cols = blocks[-1]
            ends.append((_keys(cols)[-1], h.base_offset + int(cols.offset_delta[-1])))
    # A key whose older record stays (a segment's last) keeps its tombstone, however old:
    # without it that record would read as the key's value again (a deleted key back,
    # for a reader from earliest and for the key index rebuilt from the log).
    pinned = {k for k, off in ends if latest.get(k, off) > off}
    # Pass 2: rewrite the segments that hold something to drop.
    expire_before = p.now_ms - p.delete_retention_ms
    rewritten = dropped = 0
    next_expiry = 0
    for seg in segs:
        data, blocks = _segment_blocks(seg)
        frames: list[bytes] = []
        seg_dropped = 0
        last_batch = len(blocks) - 1
        for bi, (h, cols) in enumerate(blocks):
            offsets = (h.base_offset + cols.offset_delta.astype("int64")).tolist()
            nulls = cols.value_null().tolist()
            keep = []
            for i, (key, off) in enumerate(zip(_keys(cols), offsets)):
                if off < earliest or off >= end or (bi == last_batch and i == cols.n - 1):
                    keep.append(i)
                elif latest.get(key) == off:
                    if nulls[i] and h.store_ts < expire_before and key not in pinned:
                        continue        # an expired tombstone: the delete is old news
                    if nulls[i]:
                        expiry = h.store_ts + p.delete_retention_ms
                        next_expiry = expiry if not next_expiry else min(next_expiry, expiry)
                    keep.append(i)
            seg_dropped += cols.n - len(keep)
            if len(keep) == cols.n:
                frames.append(data[h.position:h.position + h.size])
            elif keep:
                frames.append(framing.frame_batch(h.base_offset, h.store_ts, len(keep), h.apply_position,
                                                records.select(cols, keep)))
        if not seg_dropped:
            continue
        if ql.replace_segment(seg, frames):
            rewritten += 1
            dropped += seg_dropped
    if rewritten:
        log.info("compacted %s below %d: %d records dropped in %d segments",
                 ql.path, end, dropped, rewritten)
    return CompactionResult(end, rewritten, dropped, next_expiry)
