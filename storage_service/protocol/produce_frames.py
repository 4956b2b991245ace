"""The produce port's wire format: a hello, then length-prefixed frames.

A node serves ``ProduceBatches`` on its produce port (``placement.produce_address``)
as frames over plain TCP as well as over gRPC (why: ``server/produce_port.py``).
This module is the format alone, parsed from buffers: no socket here, so it is
tested bytes in, bytes out. The server (``storage_service.server.produce_port``)
and the client (``rmq_spark.client._produce_wire``) move the bytes.

A connection starts with a hello each way, then carries frames::

    hello  = "RMQP" | u16 version | u16 flags (0)
    frame  = u32 body length | u32 request id | u32 code | body

In a request, ``code`` is the method (1 = ProduceBatches) and the body a
``ProduceBatchesRequest``. In the reply (same request id), ``code`` is 0 and
the body a ``ProduceBatchesResponse``, or a gRPC status number and the body a
UTF-8 message saying what was wrong (the call failed as a whole; per-batch
errors are outcomes, as over gRPC). A frame longer than ``MAX_FRAME`` or a
hello that does not match is answered with an error frame (request id 0) and
the connection is closed: after a bad length the stream cannot be trusted.
Requests on one connection are answered in order; a client wanting several
in flight opens several connections.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

import grpc

from .errors import StorageError

__all__ = ["FRAME", "HELLO", "MAX_FRAME", "METHOD_PRODUCE_BATCHES", "Frame", "FrameReader", "PeerClosed",
           "WireProtocolError", "check_hello", "error_frame", "frame_head", "hello"]

MAGIC = b"RMQP"
VERSION = 1
HELLO = struct.Struct("<4sHH")
FRAME = struct.Struct("<III")
METHOD_PRODUCE_BATCHES = 1
MAX_FRAME = 128 << 20       # gRPC's message limit (placement.GRPC_OPTIONS)


class WireProtocolError(StorageError):
    """The peer does not speak this protocol (bad hello, frame too long, early EOF)."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT):
        super().__init__(message, code)


class PeerClosed(WireProtocolError):
    """The peer closed the connection before sending any byte of what was read."""


class Frame(NamedTuple):
    request_id: int
    code: int               # the method in a request; 0 or a gRPC status number in a reply
    body: bytearray


def hello() -> bytes:
    return HELLO.pack(MAGIC, VERSION, 0)


def check_hello(data: bytes) -> None:
    if len(data) != HELLO.size:
        raise WireProtocolError(f"hello of {len(data)} bytes; it has {HELLO.size}")
    magic, version, _flags = HELLO.unpack(data)
    if magic != MAGIC:
        raise WireProtocolError(f"not an rmq produce stream (hello {bytes(data)!r})")
    if version != VERSION:
        raise WireProtocolError(f"produce stream version {version}; this side speaks {VERSION}")


def frame_head(request_id: int, code: int, body_len: int) -> bytes:
    """A frame's 12-byte head; the body follows it as is (sent without concatenation)."""
    return FRAME.pack(body_len, request_id, code)


def error_frame(code: grpc.StatusCode, message: str, request_id: int = 0) -> tuple[bytes, bytes]:
    """(head, body) of a reply saying the call failed as a whole with ``code``."""
    body = message.encode()
    return frame_head(request_id, code.value[0], len(body)), body


class FrameReader:
    """Frames out of a byte stream fed in whatever pieces arrive.

    The buffer grows with the bytes fed, never with the length a head
    announces, so a peer that announces a big frame and sends little costs
    little memory; a head announcing more than ``max_frame`` raises
    WireProtocolError (RESOURCE_EXHAUSTED) as soon as it is read.
    """

    def __init__(self, max_frame: int = MAX_FRAME):
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes fed and not yet returned as frames."""
        return len(self._buf)

    def wanted(self) -> int:
        """Bytes still missing for the next whole frame (at least 1)."""
        buf = self._buf
        if len(buf) < FRAME.size:
            return FRAME.size - len(buf)
        length = FRAME.unpack_from(buf)[0]
        return max(1, FRAME.size + min(length, self.max_frame) - len(buf))

    def next_frame(self) -> Frame | None:
        """The next whole frame, or None until more bytes are fed."""
        buf = self._buf
        if len(buf) < FRAME.size:
            return None
        length, request_id, code = FRAME.unpack_from(buf)
        if length > self.max_frame:
            raise WireProtocolError(f"frame of {length} bytes; the limit is {self.max_frame}",
                                    grpc.StatusCode.RESOURCE_EXHAUSTED)
        end = FRAME.size + length
        if len(buf) < end:
            return None
        if len(buf) == end:            # the usual case: hand the buffer over, no copy
            self._buf = bytearray()
            del buf[:FRAME.size]       # O(1) for a bytearray's front
            return Frame(request_id, code, buf)
        body = buf[FRAME.size:end]
        del buf[:end]
        return Frame(request_id, code, body)

    def frames(self):
        """Every whole frame fed so far."""
        while (f := self.next_frame()) is not None:
            yield f
