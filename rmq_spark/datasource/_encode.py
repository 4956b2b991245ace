"""Arrow rows -> the service's columnar records block, with no per-row Python.

The records block (``storage_service/records.py``) stores each variable-size
column as int32 offsets + bytes, which is exactly Arrow's binary layout, so
a block is a concatenation of (rebased) Arrow buffers. The input is a
*normalized* batch (``normalize``): value binary (nullable: a null value is a
tombstone), key binary (nullable), tags string, properties map<string,string>,
born int64 ms.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage_service.protocol.records import FLAG_KEY, FLAG_NULL_VALUE

__all__ = ["NORMALIZED", "normalize_columns", "encode_block", "row_sizes"]

NORMALIZED = pa.schema([("value", pa.binary()), ("key", pa.binary()), ("tags", pa.string()),
                        ("properties", pa.map_(pa.string(), pa.string())),
                        ("born", pa.int64())])
_I32 = np.dtype("<i4")
_ROW_OVERHEAD = 32   # offset delta, born ts, flags and five offsets per row in the block


def _binary(arr: pa.Array, typ: pa.DataType = pa.binary()) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return arr if arr.type == typ else arr.cast(typ)


def normalize_columns(value: pa.Array, key: pa.Array | None, tags: pa.Array | None,
                      properties: pa.Array | None, born: pa.Array | None,
                      now_ms: int) -> pa.RecordBatch:
    """Bring the sink's input columns to the ``NORMALIZED`` schema (nulls filled)."""
    n = len(value)
    key = _binary(key) if key is not None else pa.nulls(n, pa.binary())
    tags = pc.fill_null(_binary(tags, pa.string()), "") if tags is not None else _empty_strings(n)
    if properties is None or properties.null_count:
        properties = _fill_maps(properties, n)
    if born is None:
        born = pa.array(np.full(n, now_ms, np.int64))
    else:
        if pa.types.is_timestamp(born.type):
            born = pc.divide(born.cast(pa.timestamp("us")).cast(pa.int64()), 1000)
        born = pc.fill_null(born.cast(pa.int64()), now_ms)
    return pa.RecordBatch.from_arrays([_binary(value), key, tags, properties, born],
                                      schema=NORMALIZED)


def _empty_strings(n: int) -> pa.Array:
    zeros = pa.py_buffer(np.zeros(n + 1, _I32).tobytes())
    return pa.Array.from_buffers(pa.string(), n, [None, zeros, pa.py_buffer(b"")])


def _fill_maps(properties: pa.Array | None, n: int) -> pa.Array:
    """Null maps -> empty maps (rare: only then a Python pass)."""
    typ = NORMALIZED.field("properties").type
    if properties is None:
        return pa.array([[]] * n, typ)
    return pa.array([m if m is not None else [] for m in properties.to_pylist()], typ)


def _rebased(arr: pa.Array) -> tuple[np.ndarray, memoryview]:
    """(offsets starting at 0, data bytes) of a binary/string array or slice."""
    bufs = arr.buffers()
    off = np.frombuffer(bufs[1], _I32, len(arr) + 1, arr.offset * 4)
    lo, hi = int(off[0]), int(off[-1])
    data = memoryview(bufs[2])[lo:hi] if bufs[2] is not None else memoryview(b"")
    return (off - lo if lo else off), data


def _var_part(arr: pa.Array) -> list:
    off, data = _rebased(arr)
    return [off.astype(_I32, copy=False).tobytes(), data]


def _map_parts(props: pa.MapArray) -> list:
    off = props.offsets.to_numpy().astype(_I32)
    lo, hi = int(off[0]), int(off[-1])
    keys = props.keys.slice(lo, hi - lo)
    items = pc.fill_null(props.items.slice(lo, hi - lo), "")
    return [(off - lo).tobytes(), *_var_part(keys), *_var_part(items)]


def _flags(key: pa.Array, value: pa.Array) -> np.ndarray:
    """records' flags column: FLAG_KEY for a non-null key, FLAG_NULL_VALUE for a null value."""
    flags = key.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8) * np.uint8(FLAG_KEY)
    if value.null_count:
        flags |= value.is_null().to_numpy(zero_copy_only=False).astype(np.uint8) * np.uint8(FLAG_NULL_VALUE)
    return flags


def _without_nulls(arr: pa.Array) -> pa.Array:
    """Null cells -> empty ones: the block stores no bytes for them (Arrow may hold some)."""
    return pc.if_else(arr.is_valid(), arr, pa.scalar(b"", pa.binary())) if arr.null_count else arr


def encode_block(batch: pa.RecordBatch) -> bytes:
    """A normalized batch -> records block (``storage_service.protocol.records`` layout)."""
    n = batch.num_rows
    value, key, tags, props, born = batch.columns
    flags = _flags(key, value)
    parts = [np.arange(n, dtype="<u4").tobytes(),
             born.to_numpy(zero_copy_only=False).astype("<i8").tobytes(),
             flags.tobytes(), *_var_part(_without_nulls(key)), *_var_part(_without_nulls(value)),
             *_var_part(tags),
             *_map_parts(props)]
    return b"".join(parts)


def row_sizes(batch: pa.RecordBatch) -> np.ndarray:
    """Bytes each row takes in a block (for cutting chunks)."""
    value, key, tags, props, _ = batch.columns
    size = _lengths(value) + _lengths(key) + _lengths(tags) + _ROW_OVERHEAD
    off = props.offsets.to_numpy().astype(np.int64)
    lo, hi = int(off[0]), int(off[-1])
    if hi > lo:
        entry = _lengths(props.keys.slice(lo, hi - lo)) + _lengths(props.items.slice(lo, hi - lo))
        cum = np.concatenate([[0], np.cumsum(entry)])
        size = size + cum[off[1:] - lo] - cum[off[:-1] - lo]
    return size


def _lengths(arr: pa.Array) -> np.ndarray:
    return pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
