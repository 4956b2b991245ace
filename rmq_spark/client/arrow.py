"""Fetched batches -> Arrow, column by column, with no per-message Python.

The schema is the Spark source's (``SCHEMA`` below). Each stored batch's
columnar records block maps onto Arrow buffers directly: value/key/tags
offsets and data become binary/string arrays, properties a map array,
offsets and timestamps are numpy arithmetic on the batch header. A tombstone
(null value) is a null ``value`` cell, an absent key a null ``key`` cell.
"""
from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa

from storage_service import codec, records

__all__ = ["ARROW_SCHEMA", "SPARK_DDL", "batches_to_arrow", "empty_batch"]

ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("queue", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")),
    ("born_timestamp", pa.timestamp("us", tz="UTC")), ("tags", pa.string()),
    ("properties", pa.map_(pa.string(), pa.string())), ("msg_id", pa.string()),
])
SPARK_DDL = ("key binary, value binary, topic string, queue int, offset long, timestamp timestamp, "
             "born_timestamp timestamp, tags string, properties map<string,string>, msg_id string")
_HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8)
_SHIFTS = np.arange(60, -4, -4, dtype=np.int64)


def _buf(mv) -> pa.Buffer:
    return pa.py_buffer(mv)


def _var(typ, n: int, off: np.ndarray, data, validity: pa.Buffer | None = None) -> pa.Array:
    return pa.Array.from_buffers(typ, n, [validity, _buf(off), _buf(data)])


def _validity(valid: np.ndarray) -> pa.Buffer | None:
    """An Arrow validity bitmap, or None when every slot is valid."""
    return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


def _constant_strings(text: str, n: int) -> pa.Array:
    raw = text.encode()
    off = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(pa.string(), n, [None, _buf(off), pa.py_buffer(raw * n)])


def _msg_ids(topic: str, queue: int, offsets: np.ndarray) -> pa.Array:
    """``msg_id(topic, queue, offset)`` of rmq_spark.client, vectorised."""
    n = len(offsets)
    prefix = np.frombuffer(f"{zlib.crc32(topic.encode()):08X}{queue:04X}".encode(), np.uint8)
    digits = _HEX[(offsets[:, None] >> _SHIFTS) & 0xF]
    chars = np.hstack([np.broadcast_to(prefix, (n, len(prefix))), digits]).astype(np.uint8)
    width = chars.shape[1]
    off = np.arange(n + 1, dtype=np.int32) * width
    return pa.Array.from_buffers(pa.string(), n, [None, _buf(off), pa.py_buffer(chars.tobytes())])


def _block_to_arrow(h: codec.BatchHeader, c: records.Columns, topic: str, queue: int) -> pa.RecordBatch:
    n = c.n
    offsets = h.base_offset + c.offset_delta.astype(np.int64)
    key_valid, value_valid = _validity(c.has_key()), _validity(~c.value_null())
    props = pa.MapArray.from_arrays(pa.array(c.prop_off, pa.int32()),
                                    _var(pa.string(), len(c.pk_off) - 1, c.pk_off, c.pk_data),
                                    _var(pa.string(), len(c.pv_off) - 1, c.pv_off, c.pv_data))
    cols = [
        _var(pa.binary(), n, c.key_off, c.key_data, key_valid),
        _var(pa.binary(), n, c.value_off, c.value_data, value_valid),
        _constant_strings(topic, n),
        pa.array(np.full(n, queue, np.int32)),
        pa.array(offsets),
        pa.array(np.full(n, h.store_ts * 1000, np.int64)).cast(ARROW_SCHEMA.field("timestamp").type),
        pa.array(c.born_ts.astype(np.int64) * 1000).cast(ARROW_SCHEMA.field("born_timestamp").type),
        _var(pa.string(), n, c.tags_off, c.tags_data),
        props,
        _msg_ids(topic, queue, offsets),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=ARROW_SCHEMA)


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)


