"""The records block of a batch: messages stored column by column.

A batch's records are not a sequence of serialized messages but columns, so
a reader turns a whole batch into Arrow arrays with a handful of numpy calls
(no per-message Python), and the service validates a produced block in O(1)
Python steps. Layout for n records (little-endian, no padding)::

    offset_delta  u32[n]      offset - batch base offset (gaps after compaction)
    born_ts       i64[n]      producer timestamp, ms
    flags         u8[n]       bit0 (FLAG_KEY): has a key; bit1 (FLAG_NULL_VALUE): the
                              value is null, a tombstone (its value bytes are empty)
    key_off       i32[n+1]    key_data      bytes
    value_off     i32[n+1]    value_data    bytes
    tags_off      i32[n+1]    tags_data     utf-8
    prop_off      i32[n+1]    property entries per message, cumulative
    pk_off        i32[m+1]    pk_data       property keys, utf-8
    pv_off        i32[m+1]    pv_data       property values, utf-8

Every ``*_off`` array starts at 0 and is non-decreasing; its last value is the
length of the data that follows it (``m`` = prop_off[n]).

The flags byte was ``key_valid`` (0/1) before tombstones existed: stored
blocks read the same, since bit0 kept its meaning and bit1 was never set.
A null value (Kafka's delete marker) and an empty value are different things.
"""
from __future__ import annotations

import bisect
import functools
import struct
from dataclasses import dataclass
from itertools import accumulate
from typing import Iterator, Mapping, Sequence

import numpy as np

__all__ = ["Columns", "FLAG_KEY", "FLAG_NULL_VALUE", "concat", "encode", "parse", "last_delta",
           "min_block_size", "iter_rows", "select", "sound_single"]

_I32 = np.dtype("<i4")
_U32 = np.dtype("<u4")
_I64 = np.dtype("<i8")
FLAG_KEY = 1
FLAG_NULL_VALUE = 2
_KNOWN_FLAGS = FLAG_KEY | FLAG_NULL_VALUE
_LEN = struct.Struct("<i")
_LAST_DELTA = struct.Struct("<I")       # an offset_delta entry, read without parsing
_MAX_I32 = (1 << 31) - 1
_SINGLE_HEAD = struct.Struct("<IqBii")  # one record: offset_delta, born_ts, flags, key_off[0..1]
_PAIR = struct.Struct("<ii")            # a column's offsets [0, length] for one record
_NO_PROPERTIES = struct.Struct("<iiii")  # prop_off [0, 0], pk_off [0], pv_off [0]


@dataclass(frozen=True)
class Columns:
    """A parsed records block: numpy views into the block's bytes."""
    n: int
    offset_delta: np.ndarray
    born_ts: np.ndarray
    flags: np.ndarray
    key_off: np.ndarray
    key_data: memoryview
    value_off: np.ndarray
    value_data: memoryview
    tags_off: np.ndarray
    tags_data: memoryview
    prop_off: np.ndarray
    pk_off: np.ndarray
    pk_data: memoryview
    pv_off: np.ndarray
    pv_data: memoryview
    size: int                      # bytes of the block

    def has_key(self) -> np.ndarray:
        """bool[n]: the message has a key (possibly empty)."""
        return (self.flags & FLAG_KEY) != 0

    def value_null(self) -> np.ndarray:
        """bool[n]: the value is null (a tombstone), not merely empty."""
        return (self.flags & FLAG_NULL_VALUE) != 0

    def message_sizes(self) -> np.ndarray:
        """Bytes of each message's key + value + tags + properties."""
        sizes = np.diff(self.value_off)
        # Empty columns (the common producer batch has only values) add nothing.
        if self.key_off[-1]:
            sizes += np.diff(self.key_off)
        if self.tags_off[-1]:
            sizes += np.diff(self.tags_off)
        if self.prop_off[-1]:
            sizes += np.diff(self.pk_off[self.prop_off]) + np.diff(self.pv_off[self.prop_off])
        return sizes


