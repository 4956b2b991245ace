"""Record-batch framing: the one codec for bytes on disk and on the wire.

A *batch* is what one produce call appends to one queue. It is stored, fetched
and replicated as one unit, so the per-message work on the hot path is done
once by the producer side (building the records blob) and never again:

    batch   = u32 body_len | u32 crc32c(body) | body
    body    = u64 base_offset | i64 store_ts | u32 count | u64 position | records

``position`` is where the batch was applied (raft index and item number, see
``state.apply_position``); it makes re-applying a replayed raft entry a no-op.
    records = (u32 offset_delta | u32 msg_len | Message protobuf bytes) * count

``offset_delta`` makes room for compaction, which may drop records from a
batch without renumbering the survivors. All integers are little-endian.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator, Sequence

import crc32c

__all__ = [
    "BATCH_HEADER", "BODY_HEADER", "RECORD_HEADER", "BatchHeader", "CorruptBatch",
    "encode_records", "frame_batch", "iter_batches", "iter_records", "scan_valid_prefix",
]

BATCH_HEADER = struct.Struct("<II")          # body_len, crc
BODY_HEADER = struct.Struct("<QqIQ")         # base_offset, store_ts, count, position
RECORD_HEADER = struct.Struct("<II")         # offset_delta, msg_len
MAX_BATCH_BYTES = 1 << 30


class CorruptBatch(ValueError):
    """Raised when framed bytes fail their length or CRC check."""

    def __init__(self, position: int, reason: str):
        super().__init__(f"corrupt record batch at byte {position}: {reason}")
        self.position = position
        self.reason = reason


@dataclass(frozen=True, slots=True)
class BatchHeader:
    position: int        # byte position of the batch frame in the buffer
    size: int            # whole frame size (header + body)
    base_offset: int
    store_ts: int
    count: int
    apply_position: int  # raft index + item number that appended it
    last_offset: int     # offset of the last record in the batch

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


def encode_records(messages: Sequence[bytes]) -> bytes:
    """Frame serialized Message protobufs as a records blob, offset deltas 0..n-1."""
    pack = RECORD_HEADER.pack
    parts = []
    for i, m in enumerate(messages):
        parts.append(pack(i, len(m)))
        parts.append(m)
    return b"".join(parts)


def frame_batch(base_offset: int, store_ts: int, count: int, position: int,
                records: bytes) -> bytes:
    """Wrap a records blob into a framed, checksummed batch."""
    body = BODY_HEADER.pack(base_offset, store_ts, count, position) + records
    return BATCH_HEADER.pack(len(body), crc32c.crc32c(body)) + body


def _last_delta(records: memoryview | bytes, count: int) -> int:
    """Offset delta of the last record; ValueError if the records overrun the body."""
    pos, delta = 0, 0
    for _ in range(count):
        if pos + RECORD_HEADER.size > len(records):
            raise ValueError("record header past the end of the batch")
        delta, n = RECORD_HEADER.unpack_from(records, pos)
        pos += RECORD_HEADER.size + n
        if pos > len(records):
            raise ValueError("record body past the end of the batch")
    return delta


def _parse_header(buf, pos: int, verify: bool) -> BatchHeader:
    if pos + BATCH_HEADER.size > len(buf):
        raise CorruptBatch(pos, "truncated frame header")
    body_len, crc = BATCH_HEADER.unpack_from(buf, pos)
    if body_len < BODY_HEADER.size or body_len > MAX_BATCH_BYTES:
        raise CorruptBatch(pos, f"bad body length {body_len}")
    start = pos + BATCH_HEADER.size
    end = start + body_len
    if end > len(buf):
        raise CorruptBatch(pos, "truncated body")
    body = memoryview(buf)[start:end]
    if verify and crc32c.crc32c(body) != crc:
        raise CorruptBatch(pos, "crc mismatch")
    base, ts, count, apply_pos = BODY_HEADER.unpack_from(body, 0)
    if count == 0:
        raise CorruptBatch(pos, "empty batch")
    try:
        last = base + _last_delta(body[BODY_HEADER.size:], count)
    except ValueError as e:
        raise CorruptBatch(pos, str(e)) from None
    return BatchHeader(pos, end - pos, base, ts, count, apply_pos, last)


def iter_batches(buf: bytes | memoryview, verify: bool = True) -> Iterator[BatchHeader]:
    """Yield the header of every batch in ``buf``; raise CorruptBatch on bad bytes."""
    pos = 0
    while pos < len(buf):
        h = _parse_header(buf, pos, verify)
        yield h
        pos += h.size


def scan_valid_prefix(buf: bytes | memoryview) -> tuple[int, list[BatchHeader]]:
    """Return (length of the longest valid prefix, its batch headers).

    Used by recovery: everything after the first torn or corrupt batch is cut.
    """
    headers: list[BatchHeader] = []
    pos = 0
    while pos < len(buf):
        try:
            h = _parse_header(buf, pos, True)
        except CorruptBatch:
            break
        headers.append(h)
        pos += h.size
    return pos, headers


def iter_records(buf: bytes | memoryview, min_offset: int = 0
                 ) -> Iterator[tuple[int, int, memoryview]]:
    """Yield (offset, store_ts, message bytes) for each record at or above min_offset."""
    mv = memoryview(buf)
    for h in iter_batches(mv):
        if h.last_offset < min_offset:
            continue
        pos = h.position + BATCH_HEADER.size + BODY_HEADER.size
        for _ in range(h.count):
            delta, n = RECORD_HEADER.unpack_from(mv, pos)
            pos += RECORD_HEADER.size
            off = h.base_offset + delta
            if off >= min_offset:
                yield off, h.store_ts, mv[pos:pos + n]
            pos += n
