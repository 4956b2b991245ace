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
    assert hello() == b"RMQP\x01\x00\x00\x00"
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


def test_frames_come_out_whole_whatever_the_pieces():
    stream = _frame(1, 1, b"a" * 100) + _frame(2, 0, b"") + _frame(3, 14, "é".encode())
    for step in (1, 5, 12, 13, 100, len(stream)):
        r, got = FrameReader(), []
        for i in range(0, len(stream), step):
            r.feed(stream[i:i + step])
            got += [(f.request_id, f.code, bytes(f.body)) for f in r.frames()]
        assert got == [(1, 1, b"a" * 100), (2, 0, b""), (3, 14, "é".encode())], step
        assert r.buffered == 0 and r.next_frame() is None


def test_wanted_says_how_much_is_missing():
    r = FrameReader()
    assert r.wanted() == FRAME.size
    r.feed(_frame(9, 1, b"xyz")[:5])
    assert r.wanted() == FRAME.size - 5
    r.feed(_frame(9, 1, b"xyz")[5:13])
    assert r.wanted() == 2 and r.next_frame() is None
    r.feed(b"yz")
    assert r.next_frame().body == b"xyz"


def test_an_oversized_head_is_refused_before_its_body_arrives():
    r = FrameReader(max_frame=1000)
    r.feed(struct.pack("<III", 1001, 4, 1))
    with pytest.raises(WireProtocolError, match="frame of 1001 bytes; the limit is 1000") as e:
        r.next_frame()
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert r.wanted() <= 1000 + FRAME.size       # never asks for the announced length
    assert FrameReader().max_frame == MAX_FRAME


def test_buffer_grows_with_bytes_fed_not_with_the_announced_length():
    r = FrameReader()
    r.feed(struct.pack("<III", MAX_FRAME, 1, 1) + b"x" * 10)
    assert r.buffered == FRAME.size + 10 and r.next_frame() is None
    assert HELLO.size == 8