def _offsets(lengths) -> bytes:
    return np.fromiter(accumulate(lengths, initial=0), dtype=_I32).tobytes()


def _column(items: Sequence[bytes]) -> tuple[bytes, bytes]:
    """(offsets, data) of a bytes column; an all-empty column costs no per-item Python."""
    data = b"".join(items)
    if not data:
        return bytes(4 * (len(items) + 1)), b""
    return _offsets(map(len, items)), data


def _flags(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None) -> bytes:
    """The flags column; no pass per message when no key is set and no value is null."""
    n = len(values)
    has_keys = keys is not None and any(k is not None for k in keys)
    has_nulls = None in values
    if not has_keys and not has_nulls:
        return bytes(n)
    flags = np.zeros(n, np.uint8)
    if has_keys:
        flags |= np.fromiter((k is not None for k in keys), np.uint8, n) * np.uint8(FLAG_KEY)
    if has_nulls:
        flags |= np.fromiter((v is None for v in values), np.uint8, n) * np.uint8(FLAG_NULL_VALUE)
    return flags.tobytes()


def encode(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None,
           tags: Sequence[str] | None = None, properties: Sequence[Mapping[str, str]] | None = None,
           born_ts: Sequence[int] | None = None, offset_deltas: Sequence[int] | None = None) -> bytes:
    """Encode n messages given as columns (None columns mean empty/absent).

    A ``None`` in ``values`` is a null value (a tombstone), stored with no bytes.
    """
    n = len(values)
    # The common producer batch has no keys, tags, properties or null values:
    # those columns are checked once and encoded without a pass per message.
    flags = _flags(values, keys)
    if keys is None or not any(k is not None for k in keys):
        key_col = (bytes(4 * (n + 1)), b"")
    else:
        key_col = _column([k or b"" for k in keys])
    value_col = _column([v or b"" for v in values]) if None in values else _column(values)
    if tags is None or not any(tags):
        tags_col = (bytes(4 * (n + 1)), b"")
    else:
        tags_col = _column([t.encode() for t in tags])
    if properties is None or not any(properties):
        prop_cols = [bytes(4 * (n + 1)), bytes(4), bytes(4)]
    else:
        pk = [k.encode() for p in properties for k in p]
        pv = [v.encode() for p in properties for v in p.values()]
        prop_cols = [_offsets(map(len, properties)), *_column(pk), *_column(pv)]
    parts = [
        np.asarray(offset_deltas if offset_deltas is not None else range(n), dtype=_U32).tobytes(),
        np.asarray(born_ts if born_ts is not None else [0] * n, dtype=_I64).tobytes(),
        flags, *key_col, *value_col, *tags_col, *prop_cols,
    ]
    return b"".join(parts)


def min_block_size(n: int) -> int:
    """Bytes of a block of n records with empty data sections and no properties."""
    return 13 * n + 4 * 4 * (n + 1) + 2 * 4


def last_delta(block, n: int, at: int = 0, end: int | None = None) -> int:
    """Offset delta of the last record, read without parsing the block.

    The block is ``block[at:end]`` (default: all of it); it is read in place,
    with no view taken. Checks only that the block can hold n records; a full
    ``parse`` checks the rest (the service parses every produced block, so
    stored ones are sound).
    """
    size = (len(block) if end is None else end) - at
    if n <= 0 or size < min_block_size(n):
        raise ValueError(f"records block of {size} bytes cannot hold {n} records")
    return _LAST_DELTA.unpack_from(block, at + 4 * (n - 1))[0]


