"""The produce port's wire format (storage_service.protocol.produce_frames), bytes in, bytes out."""
from __future__ import annotations

import struct

import grpc
import pytest

from storage_service.protocol.produce_frames import (FRAME, HELLO, MAX_FRAME, FrameReader, WireProtocolError,
                                                     check_hello, error_frame, frame_head, hello)

pytestmark = pytest.mark.unit


def _frame(rid: int, code: int, body: bytes) -> bytes:
    return struct.pack("<III", len(body), rid, code) + body


def test_hello_and_frame_head_bytes():
    assert hello() == b"RMQP\x01\x00\x00\x00" and HELLO.size == 8
    check_hello(hello())
    assert frame_head(7, 1, 3) == b"\x03\x00\x00\x00\x07\x00\x00\x00\x01\x00\x00\x00"
    head, body = error_frame(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many")
    assert FRAME.unpack(head) == (8, 0, 8) and body == b"too many"


@pytest.mark.parametrize("data,why", [
    (b"HTTP/1.1", "not an rmq produce stream"),
    (b"RMQP\x02\x00\x00\x00", "version 2; this side speaks 1"),
    (b"RMQP", "hello of 4 bytes"),
])
def test_bad_hello_is_refused_naming_what_was_wrong(data, why):
    with pytest.raises(WireProtocolError, match=why):
        check_hello(data)


STREAM = _frame(1, 1, b"a" * 100) + _frame(2, 0, b"") + _frame(3, 14, "é".encode()) + _frame(4, 1, b"x" * 3000)
WANT = [(1, 1, b"a" * 100), (2, 0, b""), (3, 14, "é".encode()), (4, 1, b"x" * 3000)]


@pytest.mark.parametrize("step", [1, 5, 12, 13, 100, 4096, len(STREAM)])
def test_fed_frames_come_out_whole_whatever_the_pieces(step):
    r, got = FrameReader(), []
    for i in range(0, len(STREAM), step):
        got += [(f.request_id, f.code, bytes(f.body)) for f in r.feed(STREAM[i:i + step])]
    assert got == WANT and r.buffered == 0


@pytest.mark.parametrize("most", [1, 7, 64, 1 << 20])
def test_received_into_the_readers_buffers_as_a_socket_does(most):
    r, got, pos = FrameReader(), [], 0
    while pos < len(STREAM):
        view = r.want()
        k = min(len(view), most, len(STREAM) - pos)
        view[:k] = STREAM[pos:pos + k]
        pos += k
        if (f := r.got(k)) is not None:
            got.append((f.request_id, f.code, bytes(f.body)))
    assert got == WANT


def test_the_body_buffer_grows_with_what_arrives_not_with_the_announced_length():
    r = FrameReader()
    r.feed(struct.pack("<III", MAX_FRAME, 1, 1) + b"x" * 10)
    assert r.buffered == FRAME.size + 10
    assert len(r.want()) <= 1 << 20              # 1 MiB at first, not 128 MiB


def test_an_oversized_head_is_refused_before_its_body_arrives():
    r = FrameReader(max_frame=1000)
    with pytest.raises(WireProtocolError, match="frame of 1001 bytes; the limit is 1000") as e:
        r.feed(struct.pack("<III", 1001, 4, 1))
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("piece", [64 << 10, 5 << 20])
def test_a_body_bigger_than_the_first_buffer_is_fed_whole(piece):
    body = bytes(range(256)) * (12 << 10)              # 3 MiB: the body buffer grows twice
    data, r, got = _frame(9, 0, body) + _frame(10, 0, b"next"), FrameReader(), []
    for i in range(0, len(data), piece):
        got += r.feed(data[i:i + piece])
    assert [(f.request_id, bytes(f.body)) for f in got] == [(9, body), (10, b"next")]
