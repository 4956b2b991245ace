"""Record-batch framing: bytes in, bytes out (storage_service.protocol.framing)."""
from __future__ import annotations

import crc32c
import pytest

from storage_service.protocol import framing, records
from storage_service.protocol.framing import (
    BATCH_HEADER, BODY_HEADER, CorruptBatch,
    frame_batch, iter_batches, iter_blocks, records_of, scan_valid_prefix,
)

from ._helpers import encode_values, iter_values

pytestmark = pytest.mark.unit


def _batch(base: int, msgs: list[bytes], ts: int = 1000, raft_index: int = 1) -> bytes:
    return frame_batch(base, ts, len(msgs), raft_index, encode_values(msgs))


def test_frame_batch_layout_and_crc():
    block = encode_values([b"m"])
    frame = frame_batch(7, -5, 1, 42, block)
    body_len, crc = BATCH_HEADER.unpack_from(frame, 0)
    body = frame[BATCH_HEADER.size:]
    assert body_len == len(body) == BODY_HEADER.size + len(block)
    assert crc == crc32c.crc32c(body)
    assert BODY_HEADER.unpack_from(body, 0) == (7, -5, 1, 42)
    assert body[BODY_HEADER.size:] == block


def test_records_of_is_the_block_each_batch_was_framed_with():
    blocks = [encode_values([b"a", b"b"]), encode_values([b"ccc"])]
    a, b = frame_batch(0, 1, 2, 1, blocks[0]), frame_batch(2, 1, 1, 2, blocks[1])
    buf = a + b
    assert [bytes(records_of(buf, h)) for h in iter_batches(buf)] == blocks


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
    block = records.encode([b"a", b"b"], offset_deltas=[0, 5])
    h = next(iter_batches(frame_batch(100, 0, 2, 1, block)))
    assert (h.base_offset, h.last_offset, h.next_offset) == (100, 105, 106)


def test_last_offset_of_a_batch_whose_first_record_was_compacted_away():
    block = records.encode([b"c", b"d"], offset_deltas=[3, 4])
    h = next(iter_batches(frame_batch(10, 0, 2, 1, block)))
    assert (h.base_offset, h.last_offset, h.next_offset) == (10, 14, 15)
    assert [o for o, _, _ in iter_values(frame_batch(10, 0, 2, 1, block))] == [13, 14]


def test_iter_blocks_yields_each_header_with_its_parsed_columns():
    block = records.encode([b"v1", b"v2"], keys=[b"k", None], tags=["t", ""],
                           properties=[{"a": "1"}, {}], born_ts=[7, 8])
    buf = frame_batch(4, 99, 2, 1, block) + _batch(6, [b"x"], ts=100)
    got = list(iter_blocks(buf))
    assert [(h.base_offset, h.last_offset, h.store_ts) for h, _ in got] == [(4, 5, 99), (6, 6, 100)]
    assert [c.n for _, c in got] == [2, 1]
    assert [c.size for _, c in got] == [len(block), len(encode_values([b"x"]))]
    assert list(records.iter_rows(got[0][1])) == [(0, b"k", b"v1", "t", {"a": "1"}, 7),
                                                  (1, None, b"v2", "", {}, 8)]


def test_iter_blocks_of_empty_buffer_yields_nothing():
    assert list(iter_blocks(b"")) == []


def test_iter_values_yields_offsets_ts_and_payloads():
    buf = _batch(0, [b"a", b"b"], ts=10) + _batch(2, [b"c"], ts=20)
    got = [(o, ts, bytes(m)) for o, ts, m in iter_values(buf)]
    assert got == [(0, 10, b"a"), (1, 10, b"b"), (2, 20, b"c")]


def test_iter_values_min_offset_skips_within_and_across_batches():
    buf = _batch(0, [b"a", b"b"]) + _batch(2, [b"c", b"d"])
    assert [o for o, _, _ in iter_values(buf, min_offset=1)] == [1, 2, 3]
    assert [o for o, _, _ in iter_values(buf, min_offset=3)] == [3]
    assert list(iter_values(buf, min_offset=4)) == []


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
    frame = BATCH_HEADER.pack(framing.MAX_BATCH_BYTES + 1, 0) + b"\0" * 64
    with pytest.raises(CorruptBatch, match="bad body length"):
        list(iter_batches(frame))