class _Reader:
    def __init__(self, block, n: int):
        self.mv, self.pos, self.n = memoryview(block), 0, n

    def array(self, dtype, count: int) -> np.ndarray:
        end = self.pos + dtype.itemsize * count
        if end > len(self.mv):
            raise ValueError(f"records block truncated at byte {self.pos}")
        a = np.frombuffer(self.mv, dtype, count, self.pos)
        self.pos = end
        return a

    def offsets(self, count: int, what: str, check: bool = True) -> np.ndarray:
        start = self.pos
        off = self.array(_I32, count + 1)
        if not check:
            return off
        if not off[-1]:
            # An empty column: non-decreasing from 0 to 0 means all zeros, one compare.
            if self.mv[start:self.pos] != _zeros(4 * (count + 1)):
                raise ValueError(f"records block: {what} offsets are not non-decreasing from 0")
        elif off[0] != 0 or (count and np.any(off[1:] < off[:-1])):
            raise ValueError(f"records block: {what} offsets are not non-decreasing from 0")
        return off

    def data(self, off: np.ndarray) -> memoryview:
        end = self.pos + int(off[-1])
        if end > len(self.mv) or end < self.pos:
            raise ValueError(f"records block truncated at byte {self.pos}")
        d = self.mv[self.pos:end]
        self.pos = end
        return d


def _check_utf8(what: str, off: np.ndarray, data: memoryview) -> None:
    """Every slice is valid UTF-8: the whole is, and no slice starts mid-character."""
    if not len(data):
        return
    try:
        bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"records block: {what} text is not valid UTF-8 ({e.reason})") from None
    starts = off[:-1][off[:-1] < len(data)]
    if np.any((np.frombuffer(data, np.uint8)[starts] & 0xC0) == 0x80):
        raise ValueError(f"records block: a {what} starts inside a UTF-8 character")


@functools.lru_cache(maxsize=64)
def _zeros(n: int) -> bytes:
    return bytes(n)


@functools.lru_cache(maxsize=64)
def _sequential(n: int) -> bytes:
    """The offset_delta column 0..n-1 of a produced block, as bytes."""
    return np.arange(n, dtype=_U32).tobytes()


def _check_flags(flags: np.ndarray, value_off: np.ndarray) -> None:
    if flags.tobytes() == _zeros(len(flags)):
        return                           # no keys, no null values: nothing to check
    unknown = (flags & ~np.uint8(_KNOWN_FLAGS)) != 0
    if unknown.any():
        i = int(unknown.argmax())
        raise ValueError(f"records block: message {i} has unknown flag bits 0x{int(flags[i]):02x} "
                         f"(known: 0x{FLAG_KEY:02x} key, 0x{FLAG_NULL_VALUE:02x} null value)")
    bad = ((flags & FLAG_NULL_VALUE) != 0) & (np.diff(value_off) != 0)
    if bad.any():
        raise ValueError(f"records block: message {int(bad.argmax())} has a null value "
                         "but value bytes")


def sound_single(block) -> tuple[int, bool] | None:
    """A produced block of one record without properties, checked with ``struct``:
    ``(message bytes, has key)`` when ``parse(block, 1)`` would accept it with offset
    delta 0, else None (anything else: parse it, which also names what is wrong).

    A producer writing to many queues sends one-record blocks by the hundred per
    call; ``parse`` takes ~35 us of numpy calls for each, this ~3 us (issue 39.5).
    """
    try:
        delta, _, flags, k0, klen = _SINGLE_HEAD.unpack_from(block, 0)
        if delta or k0 or klen < 0 or flags & ~_KNOWN_FLAGS:
            return None
        pos = _SINGLE_HEAD.size + klen
        v0, vlen = _PAIR.unpack_from(block, pos)
        if v0 or vlen < 0 or (flags & FLAG_NULL_VALUE and vlen):
            return None
        pos += _PAIR.size + vlen
        t0, tlen = _PAIR.unpack_from(block, pos)
        if t0 or tlen < 0:
            return None
        tags = pos + _PAIR.size
        pos = tags + tlen
        if any(_NO_PROPERTIES.unpack_from(block, pos)) or pos + _NO_PROPERTIES.size != len(block):
            return None
        if tlen:
            bytes(block[tags:pos]).decode("utf-8")
    except (struct.error, UnicodeDecodeError):
        return None
    return klen + vlen + tlen, bool(flags & FLAG_KEY)