def _concat_var(parts: list[tuple[np.ndarray, memoryview]]) -> tuple[np.ndarray, bytes]:
    """One (offsets, data) pair out of several variable-length columns, in order."""
    lens = np.fromiter((int(off[-1]) for off, _ in parts), np.int64, len(parts))
    bases = np.concatenate([[0], np.cumsum(lens)])
    off = np.concatenate([off[:-1].astype(np.int64) + base for (off, _), base in zip(parts, bases)]
                         + [bases[-1:]]).astype(np.int32)
    return off, b"".join(data for _, data in parts)


def _blocks_to_arrow(blocks: list[tuple[codec.BatchHeader, records.Columns]], topic: str,
                     queue: int) -> pa.RecordBatch:
    """Several stored batches as one RecordBatch, built once per column (not per batch:
    a fetch holds hundreds of batches, and per-batch Arrow arrays plus a concatenation
    cost more than the data)."""
    counts = [c.n for _, c in blocks]
    n = sum(counts)
    offsets = np.concatenate([h.base_offset + c.offset_delta.astype(np.int64) for h, c in blocks])
    store_us = np.repeat(np.fromiter((h.store_ts for h, _ in blocks), np.int64, len(blocks)), counts) * 1000
    born_us = np.concatenate([c.born_ts for _, c in blocks]).astype(np.int64) * 1000
    flags = np.concatenate([c.flags for _, c in blocks])
    key_off, key_data = _concat_var([(c.key_off, c.key_data) for _, c in blocks])
    value_off, value_data = _concat_var([(c.value_off, c.value_data) for _, c in blocks])
    tags_off, tags_data = _concat_var([(c.tags_off, c.tags_data) for _, c in blocks])
    prop_off, _ = _concat_var([(c.prop_off, b"") for _, c in blocks])
    pk_off, pk_data = _concat_var([(c.pk_off, c.pk_data) for _, c in blocks])
    pv_off, pv_data = _concat_var([(c.pv_off, c.pv_data) for _, c in blocks])
    m = int(prop_off[-1])
    props = pa.MapArray.from_arrays(pa.array(prop_off, pa.int32()),
                                    _var(pa.string(), m, pk_off, pk_data),
                                    _var(pa.string(), m, pv_off, pv_data))
    cols = [
        _var(pa.binary(), n, key_off, key_data, _validity((flags & records.FLAG_KEY) != 0)),
        _var(pa.binary(), n, value_off, value_data, _validity((flags & records.FLAG_NULL_VALUE) == 0)),
        _constant_strings(topic, n),
        pa.array(np.full(n, queue, np.int32)),
        pa.array(offsets),
        pa.array(store_us).cast(ARROW_SCHEMA.field("timestamp").type),
        pa.array(born_us).cast(ARROW_SCHEMA.field("born_timestamp").type),
        _var(pa.string(), n, tags_off, tags_data),
        props,
        _msg_ids(topic, queue, offsets),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=ARROW_SCHEMA)


def batches_to_arrow(buf: bytes, topic: str, queue: int, start: int = 0,
                     end: int | None = None) -> pa.RecordBatch:
    """All records of the fetched ``buf`` with start <= offset < end, as one RecordBatch."""
    blocks = [(h, cols) for h, cols in codec.iter_blocks(buf)
              if h.last_offset >= start and (end is None or h.base_offset < end)]
    if not blocks:
        return empty_batch()
    rb = (_block_to_arrow(*blocks[0], topic, queue) if len(blocks) == 1
          else _blocks_to_arrow(blocks, topic, queue))
    first, last = blocks[0][0], blocks[-1][0]
    if first.base_offset < start or (end is not None and last.last_offset >= end):
        offs = rb.column(4).to_numpy()
        i0 = int(np.searchsorted(offs, start))
        i1 = len(offs) if end is None else int(np.searchsorted(offs, end))
        rb = rb.slice(i0, i1 - i0)
    return rb
