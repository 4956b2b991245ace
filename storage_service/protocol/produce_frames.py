"""The produce port's wire format: a hello, then length-prefixed frames.

A node serves ``ProduceBatches`` on its produce port (``placement.produce_address``)
as frames over plain TCP as well as over gRPC (why: ``server/produce_port.py``).
This module is the format alone, parsed from buffers: no socket here, so it is
tested bytes in, bytes out. The server (``storage_service.server.produce_port``)
and the client (``rmq_spark.client._produce_wire``) move the bytes.

A connection starts with a hello each way, then carries frames::

    hello  = "RMQP" | u16 version | u16 flags [| u16 length | token]
    frame  = u32 body length | u32 request id | u32 code | body

A client's hello with flag 1 (``FLAG_TOKEN``) is followed by its bearer
token (``length`` bytes of UTF-8, at most ``MAX_TOKEN``): the node
authenticates the connection by it (``security/authz.py``), as gRPC calls by
their ``authorization`` metadata. Flag 2 (``FLAG_PIPELINED``): the client keeps
several produce requests in flight on the connection; the node submits them in
the order they come and reads on while they commit (``Client.producer``).
Without it the node answers a request before it reads the next, except a
KvPut: it is submitted and answered once it commits, and the node reads on
meanwhile, so a KvPut's answer may come after those of requests sent after
it. A node's hello has no flags.

In a request, ``code`` is the method and the body its request message:
1 = ProduceBatches (a ``ProduceBatchesRequest``), 2 = Fetch (a
``FetchRequest``), 3 = KvPut, 4 = KvRead (their protobuf requests). In the
reply (same request id), ``code`` is 0 and the body the method's response (a
``ProduceBatchesResponse``; a ``FetchResponse`` in ``fetch_wire``'s encoding,
which is protobuf's; a ``KvPutResponse``, a ``KvReadResponse``), or a gRPC status number and
the body a UTF-8 message saying what was wrong (the call failed as a whole;
per-batch errors are outcomes, as over gRPC). A frame longer than ``MAX_FRAME`` or a
hello that does not match is answered with an error frame (request id 0) and
the connection is closed: after a bad length the stream cannot be trusted.
Answers are matched to requests by request id. Requests on one connection
are answered in order, but for KvPuts (see above); a client wanting several
produce or fetch requests in flight opens several connections.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

import grpc

from .errors import StorageError

__all__ = ["FLAG_PIPELINED", "FLAG_TOKEN", "FRAME", "HELLO", "MAX_TOKEN", "TOKEN_LEN", "MAX_FRAME", "METHOD_FETCH", "METHOD_KV_PUT", "METHOD_KV_READ", "METHOD_PRODUCE_BATCHES", "Frame", "FrameReader", "PeerClosed",
           "WireProtocolError", "check_hello", "error_frame", "frame_head", "hello"]

MAGIC = b"RMQP"
VERSION = 1
HELLO = struct.Struct("<4sHH")
FRAME = struct.Struct("<III")
METHOD_PRODUCE_BATCHES = 1
METHOD_FETCH = 2
METHOD_KV_PUT = 3
METHOD_KV_READ = 4
MAX_FRAME = 128 << 20       # gRPC's message limit (placement.GRPC_OPTIONS)
FLAG_TOKEN = 1
FLAG_PIPELINED = 2
TOKEN_LEN = struct.Struct("<H")
MAX_TOKEN = 8192


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


def hello(token: str | None = None, pipelined: bool = False) -> bytes:
    flags = FLAG_PIPELINED if pipelined else 0
    if not token:
        return HELLO.pack(MAGIC, VERSION, flags)
    raw = token.encode()
    if len(raw) > MAX_TOKEN:
        raise ValueError(f"a token of {len(raw)} bytes; the produce port takes at most {MAX_TOKEN}")
    return HELLO.pack(MAGIC, VERSION, flags | FLAG_TOKEN) + TOKEN_LEN.pack(len(raw)) + raw


def check_hello(data: bytes) -> int:
    """The hello's flags (``FLAG_TOKEN``: the token's length and bytes follow)."""
    if len(data) != HELLO.size:
        raise WireProtocolError(f"hello of {len(data)} bytes; it has {HELLO.size}")
    magic, version, flags = HELLO.unpack(data)
    if magic != MAGIC:
        raise WireProtocolError(f"not an rmq produce stream (hello {bytes(data)!r})")
    if version != VERSION:
        raise WireProtocolError(f"produce stream version {version}; this side speaks {VERSION}")
    if flags & ~(FLAG_TOKEN | FLAG_PIPELINED):
        raise WireProtocolError(f"hello flags {flags:#x}: this side knows {FLAG_TOKEN:#x} (a token follows) "
                                f"and {FLAG_PIPELINED:#x} (requests pipelined)")
    return flags


def frame_head(request_id: int, code: int, body_len: int) -> bytes:
    """A frame's 12-byte head; the body follows it as is (sent without concatenation)."""
    return FRAME.pack(body_len, request_id, code)