def parse(block, n: int, check: bool = True) -> Columns:
    """Parse a records block of n records; ValueError if malformed.

    ``check=False`` is for a block whose batch CRC has just been verified: the
    service parsed it with every check when it was produced, and the CRC says
    these are those bytes. Only the section bounds and the flags are checked
    then (offset order and UTF-8 are not: a few numpy calls fewer per block).
    Callers index the columns from Python or numpy, which bounds-check; Arrow
    arrays are built by ``concat``, which checks the offsets it hands Arrow.
    """
    r = _Reader(block, n)
    delta, born, flags = r.array(_U32, n), r.array(_I64, n), r.array(np.dtype("u1"), n)
    key_off = r.offsets(n, "key", check)
    key_data = r.data(key_off)
    value_off = r.offsets(n, "value", check)
    value_data = r.data(value_off)
    tags_off = r.offsets(n, "tags", check)
    tags_data = r.data(tags_off)
    prop_off = r.offsets(n, "property", check)
    m = int(prop_off[-1])
    if m < 0:
        raise ValueError(f"records block: negative property count {m}")
    pk_off = r.offsets(m, "property key", check)
    pk_data = r.data(pk_off)
    pv_off = r.offsets(m, "property value", check)
    pv_data = r.data(pv_off)
    if r.pos != len(r.mv):
        raise ValueError(f"records block has {len(r.mv) - r.pos} trailing bytes")
    _check_flags(flags, value_off)       # cheap, and what a flag means is not left to chance
    if check:
        if n > 1 and delta.tobytes() != _sequential(n) and np.any(delta[1:] <= delta[:-1]):
            raise ValueError("records block: offset deltas are not strictly increasing")
        for what, off, data in (("tags", tags_off, tags_data), ("property key", pk_off, pk_data),
                                ("property value", pv_off, pv_data)):
            _check_utf8(what, off, data)
    return Columns(n, delta, born, flags, key_off, key_data, value_off, value_data, tags_off,
                   tags_data, prop_off, pk_off, pk_data, pv_off, pv_data, r.pos)


class _Var:
    """One variable-length column of several blocks, gathered as slices of the buffer."""
    __slots__ = ("offs", "data", "lens", "counts")

    def __init__(self):
        self.offs, self.data, self.lens, self.counts = [], [], [], []

    def take(self, mv: memoryview, pos: int, count: int, end: int, what: str) -> int:
        """The offsets (count + 1 int32) and data at ``pos``; where the next section starts."""
        data_at = pos + 4 * (count + 1)
        if data_at > end:
            raise ValueError(f"records block truncated in the {what} offsets")
        size = _LEN.unpack_from(mv, data_at - 4)[0]
        if size < 0 or data_at + size > end:
            raise ValueError(f"records block: {what} data of {size} bytes overruns the block")
        if _LEN.unpack_from(mv, pos)[0] != 0:
            raise ValueError(f"records block: {what} offsets do not start at 0")
        self.offs.append(mv[pos:data_at - 4])
        self.data.append(mv[data_at:data_at + size])
        self.lens.append(size)
        self.counts.append(count)
        return data_at + size

    def offsets(self) -> np.ndarray:
        """Offsets into ``b"".join(self.data)``: each block's shifted by the data before it."""
        total = sum(self.lens)
        if total > _MAX_I32:
            raise ValueError(f"{total} bytes of column data do not fit 32-bit Arrow offsets")
        own = np.frombuffer(b"".join(self.offs), _I32)
        bases = np.repeat(np.cumsum([0] + self.lens[:-1], dtype=np.int64).astype(np.int32),
                          self.counts)
        out = np.append(own + bases, np.int32(total))
        # Each block's offsets start at 0 (take) and end at its data size, so this
        # keeps every offset inside the joined data: Arrow trusts them blindly.
        if len(out) > 1 and np.any(out[1:] < out[:-1]):
            raise ValueError("records block: offsets are not non-decreasing")
        return out

    def joined(self) -> bytes:
        return b"".join(self.data)


