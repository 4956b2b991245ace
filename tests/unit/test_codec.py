"""Record-batch framing: bytes in, bytes out (storage_service.codec)."""
from __future__ import annotations

import crc32c
import pytest

from storage_service import codec
from storage_service.codec import (
    BATCH_HEADER, BODY_HEADER, RECORD_HEADER, CorruptBatch,
    encode_records, frame_batch, iter_batches, iter_records, scan_valid_prefix,
)

pytestmark = pytest.mark.unit


def _batch(base: int, msgs: list[bytes], ts: int = 1000, raft_index: int = 1) -> bytes:
    return frame_batch(base, ts, len(msgs), raft_index, encode_records(msgs))


def test_encode_records_layout_is_delta_len_payload():
    blob = encode_records([b"ab", b"", b"xyz"])
    assert blob == (RECORD_HEADER.pack(0, 2) + b"ab" + RECORD_HEADER.pack(1, 0)
                    + RECORD_HEADER.pack(2, 3) + b"xyz")


def test_encode_records_of_nothing_is_empty():
    assert encode_records([]) == b""


def test_frame_batch_layout_and_crc():
    records = encode_records([b"m"])
    frame = frame_batch(7, -5, 1, 42, records)
    body_len, crc = BATCH_HEADER.unpack_from(frame, 0)
    body = frame[BATCH_HEADER.size:]
    assert body_len == len(body) == BODY_HEADER.size + len(records)
    assert crc == crc32c.crc32c(body)
    assert BODY_HEADER.unpack_from(body, 0) == (7, -5, 1, 42)
    assert body[BODY_HEADER.size:] == records


def test_iter_batches_reads_every_header():
    a, b = _batch(0, [b"a", b"b"], ts=10, raft_index=3), _batch(2, [b"c"], ts=11, raft_index=4)
    hs = list(iter_batches(a + b))
    assert [(h.position, h.size) for h in hs] == [(0, len(a)), (len(a), len(b))]
    assert [(h.base_offset, h.last_offset, h.next_offset) for h in hs] == [(0, 1, 2), (2, 2, 3)]
    assert [(h.store_ts, h.count, h.apply_position) for h in hs] == [(10, 2, 3), (11, 1, 4)]


def test_iter_batches_of_empty_buffer_yields_nothing():
    assert list(iter_batches(b"")) == []


def test_last_offset_follows_the_last_delta_not_the_count():
    # Compaction may leave gaps: deltas 0 and 5 in a 2-record batch.
    records = RECORD_HEADER.pack(0, 1) + b"a" + RECORD_HEADER.pack(5, 1) + b"b"
    h = next(iter_batches(frame_batch(100, 0, 2, 1, records)))
    assert (h.base_offset, h.last_offset, h.next_offset) == (100, 105, 106)


def test_iter_records_yields_offsets_ts_and_payloads():
    buf = _batch(0, [b"a", b"b"], ts=10) + _batch(2, [b"c"], ts=20)
    got = [(o, ts, bytes(m)) for o, ts, m in iter_records(buf)]
    assert got == [(0, 10, b"a"), (1, 10, b"b"), (2, 20, b"c")]


def test_iter_records_min_offset_skips_within_and_across_batches():
    buf = _batch(0, [b"a", b"b"]) + _batch(2, [b"c", b"d"])
    assert [o for o, _, _ in iter_records(buf, min_offset=1)] == [1, 2, 3]
    assert [o for o, _, _ in iter_records(buf, min_offset=3)] == [3]
    assert list(iter_records(buf, min_offset=4)) == []


def test_iter_batches_rejects_crc_mismatch():
    frame = bytearray(_batch(0, [b"hello"]))
    frame[-1] ^= 0xFF
    with pytest.raises(CorruptBatch, match="crc mismatch") as e:
        list(iter_batches(bytes(frame)))
    assert e.value.position == 0


def test_iter_batches_without_verify_ignores_payload_crc():
    frame = bytearray(_batch(0, [b"hello"]))
    frame[-1] ^= 0xFF
    assert [h.base_offset for h in iter_batches(bytes(frame), verify=False)] == [0]


def test_iter_batches_reports_position_of_the_bad_batch():
    good = _batch(0, [b"a"])
    bad = bytearray(_batch(1, [b"b"]))
    bad[-1] ^= 0x01
    with pytest.raises(CorruptBatch) as e:
        list(iter_batches(good + bytes(bad)))
    assert e.value.position == len(good)


@pytest.mark.parametrize("cut", [1, BATCH_HEADER.size - 1, BATCH_HEADER.size + 3, -1])
def test_iter_batches_rejects_truncated_frame(cut):
    frame = _batch(0, [b"payload"])
    with pytest.raises(CorruptBatch, match="truncated"):
        list(iter_batches(frame[:cut]))


def test_iter_batches_rejects_body_shorter_than_its_header():
    frame = BATCH_HEADER.pack(4, crc32c.crc32c(b"abcd")) + b"abcd"
    with pytest.raises(CorruptBatch, match="bad body length"):
        list(iter_batches(frame))


def test_iter_batches_rejects_absurd_body_length():
    frame = BATCH_HEADER.pack(codec.MAX_BATCH_BYTES + 1, 0) + b"\0" * 64
    with pytest.raises(CorruptBatch, match="bad body length"):
        list(iter_batches(frame))


def test_iter_batches_rejects_empty_batch():
    with pytest.raises(CorruptBatch, match="empty batch"):
        list(iter_batches(frame_batch(0, 0, 0, 1, b"")))


def test_count_larger_than_records_is_corrupt_not_struct_error():
    # CRC is valid (the producer framed it), the header lies about the count.
    frame = frame_batch(0, 0, 3, 1, encode_records([b"only-one"]))
    with pytest.raises(CorruptBatch):
        list(iter_batches(frame))


def test_corrupt_batch_is_a_value_error_with_fields():
    e = CorruptBatch(12, "crc mismatch")
    assert isinstance(e, ValueError)
    assert (e.position, e.reason) == (12, "crc mismatch")
    assert "byte 12" in str(e) and "crc mismatch" in str(e)


def test_scan_valid_prefix_of_clean_buffer_is_whole():
    buf = _batch(0, [b"a"]) + _batch(1, [b"b", b"c"])
    n, hs = scan_valid_prefix(buf)
    assert n == len(buf)
    assert [h.base_offset for h in hs] == [0, 1]


def test_scan_valid_prefix_stops_at_torn_tail():
    a, b = _batch(0, [b"a"]), _batch(1, [b"b"])
    n, hs = scan_valid_prefix(a + b[:-3])
    assert n == len(a)
    assert [h.base_offset for h in hs] == [0]


def test_scan_valid_prefix_stops_at_corrupt_batch_and_ignores_later_good_ones():
    a, c = _batch(0, [b"a"]), _batch(2, [b"c"])
    b = bytearray(_batch(1, [b"b"]))
    b[-1] ^= 0xFF
    n, hs = scan_valid_prefix(a + bytes(b) + c)
    assert n == len(a)
    assert len(hs) == 1


def test_scan_valid_prefix_of_garbage_is_empty():
    assert scan_valid_prefix(b"\xff" * 40) == (0, [])
    assert scan_valid_prefix(b"") == (0, [])


def test_codec_accepts_memoryview():
    buf = memoryview(_batch(5, [b"x"]))
    assert [h.base_offset for h in iter_batches(buf)] == [5]
    assert [(o, bytes(m)) for o, _, m in iter_records(buf)] == [(5, b"x")]