def error_frame(code: grpc.StatusCode, message: str, request_id: int = 0) -> tuple[bytes, bytes]:
    """(head, body) of a reply saying the call failed as a whole with ``code``."""
    body = message.encode()
    return frame_head(request_id, code.value[0], len(body)), body


class FrameReader:
    """Frames out of a byte stream, parsed as the bytes arrive.

    A reader of a socket receives straight into the buffer the reader asks
    for (``want``, then ``got``): the head into a 12-byte buffer, then the
    body into a buffer of its own, which becomes the frame's ``body`` without
    a copy. The body buffer grows with the bytes that arrive (doubling from
    1 MiB), never with the length a head announces, so a peer that announces
    a big frame and sends little costs little memory; a head announcing more
    than ``max_frame`` raises WireProtocolError (RESOURCE_EXHAUSTED) as soon
    as it is complete. ``feed`` does the same for bytes already received.
    """

    def __init__(self, max_frame: int = MAX_FRAME):
        self.max_frame = max_frame
        self._head = bytearray(FRAME.size)
        self._have = 0                           # bytes of the head, then of the body
        self._body: bytearray | None = None      # None while reading the head
        self._length = self._request_id = self._code = 0

    @property
    def buffered(self) -> int:
        """Bytes received of the frame not yet complete."""
        return self._have + (FRAME.size if self._body is not None else 0)

    def want(self) -> memoryview:
        """Where the next bytes go: a writable view of at least 1 byte."""
        if self._body is None:
            return memoryview(self._head)[self._have:]
        if self._have == len(self._body):        # grow with what arrived, not with the length
            self._body.extend(bytes(min(len(self._body), self._length - len(self._body))))
        return memoryview(self._body)[self._have:]

    def got(self, n: int) -> Frame | None:
        """``n`` bytes were written into the last ``want()`` view; the frame they complete, if any."""
        self._have += n
        if self._body is None:
            if self._have < FRAME.size:
                return None
            self._length, self._request_id, self._code = FRAME.unpack(self._head)
            if self._length > self.max_frame:
                raise WireProtocolError(f"frame of {self._length} bytes; the limit is {self.max_frame}",
                                        grpc.StatusCode.RESOURCE_EXHAUSTED)
            self._body, self._have = bytearray(min(self._length, 1 << 20)), 0
        if self._have < self._length:
            return None
        frame = Frame(self._request_id, self._code, self._body)
        self._body, self._have = None, 0
        return frame

    def feed(self, data) -> list[Frame]:
        """The frames that ``data`` (bytes already received) completes."""
        out, mv, pos = [], memoryview(data), 0
        while pos < len(mv):
            with self.want() as view:        # released before the next want() grows the body
                k = min(len(view), len(mv) - pos)
                view[:k] = mv[pos:pos + k]
            pos += k
            frame = self.got(k)
            if frame is not None:
                out.append(frame)
        return out