def concat(buf, spans: Sequence[tuple[int, int, int]]) -> Columns:
    """The records blocks at ``buf[start:end]`` (``n`` records each) as one ``Columns``.

    For a reader of many stored blocks at once (a fetch holds hundreds): each
    section of each block is one slice of ``buf``, and every column is built
    with one join and a few numpy calls, not a parse per block. Checks what
    ``parse(check=False)`` does (for CRC-verified blocks the service stored),
    and that every offset array is non-decreasing from 0: Arrow trusts them.
    ``offset_delta`` stays relative to each block's base.
    """
    mv = memoryview(buf)
    fixed = ([], [], [])                   # offset_delta, born_ts, flags
    key, value, tags, props, pk, pv = (_Var() for _ in range(6))
    n_total = 0
    for start, end, n in spans:
        pos = start + 13 * n
        if n <= 0 or pos > end:
            raise ValueError(f"records block of {end - start} bytes cannot hold {n} records")
        fixed[0].append(mv[start:start + 4 * n])
        fixed[1].append(mv[start + 4 * n:start + 12 * n])
        fixed[2].append(mv[start + 12 * n:pos])
        pos = key.take(mv, pos, n, end, "key")
        pos = value.take(mv, pos, n, end, "value")
        pos = tags.take(mv, pos, n, end, "tags")
        m = _LEN.unpack_from(mv, pos + 4 * n)[0] if pos + 4 * (n + 1) <= end else -1
        if m < 0:
            raise ValueError("records block: bad property count")
        props.offs.append(mv[pos:pos + 4 * n])
        props.lens.append(m)
        props.counts.append(n)
        pos = pk.take(mv, pos + 4 * (n + 1), m, end, "property key")
        pos = pv.take(mv, pos, m, end, "property value")
        if pos != end:
            raise ValueError(f"records block has {end - pos} trailing bytes")
        n_total += n
    key_data, value_data, tags_data = key.joined(), value.joined(), tags.joined()
    flags, value_off = np.frombuffer(b"".join(fixed[2]), np.uint8), value.offsets()
    _check_flags(flags, value_off)
    return Columns(n_total, np.frombuffer(b"".join(fixed[0]), _U32),
                   np.frombuffer(b"".join(fixed[1]), _I64), flags,
                   key.offsets(), memoryview(key_data), value_off, memoryview(value_data),
                   tags.offsets(), memoryview(tags_data), props.offsets(),
                   pk.offsets(), memoryview(pk.joined()), pv.offsets(), memoryview(pv.joined()),
                   sum(end - start for start, end, _ in spans))


def iter_rows(c: Columns) -> Iterator[tuple[int, bytes | None, bytes | None, str, dict, int]]:
    """(offset_delta, key, value, tags, properties, born_ts) per record, in Python."""
    ko, vo, to, po, pko, pvo = (a.tolist() for a in (c.key_off, c.value_off, c.tags_off,
                                                      c.prop_off, c.pk_off, c.pv_off))
    flags, deltas, born = c.flags.tolist(), c.offset_delta.tolist(), c.born_ts.tolist()
    for i in range(c.n):
        props = {bytes(c.pk_data[pko[j]:pko[j + 1]]).decode(): bytes(c.pv_data[pvo[j]:pvo[j + 1]]).decode()
                 for j in range(po[i], po[i + 1])}
        yield (deltas[i], bytes(c.key_data[ko[i]:ko[i + 1]]) if flags[i] & FLAG_KEY else None,
               None if flags[i] & FLAG_NULL_VALUE else bytes(c.value_data[vo[i]:vo[i + 1]]),
               bytes(c.tags_data[to[i]:to[i + 1]]).decode(),
               props, born[i])


