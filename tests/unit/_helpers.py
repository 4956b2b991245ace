"""Small helpers for unit tests that only care about message values.

Most storage tests build batches of plain values and read them back; the
columnar records block (``storage_service.protocol.records``) carries far more than
that, so these two functions keep the tests about what they test.
"""
from __future__ import annotations

from typing import Iterator

from storage_service.protocol import framing, records


def encode_values(values: list[bytes]) -> bytes:
    """A records block holding ``values`` (no keys, tags or properties; deltas 0..n-1)."""
    return records.encode(values)


def iter_values(buf: bytes | memoryview, min_offset: int = 0) -> Iterator[tuple[int, int, bytes]]:
    """Yield (offset, store_ts, value) for every record in ``buf`` at or above ``min_offset``.

    Every batch is parsed (``framing.iter_blocks``), so a malformed block raises
    ``CorruptBatch`` even when all its records lie below ``min_offset``.
    """
    for h, cols in framing.iter_blocks(buf):
        if h.last_offset < min_offset:
            continue
        for delta, _key, value, _tags, _props, _born in records.iter_rows(cols):
            offset = h.base_offset + delta
            if offset >= min_offset:
                yield offset, h.store_ts, value
