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

from storage_service.protocol import framing, records

__all__ = ["ARROW_SCHEMA", "SPARK_DDL", "HEADERS_FIELD", "batches_to_arrow", "empty_batch",
           "with_headers"]

ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("queue", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")),
    ("born_timestamp", pa.timestamp("us", tz="UTC")), ("tags", pa.string()),
    ("properties", pa.map_(pa.string(), pa.string())), ("msg_id", pa.string()),
])
SPARK_DDL = ("key binary, value binary, topic string, queue int, offset long, timestamp timestamp, "
             "born_timestamp timestamp, tags string, properties map<string,string>, msg_id string")
# Kafka's ``headers`` column (``includeHeaders``), read right after ``properties``.
HEADERS_FIELD = pa.field("headers", pa.list_(pa.field(
    "element", pa.struct([("key", pa.string()), ("value", pa.binary())]))))
_HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8)
_SHIFTS = np.arange(60, -4, -4, dtype=np.int64)


def _buf(mv) -> pa.Buffer:
    return pa.py_buffer(mv)


def _var(typ, n: int, off: np.ndarray, data, validity: pa.Buffer | None = None) -> pa.Array:
    return pa.Array.from_buffers(typ, n, [validity, _buf(off), _buf(data)])


def _fixed(typ, values: np.ndarray, dtype) -> pa.Array:
    """A fixed-width column over ``values``' memory. (``pa.array`` of a numpy array
    imports pandas, 0.3 s, to ask whether it is a Series: in every Python worker
    and in the driver-side runner each streaming query starts.)"""
    values = np.ascontiguousarray(values, dtype)
    return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])


def _numpy(arr: pa.Array, dtype) -> np.ndarray:
    """A fixed-width array without nulls as a numpy view of its memory (``to_numpy``
    imports pandas too, whatever the array)."""
    return np.frombuffer(arr.buffers()[1], dtype, arr.offset + len(arr))[arr.offset:]


def _is_null(arr: pa.Array) -> np.ndarray:
    """Which slots of ``arr`` are null, from its validity bitmap (see ``_numpy``)."""
    validity = arr.buffers()[0]
    if validity is None or not arr.null_count:
        return np.zeros(len(arr), bool)
    bits = np.unpackbits(np.frombuffer(validity, np.uint8), count=arr.offset + len(arr), bitorder="little")
    return bits[arr.offset:] == 0


def _bitmap(bits: np.ndarray) -> pa.Buffer:
    """Booleans as an Arrow bitmap (least significant bit first)."""
    return pa.py_buffer(np.packbits(bits, bitorder="little"))


def _validity(valid: np.ndarray) -> pa.Buffer | None:
    """An Arrow validity bitmap, or None when every slot is valid."""
    return None if valid.all() else _bitmap(valid)


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


def _to_arrow(headers: list[framing.BatchHeader], c: records.Columns, topic: str,
              queue: int) -> pa.RecordBatch:
    """The stored batches ``headers`` (their records concatenated in ``c``) as one
    RecordBatch, built once per column."""
    counts = [h.count for h in headers]
    n = c.n
    bases = np.fromiter((h.base_offset for h in headers), np.int64, len(headers))
    offsets = np.repeat(bases, counts) + c.offset_delta
    store_us = np.repeat(np.fromiter((h.store_ts for h in headers), np.int64, len(headers)),
                         counts) * 1000
    m = int(c.prop_off[-1])
    props = pa.MapArray.from_arrays(_fixed(pa.int32(), c.prop_off, np.int32),
                                    _var(pa.string(), m, c.pk_off, c.pk_data),
                                    _var(pa.string(), m, c.pv_off, c.pv_data))
    cols = [
        _var(pa.binary(), n, c.key_off, c.key_data, _validity(c.has_key())),
        _var(pa.binary(), n, c.value_off, c.value_data, _validity(~c.value_null())),
        _constant_strings(topic, n),
        _fixed(pa.int32(), np.full(n, queue, np.int32), np.int32),
        _fixed(pa.int64(), offsets, np.int64),
        _fixed(ARROW_SCHEMA.field("timestamp").type, store_us, np.int64),
        _fixed(ARROW_SCHEMA.field("born_timestamp").type, c.born_ts * 1000, np.int64),
        _var(pa.string(), n, c.tags_off, c.tags_data),
        props,
        _msg_ids(topic, queue, offsets),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=ARROW_SCHEMA)


def with_headers(rb: pa.RecordBatch) -> pa.RecordBatch:
    """``rb`` with a ``headers`` column inserted after ``properties``: each property
    as a ``{key, value}`` entry (value: the property's UTF-8 bytes), in stored order.

    Built from the map column's offsets and children, with no per-row Python. A
    message without properties has null headers, as in Spark's Kafka source.
    """
    at = rb.schema.get_field_index("properties")
    props = rb.column(at)
    offsets = _numpy(props.offsets, np.int32)
    lo, n = int(offsets[0]), int(offsets[-1] - offsets[0])    # ``props`` may be a slice
    entries = pa.StructArray.from_arrays(
        [props.keys.slice(lo, n), props.items.slice(lo, n).cast(pa.binary())], ["key", "value"])
    none = (np.diff(offsets) == 0) | _is_null(props)
    headers = pa.ListArray.from_arrays(_fixed(pa.int32(), offsets - lo, np.int32), entries,
                                       type=HEADERS_FIELD.type,
                                       mask=pa.Array.from_buffers(pa.bool_(), len(none),
                                                                  [None, _bitmap(none)]))
    return rb.add_column(at + 1, HEADERS_FIELD, headers)


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)


def _check_span(every: list[framing.BatchHeader], start: int, expect_next: int) -> None:
    """Bytes read from a file (``localread``) are the batches the node located: they
    follow one another, the first holds ``start`` or the next offset after it, and
    the last ends where the node said."""
    where = every[0].position if every else 0
    if not every or every[0].last_offset < start or every[-1].next_offset != expect_next:
        raise framing.CorruptBatch(where, f"the batches read end at "
                                 f"{every[-1].next_offset if every else None}, not at "
                                 f"{expect_next}, or miss offset {start}")
    for a, b in zip(every, every[1:]):
        if b.base_offset <= a.last_offset:
            raise framing.CorruptBatch(b.position, "batches out of order")


def batches_to_arrow(buf: bytes, topic: str, queue: int, start: int = 0,
                     end: int | None = None, expect_next: int | None = None) -> pa.RecordBatch:
    """All records of the fetched ``buf`` with start <= offset < end, as one RecordBatch.

    ``expect_next``: ``buf`` was read from a segment file, and must hold exactly
    the batches the node located (``_check_span``); CorruptBatch if not.
    """
    every = list(framing.iter_batches(buf))               # CRC-checked
    if expect_next is not None:
        _check_span(every, start, expect_next)
    headers = [h for h in every
               if h.last_offset >= start and (end is None or h.base_offset < end)]
    if not headers:
        return empty_batch()
    try:
        cols = records.concat(buf, [(framing.records_start(h), h.position + h.size, h.count)
                                    for h in headers])
    except ValueError as e:
        raise framing.CorruptBatch(headers[0].position, str(e)) from None
    rb = _to_arrow(headers, cols, topic, queue)
    first, last = headers[0], headers[-1]
    if first.base_offset < start or (end is not None and last.last_offset >= end):
        offs = _numpy(rb.column(4), np.int64)
        i0 = int(np.searchsorted(offs, start))
        i1 = len(offs) if end is None else int(np.searchsorted(offs, end))
        rb = rb.slice(i0, i1 - i0)
    return rb
