"""FetchResponse on the wire without protobuf objects, for the read path's bulk bytes.

A fetch carries megabytes of stored batches in one ``bytes`` field. Building a
``FetchResponse`` and serializing it copies them twice (into the message, out
to the wire) and parsing on the client copies them again; with upb that cost
11-23 ms per 8 MB on the server and 2-14 ms on the client, more than reading
the segments and the whole gRPC transfer together (``bench/README.md``).

These functions produce and read exactly the protobuf encoding of
``FetchResponse`` (proto3, fields 1-5), so the message on the wire and the
``.proto`` contract do not change: a client built from the ``.proto`` alone
still works. The server hands gRPC finished bytes; the client gets the batches
as a ``memoryview`` into the received message, with no copy.
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["FetchReply", "LocalSpan", "decode_fetch_response", "encode_fetch_head", "encode_fetch_response"]

# (field number << 3) | wire type: 0 = varint, 2 = length-delimited.
_BATCHES, _NEXT, _EARLIEST, _LATEST, _SERVED_BY, _LOCAL = 0x0A, 0x10, 0x18, 0x20, 0x2A, 0x32
# LocalSpan's fields
_PATH, _POSITION, _LENGTH, _INODE, _DEVICE = 0x0A, 0x10, 0x18, 0x20, 0x28


class LocalSpan(NamedTuple):
    """``FetchResponse.local``: batches to read from a file on this host."""
    path: str
    position: int
    length: int
    inode: int
    device: int


class FetchReply(NamedTuple):
    """The fields of a ``FetchResponse``; ``batches`` is a view of the received bytes."""
    batches: memoryview
    next_offset: int
    earliest: int
    latest: int
    served_by: str
    local: LocalSpan | None = None


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1                  # int64: negative numbers take ten bytes, as in protobuf
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _encode_local(span) -> bytes:
    path = span.path.encode()
    out = bytearray(bytes((_PATH,)) + _varint(len(path)) + path)
    for tag, value in ((_POSITION, span.position), (_LENGTH, span.length),
                       (_INODE, span.inode), (_DEVICE, span.device)):
        if value:
            out += bytes((tag,)) + _varint(value)
    return bytes((_LOCAL,)) + _varint(len(out)) + bytes(out)


def encode_fetch_response(batches: bytes, next_offset: int, earliest: int, latest: int,
                          served_by: str, local=None) -> bytes:
    """The protobuf encoding of ``FetchResponse(batches=..., ...)`` with one copy of ``batches``.

    Zero-valued scalars are left out as proto3 does; the small fields go first
    (protobuf readers accept fields in any order).
    """
    head = encode_fetch_head(len(batches), next_offset, earliest, latest, served_by, local)
    return b"".join((head, batches)) if batches else head


def encode_fetch_head(batches_length: int, next_offset: int, earliest: int, latest: int,
                      served_by: str, local=None) -> bytes:
    """``encode_fetch_response``'s bytes up to the batches: what ``batches_length``
    bytes of batches complete (sent from a file by the produce port's ``sendfile``)."""
    head = bytearray()
    for tag, value in ((_NEXT, next_offset), (_EARLIEST, earliest), (_LATEST, latest)):
        if value:
            head += bytes((tag,)) + _varint(value)
    if served_by:
        name = served_by.encode()
        head += bytes((_SERVED_BY,)) + _varint(len(name)) + name
    if local is not None:           # a segment.FileSpan or LocalSpan
        head += _encode_local(local)
    if batches_length:
        head += bytes((_BATCHES,)) + _varint(batches_length)
    return bytes(head)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("FetchResponse: truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise ValueError("FetchResponse: varint longer than 10 bytes")


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _fields(buf: memoryview, ints: dict[int, int], blobs: dict[int, memoryview]) -> None:
    """Fill ``ints`` (varint fields) and ``blobs`` (length-delimited ones) whose tags they
    hold; other fields (a newer peer's) are skipped."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        wire = key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
            if key in ints:
                ints[key] = value
        elif wire == 2:
            size, pos = _read_varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError("FetchResponse: field runs past the end of the message")
            if key in blobs:
                blobs[key] = buf[pos:pos + size]
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
            if pos > len(buf):
                raise ValueError("FetchResponse: fixed-size field runs past the end of the message")
        else:
            raise ValueError(f"FetchResponse: unsupported wire type {wire}")


def decode_fetch_response(data: bytes) -> FetchReply:
    """Parse a ``FetchResponse``; unknown fields (a newer server) are skipped."""
    buf = memoryview(data)
    ints = {_NEXT: 0, _EARLIEST: 0, _LATEST: 0}
    blobs = {_BATCHES: buf[0:0], _SERVED_BY: buf[0:0], _LOCAL: None}
    _fields(buf, ints, blobs)
    local = None
    if blobs[_LOCAL] is not None:
        span = {_POSITION: 0, _LENGTH: 0, _INODE: 0, _DEVICE: 0}
        path = {_PATH: buf[0:0]}
        _fields(blobs[_LOCAL], span, path)
        local = LocalSpan(str(path[_PATH], "utf-8"), _int64(span[_POSITION]),
                          _int64(span[_LENGTH]), span[_INODE], span[_DEVICE])
    return FetchReply(blobs[_BATCHES], _int64(ints[_NEXT]), _int64(ints[_EARLIEST]),
                      _int64(ints[_LATEST]), str(blobs[_SERVED_BY], "utf-8"), local)
