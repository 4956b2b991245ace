"""Record-batch framing: the one codec for batch bytes on disk and on the wire.

A *batch* is what one produce call appends to one queue. It is stored, fetched
and replicated as one unit, so the per-message work on the hot path is done
once by the producer (building the records block) and never again:

    batch   = u32 body_len | u32 crc32c(body) | body
    body    = u64 base_offset | i64 store_ts | u32 count | u64 position | records

``records`` is a columnar block (``storage_service.records``). ``position`` is
where the batch was applied (raft index and item number, see
``state.apply_position``); it makes re-applying a replayed raft entry a no-op.
All integers are little-endian.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator

from . import records

__all__ = ["BATCH_HEADER", "BODY_HEADER", "BatchHeader", "CorruptBatch", "frame_batch", "frame_parts",
           "header_at", "iter_batches", "iter_blocks", "iter_records_from", "next_offset", "records_of",
           "records_start", "scan_valid_prefix"]

BATCH_HEADER = struct.Struct("<II")          # body_len, crc
BODY_HEADER = struct.Struct("<QqIQ")         # base_offset, store_ts, count, position
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


def frame_batch(base_offset: int, store_ts: int, count: int, position: int,
                block: bytes) -> bytes:
    """Wrap a records block into a framed, checksummed batch."""
    return b"".join(frame_parts(base_offset, store_ts, count, position, block))


def frame_parts(base_offset: int, store_ts: int, count: int, position: int,
                block: bytes) -> tuple[bytes, bytes, bytes]:
    """``frame_batch`` as (frame header, body header, block), for ``os.writev``.

    The block is not copied: a 100 KiB concatenation costs a fresh buffer
    (page faults, a copy) per batch on the apply path.
    """
    import crc32c       # see _parse_header

    head = BODY_HEADER.pack(base_offset, store_ts, count, position)
    crc = crc32c.crc32c(block, crc32c.crc32c(head))
    return BATCH_HEADER.pack(len(head) + len(block), crc), head, block


def _parse_header(buf, pos: int, verify: bool) -> BatchHeader:
    # No view of ``buf`` outlives this call, even when it raises: ``buf`` may be
    # an mmap, which cannot be closed while a view of it exists.
    if pos + BATCH_HEADER.size > len(buf):
        raise CorruptBatch(pos, "truncated frame header")
    body_len, crc = BATCH_HEADER.unpack_from(buf, pos)
    if body_len < BODY_HEADER.size or body_len > MAX_BATCH_BYTES:
        raise CorruptBatch(pos, f"bad body length {body_len}")
    start = pos + BATCH_HEADER.size
    end = start + body_len
    if end > len(buf):
        raise CorruptBatch(pos, "truncated body")
    if verify:
        # Imported here, not with this module: crc32c's import looks its own version
        # up in every sys.path entry, and a Spark Python process has Spark's zips and
        # spark-core's jar first (0.07-0.18 s in every streaming query's driver-side
        # source process, which plans and never verifies a batch).
        import crc32c

        with memoryview(buf) as whole:
            ok = crc32c.crc32c(whole[start:end]) == crc
        if not ok:
            raise CorruptBatch(pos, "crc mismatch")
    base, ts, count, apply_pos = BODY_HEADER.unpack_from(buf, start)
    if count == 0:
        raise CorruptBatch(pos, "empty batch")
    try:
        last = base + records.last_delta(buf, count, start + BODY_HEADER.size, end)
    except ValueError as e:
        raise CorruptBatch(pos, str(e)) from None
    return BatchHeader(pos, end - pos, base, ts, count, apply_pos, last)


def header_at(buf, pos: int, verify: bool = False) -> BatchHeader:
    """The header of the batch at ``pos``, its lengths checked (and its CRC if ``verify``)."""
    return _parse_header(buf, pos, verify)


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


def next_offset(buf: bytes | memoryview, default: int) -> int:
    """The offset after the last batch in ``buf`` (``default`` when it is empty)."""
    nxt = default
    for h in iter_batches(buf, verify=False):
        nxt = h.next_offset
    return nxt


def records_start(h: BatchHeader) -> int:
    """Where the records block of the batch ``h`` starts in its buffer."""
    return h.position + BATCH_HEADER.size + BODY_HEADER.size


def records_of(buf: bytes | memoryview, h: BatchHeader) -> memoryview:
    """The records block of the batch ``h`` in ``buf``."""
    return memoryview(buf)[records_start(h):h.position + h.size]


def iter_blocks(buf: bytes | memoryview,
                deep_check: bool = True) -> Iterator[tuple[BatchHeader, records.Columns]]:
    """Every batch in ``buf`` with its parsed records block.

    Every batch's CRC is verified. ``deep_check=False`` then checks each block's
    section bounds only, not its contents (``records.parse(check=False)``): for
    readers of batches the service stored, which it checked in full when they
    were produced.
    """
    for h in iter_batches(buf):
        try:
            cols = records.parse(records_of(buf, h), h.count, deep_check)
        except ValueError as e:
            raise CorruptBatch(h.position, str(e)) from None
        yield h, cols


def iter_records_from(buf: bytes | memoryview, start: int):
    """(offset, store_ts, key, value, tags, properties, born_ts) of every record in
    ``buf`` (batches the service stored) at or after offset ``start``, in order."""
    for h, cols in iter_blocks(buf, deep_check=False):
        if h.last_offset < start:
            continue
        for delta, key, value, tags, props, born in records.iter_rows(cols):
            off = h.base_offset + delta
            if off >= start:
                yield off, h.store_ts, key, value, tags, props, born