def row_at(block, n: int, delta: int) -> tuple[int, bytes | None, bytes | None, str, dict, int] | None:
    """The record whose offset delta is ``delta`` (as ``iter_rows`` gives it), or None,
    read with ``struct`` alone: for one record of a block whose batch CRC was just
    checked (a key-value get), where ``parse``'s numpy calls cost more than the read.
    The block is checked as ``parse(check=False)`` checks it (section bounds, no
    trailing bytes, flags): ValueError where that would raise one."""
    size = len(block)
    if n <= 0 or size < min_block_size(n):
        raise ValueError(f"records block of {size} bytes cannot hold {n} records")
    deltas = struct.unpack_from(f"<{n}I", block, 0)
    flags = bytes(block[12 * n:13 * n])
    pos, cols = 13 * n, []
    for what in ("key", "value", "tags"):
        offs, data, pos = _section(block, pos, n, what, size)
        cols.append((offs, data))
    if pos + 4 * (n + 1) > size:                # record -> its range of properties: no data
        raise ValueError("records block truncated in the property offsets")
    cols.append((struct.unpack_from(f"<{n + 1}i", block, pos), None))
    pos += 4 * (n + 1)
    m = cols[3][0][-1]
    if m < 0:
        raise ValueError(f"records block: negative property count {m}")
    for what in ("property key", "property value"):
        offs, data, pos = _section(block, pos, m, what, size)
        cols.append((offs, data))
    if pos != size:
        raise ValueError(f"records block has {size - pos} trailing bytes")
    value_off = cols[1][0]
    for j, f in enumerate(flags):
        if f & ~_KNOWN_FLAGS:
            raise ValueError(f"records block: message {j} has unknown flag bits 0x{f:02x}")
        if f & FLAG_NULL_VALUE and value_off[j + 1] != value_off[j]:
            raise ValueError(f"records block: message {j} has a null value but value bytes")
    i = bisect.bisect_left(deltas, delta)
    if i == n or deltas[i] != delta:
        return None

    def cell(c: int, k: int) -> bytes:
        offs, data = cols[c]
        lo, hi = offs[k], offs[k + 1]
        if not 0 <= lo <= hi <= offs[-1]:
            raise ValueError("records block: offsets out of order")
        return bytes(block[data + lo:data + hi])

    po = cols[3][0]
    if not 0 <= po[i] <= po[i + 1] <= m:
        raise ValueError("records block: property offsets out of order")
    props = {cell(4, j).decode(): cell(5, j).decode() for j in range(po[i], po[i + 1])}
    key = cell(0, i) if flags[i] & FLAG_KEY else None
    value = None if flags[i] & FLAG_NULL_VALUE else cell(1, i)
    born = struct.unpack_from("<q", block, 4 * n + 8 * i)[0]
    return delta, key, value, cell(2, i).decode(), props, born


def _section(block, pos: int, count: int, what: str, size: int) -> tuple[tuple, int, int]:
    """(count + 1 offsets, where the data starts, where the next section starts) of the
    section at ``pos``: its offsets' and data's bounds checked."""
    data = pos + 4 * (count + 1)
    if data > size:
        raise ValueError(f"records block truncated in the {what} offsets")
    offs = struct.unpack_from(f"<{count + 1}i", block, pos)
    if offs[-1] < 0 or data + offs[-1] > size:
        raise ValueError(f"records block truncated in the {what} data")
    return offs, data, data + offs[-1]


def select(c: Columns, keep: Sequence[int]) -> bytes:
    """A new block with only the records at indexes ``keep`` (offset deltas kept)."""
    rows = list(iter_rows(c))
    picked = [rows[i] for i in keep]
    return encode([r[2] for r in picked], [r[1] for r in picked], [r[3] for r in picked],
                  [r[4] for r in picked], [r[5] for r in picked], [r[0] for r in picked])