def test_iter_batches_rejects_empty_batch():
    with pytest.raises(CorruptBatch, match="empty batch"):
        list(iter_batches(frame_batch(0, 0, 0, 1, b"")))


def test_count_larger_than_records_is_corrupt_not_struct_error():
    # CRC is valid (the producer framed it), the header lies about the count.
    frame = frame_batch(0, 0, 3, 1, encode_values([b"only-one"]))
    with pytest.raises(CorruptBatch):
        list(iter_batches(frame))


def test_count_far_larger_than_records_is_corrupt_in_iter_batches():
    # So many records that even their offset deltas cannot fit in the block.
    block = encode_values([b"only-one"])
    frame = frame_batch(0, 0, len(block), 1, block)
    with pytest.raises(CorruptBatch, match="cannot hold") as e:
        list(iter_batches(frame))
    assert e.value.position == 0


@pytest.mark.parametrize("count", [1, 2, 4, 5], ids=lambda c: f"count={c}")
def test_count_that_does_not_match_the_block_is_corrupt_in_iter_blocks(count):
    frame = _batch(0, [b"ab"]) + frame_batch(1, 0, count, 2, encode_values([b"x", b"yz", b"w"]))
    with pytest.raises(CorruptBatch, match="records block") as e:
        list(iter_blocks(frame))
    assert e.value.position == len(_batch(0, [b"ab"]))


@pytest.mark.parametrize("column", ["key", "value", "tags"])
def test_block_whose_data_offsets_overrun_it_is_corrupt_in_iter_blocks(column):
    # value_off (etc.) claims more bytes than the block holds; CRC is valid.
    block = bytearray(records.encode([b"v"], keys=[b"k"], tags=["t"]))
    pos = 4 + 8 + 1 + {"key": 4, "value": 4 + 4 + 1 + 4, "tags": 2 * (4 + 4 + 1) + 4}[column]
    assert block[pos] == 1                  # the end offset of the one-byte column
    block[pos] = 200
    frame = frame_batch(0, 0, 1, 1, bytes(block))
    with pytest.raises(CorruptBatch, match="truncated") as e:
        list(iter_blocks(frame))
    assert e.value.position == 0
    with pytest.raises(CorruptBatch):
        list(iter_values(frame))


def test_block_with_decreasing_data_offsets_is_corrupt_in_iter_blocks():
    block = bytearray(records.encode([b"ab", b"c"]))
    value_off = 2 * 4 + 2 * 8 + 2 + 3 * 4       # after deltas, born_ts, key_valid, key_off
    assert block[value_off + 4] == 2 and block[value_off + 8] == 3
    block[value_off + 8] = 1                      # value_off = [0, 2, 1]
    with pytest.raises(CorruptBatch, match="value offsets"):
        list(iter_blocks(frame_batch(0, 0, 2, 1, bytes(block))))


def test_block_with_trailing_bytes_is_corrupt_in_iter_blocks():
    frame = frame_batch(0, 0, 1, 1, encode_values([b"a"]) + b"\0")
    assert [h.last_offset for h in iter_batches(frame)] == [0]
    with pytest.raises(CorruptBatch, match="trailing"):
        list(iter_blocks(frame))


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
    assert [(o, bytes(m)) for o, _, m in iter_values(buf)] == [(5, b"x")]
    assert [h.base_offset for h, _ in iter_blocks(buf)] == [5]
    assert bytes(records_of(buf, next(iter_batches(buf)))) == encode_values([b"x"])



def test_frame_parts_join_to_frame_batch():
    block = encode_values([b"a", b"bc"])
    parts = framing.frame_parts(7, 123, 2, 99, block)
    assert parts[2] is block                     # the block is not copied
    assert b"".join(parts) == framing.frame_batch(7, 123, 2, 99, block)
    [h] = framing.iter_batches(b"".join(parts))
    assert (h.base_offset, h.store_ts, h.count, h.apply_position) == (7, 123, 2, 99)
