"""fetchwire writes and reads exactly protobuf's encoding of FetchResponse."""
import os

import pytest

from storage_service.protocol.fetch_wire import decode_fetch_response, encode_fetch_response
from storage_service.proto import rmq_pb2

CASES = [
    (b"", 0, 0, 0, ""),
    (os.urandom(1000), 5, 0, 7, "127.0.0.1:1234"),
    (os.urandom(300_000), 1 << 40, 1 << 35, (1 << 62) + 3, "host-ü:9"),
    (b"x", -1, -2, 0, ""),                      # negative int64: ten-byte varints
]


@pytest.mark.parametrize("batches,nxt,earliest,latest,served", CASES)
def test_encoding_is_protobufs(batches, nxt, earliest, latest, served):
    ours = encode_fetch_response(batches, nxt, earliest, latest, served)
    theirs = rmq_pb2.FetchResponse(batches=batches, next_offset=nxt, earliest=earliest,
                                   latest=latest, served_by=served)
    assert rmq_pb2.FetchResponse.FromString(ours) == theirs
    got = decode_fetch_response(theirs.SerializeToString())
    assert (bytes(got.batches), got.next_offset, got.earliest, got.latest, got.served_by) == \
        (batches, nxt, earliest, latest, served)


def test_batches_are_a_view_not_a_copy():
    data = encode_fetch_response(b"abc" * 1000, 1, 2, 3, "n")
    got = decode_fetch_response(data)
    assert isinstance(got.batches, memoryview) and got.batches.obj is data


def test_encodes_a_memoryview_of_the_read():
    raw = os.urandom(5000)
    assert decode_fetch_response(encode_fetch_response(memoryview(raw)[100:], 9, 0, 9, "a")).batches == raw[100:]


def test_unknown_fields_are_skipped():
    known = rmq_pb2.FetchResponse(batches=b"zz", next_offset=3).SerializeToString()
    # field 9 varint, field 10 bytes, field 11 fixed64, field 12 fixed32: a newer server's extras
    extra = bytes([9 << 3 | 0, 0x96, 0x01, 10 << 3 | 2, 2]) + b"hi" + bytes([11 << 3 | 1]) + bytes(8) \
        + bytes([12 << 3 | 5]) + bytes(4)
    got = decode_fetch_response(extra + known)
    assert bytes(got.batches) == b"zz" and got.next_offset == 3


@pytest.mark.parametrize("bad,what", [(bytes([0x10, 0x80]), "truncated varint"),
                                      (bytes([0x0A, 10]) + b"abc", "past the end"),
                                      (bytes([0x0B]), "wire type 3"),
                                      (bytes([11 << 3 | 1, 0, 0]), "fixed-size field")])
def test_malformed_messages_are_refused_by_name(bad, what):
    with pytest.raises(ValueError, match=what):
        decode_fetch_response(bad)


def test_local_span_is_protobufs_nested_message():
    from storage_service.protocol.fetch_wire import LocalSpan

    span = LocalSpan("/data/n1/g2/t~0/00000000000000000042.log", 1 << 33, 8 << 20, 1 << 40, 2049)
    ours = encode_fetch_response(b"", 99, 3, 120, "n1", span)
    theirs = rmq_pb2.FetchResponse(next_offset=99, earliest=3, latest=120, served_by="n1",
                                   local=rmq_pb2.LocalSpan(path=span.path, position=span.position,
                                                           length=span.length, inode=span.inode,
                                                           device=span.device))
    assert rmq_pb2.FetchResponse.FromString(ours) == theirs
    got = decode_fetch_response(theirs.SerializeToString())
    assert got.local == span and bytes(got.batches) == b"" and got.next_offset == 99
    assert decode_fetch_response(encode_fetch_response(b"ab", 1, 0, 1, "n")).local is None
