"""The columnar records block: bytes in, bytes out (storage_service.protocol.records)."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from storage_service.protocol import records
from storage_service.protocol.records import Columns, concat, encode, iter_rows, last_delta, parse, select

pytestmark = pytest.mark.unit

# The layout from the module docstring, section by section, with the struct
# code of one element (None: raw bytes). Tests build blocks from these parts
# by hand, so a malformed block is "a valid one with one section changed".
SECTIONS = {
    "offset_delta": "I", "born_ts": "q", "flags": "B",
    "key_off": "i", "key_data": None,
    "value_off": "i", "value_data": None,
    "tags_off": "i", "tags_data": None,
    "prop_off": "i",
    "pk_off": "i", "pk_data": None,
    "pv_off": "i", "pv_data": None,
}
OFFSET_SECTIONS = {"key_off": "key", "value_off": "value", "tags_off": "tags", "prop_off": "property",
                   "pk_off": "property key", "pv_off": "property value"}

# Two records: (key b"k1", value b"abc", tags "x", {"p": "vv", "q": "w"}, born 5)
# and (no key, empty value, tags "y", no properties, born 6).
SAMPLE = {
    "offset_delta": [0, 1], "born_ts": [5, 6], "flags": [1, 0],
    "key_off": [0, 2, 2], "key_data": b"k1",
    "value_off": [0, 3, 3], "value_data": b"abc",
    "tags_off": [0, 1, 2], "tags_data": b"xy",
    "prop_off": [0, 2, 2],
    "pk_off": [0, 1, 2], "pk_data": b"pq",
    "pv_off": [0, 2, 3], "pv_data": b"vvw",
}
SAMPLE_ROWS = [(0, b"k1", b"abc", "x", {"p": "vv", "q": "w"}, 5), (1, None, b"", "y", {}, 6)]


def _block(**changes) -> bytes:
    """The SAMPLE block laid out by hand, with some sections replaced."""
    parts = {**SAMPLE, **changes}
    out = []
    for name, code in SECTIONS.items():
        v = parts[name]
        out.append(v if code is None else struct.pack(f"<{len(v)}{code}", *v))
    return b"".join(out)


def _encode_sample() -> bytes:
    return encode([b"abc", b""], keys=[b"k1", None], tags=["x", "y"],
                  properties=[{"p": "vv", "q": "w"}, {}], born_ts=[5, 6])


# A richer block for round trips: None vs empty keys, empty values, unicode
# text, several properties, extreme timestamps, offset gaps.
RICH = {
    "values": [b"", b"\x00\xffbinary", b"v" * 1000, b"last"],
    "keys": [None, b"", b"k\x00ey", None],
    "tags": ["", "注文", "émoji 🎉", "plain"],
    "properties": [{}, {"ключ": "значение", "a": ""}, {"": "empty-key"},
                   {"x": "1", "y": "2", "z": "3"}],
    "born_ts": [0, -1, 2**62, 1_700_000_000_000],
    "offset_deltas": [0, 3, 4, 2**32 - 1],
}


def _rich_rows() -> list[tuple]:
    return [(RICH["offset_deltas"][i], RICH["keys"][i], RICH["values"][i], RICH["tags"][i],
             RICH["properties"][i], RICH["born_ts"][i]) for i in range(4)]


# ------------------------------------------------------------------ layout and round trip
def test_encode_follows_the_documented_layout():
    assert _encode_sample() == _block()


def test_encode_defaults_are_no_key_no_tags_no_properties_deltas_0_to_n():
    block = encode([b"a", b"bc", b""])
    assert block == b"".join([
        struct.pack("<3I", 0, 1, 2), struct.pack("<3q", 0, 0, 0), bytes([0, 0, 0]),
        struct.pack("<4i", 0, 0, 0, 0),
        struct.pack("<4i", 0, 1, 3, 3), b"abc",
        struct.pack("<4i", 0, 0, 0, 0),
        struct.pack("<4i", 0, 0, 0, 0),
        struct.pack("<1i", 0), struct.pack("<1i", 0),
    ])
    assert list(iter_rows(parse(block, 3))) == [(0, None, b"a", "", {}, 0), (1, None, b"bc", "", {}, 0),
                                                 (2, None, b"", "", {}, 0)]


def test_round_trip_of_every_column():
    block = encode(**RICH)
    cols = parse(block, 4)
    assert isinstance(cols, Columns)
    assert (cols.n, cols.size) == (4, len(block))
    assert list(iter_rows(cols)) == _rich_rows()


def test_parsed_columns_are_arrays_of_the_documented_types():
    cols = parse(encode(**RICH), 4)
    assert cols.offset_delta.tolist() == RICH["offset_deltas"]
    assert cols.born_ts.tolist() == RICH["born_ts"]
    assert cols.flags.tolist() == [0, 1, 1, 0]
    assert (cols.offset_delta.dtype, cols.born_ts.dtype, cols.flags.dtype) == \
        (np.dtype("<u4"), np.dtype("<i8"), np.dtype("u1"))
    assert bytes(cols.value_data) == b"".join(RICH["values"])
    assert cols.value_off.tolist() == [0, 0, 8, 1008, 1012]
    assert cols.prop_off.tolist() == [0, 0, 2, 3, 6]


def test_none_key_and_empty_key_stay_distinct():
    rows = list(iter_rows(parse(encode([b"1", b"2"], keys=[None, b""]), 2)))
    assert [r[1] for r in rows] == [None, b""]


def test_parse_accepts_bytearray_and_memoryview():
    block = encode(**RICH)
    framed = b"HEAD" + block + b"TAIL"
    for view in (bytearray(block), memoryview(block), memoryview(framed)[4:-4]):
        assert list(iter_rows(parse(view, 4))) == _rich_rows()


def test_parse_of_an_empty_block_with_no_records():
    block = encode([])
    assert block == struct.pack("<6i", *[0] * 6)       # six offset arrays of one entry
    cols = parse(block, 0)
    assert (cols.n, cols.size) == (0, len(block))
    assert list(iter_rows(cols)) == []
    assert cols.message_sizes().tolist() == []


def test_parse_of_no_bytes_is_truncated_even_for_no_records():
    with pytest.raises(ValueError, match="truncated"):
        parse(b"", 0)


# ------------------------------------------------------------------ message_sizes
def test_message_sizes_count_key_value_tags_and_property_bytes():
    sizes = parse(encode(**RICH), 4).message_sizes()
    expected = [
        len(v) + len(k or b"") + len(t.encode())
        + sum(len(a.encode()) + len(b.encode()) for a, b in p.items())
        for v, k, t, p in zip(RICH["values"], RICH["keys"], RICH["tags"], RICH["properties"])
    ]
    assert sizes.tolist() == expected
    assert expected == [0, 8 + 0 + 6 + 8 + 16 + 1, 1000 + 4 + 11 + 9, 4 + 5 + 6]


def test_message_sizes_of_the_sample():
    assert parse(_block(), 2).message_sizes().tolist() == [2 + 3 + 1 + 2 + 3, 1]


# ------------------------------------------------------------------ last_delta
def test_last_delta_is_the_delta_of_the_last_record():
    assert last_delta(encode([b"a", b"b", b"c"]), 3) == 2
    assert last_delta(encode([b"a", b"b", b"c"], offset_deltas=[0, 2, 9]), 3) == 9
    assert last_delta(encode(**RICH), 4) == 2**32 - 1


def test_last_delta_agrees_with_parse_and_accepts_views():
    block = encode(**RICH)
    assert last_delta(memoryview(block), 4) == last_delta(bytearray(block), 4) == \
        int(parse(block, 4).offset_delta[-1])


@pytest.mark.parametrize("n", [0, -1], ids=["zero", "negative"])
def test_last_delta_of_no_records_is_an_error(n):
    with pytest.raises(ValueError, match="cannot hold"):
        last_delta(encode([b"a"]), n)


def test_last_delta_of_a_block_too_short_for_the_deltas_is_an_error():
    with pytest.raises(ValueError, match=r"records block of 7 bytes cannot hold 2 records"):
        last_delta(b"\0" * 7, 2)


# ------------------------------------------------------------------ select
def _five() -> tuple[bytes, list[tuple]]:
    values = [f"v{i}".encode() for i in range(5)]
    keys = [b"a", None, b"c", b"", b"e"]
    tags = ["t0", "", "t2", "ü", "t4"]
    props = [{"i": str(i)} if i % 2 else {} for i in range(5)]
    born = [100 + i for i in range(5)]
    block = encode(values, keys, tags, props, born)
    return block, list(iter_rows(parse(block, 5)))


def test_select_keeps_the_chosen_rows_and_their_offset_deltas():
    block, rows = _five()
    out = select(parse(block, 5), [1, 3, 4])
    assert list(iter_rows(parse(out, 3))) == [rows[1], rows[3], rows[4]]
    assert parse(out, 3).offset_delta.tolist() == [1, 3, 4]
    assert last_delta(out, 3) == 4


def test_select_of_a_selection_keeps_the_original_deltas():
    block, rows = _five()
    once = select(parse(block, 5), [0, 2, 4])
    twice = select(parse(once, 3), [1, 2])
    assert list(iter_rows(parse(twice, 2))) == [rows[2], rows[4]]


def test_select_of_every_row_is_the_same_block():
    block, _ = _five()
    assert select(parse(block, 5), range(5)) == block


def test_select_of_no_rows_is_an_empty_block():
    block, _ = _five()
    out = select(parse(block, 5), [])
    assert out == encode([])
    assert parse(out, 0).n == 0


def test_select_keeps_none_keys_and_unicode():
    out = select(parse(encode(**RICH), 4), [0, 2])
    assert list(iter_rows(parse(out, 2))) == [_rich_rows()[0], _rich_rows()[2]]


# ------------------------------------------------------------------ malformed blocks
def test_the_hand_built_sample_parses():
    assert list(iter_rows(parse(_block(), 2))) == SAMPLE_ROWS


@pytest.mark.parametrize("block,n", [(_block(), 2), (encode(**RICH), 4)], ids=["sample", "rich"])
def test_a_block_truncated_anywhere_is_an_error(block, n):
    for cut in range(len(block)):
        with pytest.raises(ValueError, match=r"records block truncated at byte \d+"):
            parse(block[:cut], n)


@pytest.mark.parametrize("section", list(OFFSET_SECTIONS))
def test_decreasing_data_offsets_are_an_error(section):
    off = list(SAMPLE[section])
    off[1] = off[-1] + 1                     # [0, L + 1, L]: still ends at the data length
    with pytest.raises(ValueError, match=f"records block: {OFFSET_SECTIONS[section]} offsets are not"):
        parse(_block(**{section: off}), 2)


@pytest.mark.parametrize("section", ["key_off", "value_off", "tags_off", "pk_off", "pv_off"])
@pytest.mark.parametrize("inner", [1, -1, 7])
def test_an_empty_column_whose_offsets_leave_zero_is_an_error(section, inner):
    # A column with no data (the common case: no keys, tags or properties) is
    # checked by one compare with zeros; a non-zero offset inside still fails.
    data = section.replace("_off", "_data")
    n_off = 3 if section not in ("pk_off", "pv_off") else SAMPLE["prop_off"][-1] + 1
    off = [0] * n_off
    off[1] = inner
    with pytest.raises(ValueError, match=f"records block: {OFFSET_SECTIONS[section]} offsets are not"):
        parse(_block(**{section: off, data: b""}), 2)


@pytest.mark.parametrize("section", list(OFFSET_SECTIONS))
@pytest.mark.parametrize("first", [1, -1])
def test_data_offsets_not_starting_at_zero_are_an_error(section, first):
    off = list(SAMPLE[section])
    off[0] = first
    with pytest.raises(ValueError, match=f"records block: {OFFSET_SECTIONS[section]} offsets are not"):
        parse(_block(**{section: off}), 2)


@pytest.mark.parametrize("section", ["key_off", "value_off", "tags_off", "pk_off", "pv_off"])
def test_data_offsets_past_the_end_of_the_block_are_an_error(section):
    off = list(SAMPLE[section])
    off[-1] += 1000
    with pytest.raises(ValueError, match="records block truncated"):
        parse(_block(**{section: off}), 2)


@pytest.mark.parametrize("extra", [b"\0", b"xyz"])
def test_trailing_bytes_are_an_error(extra):
    with pytest.raises(ValueError, match=f"records block has {len(extra)} trailing bytes"):
        parse(_block() + extra, 2)


@pytest.mark.parametrize("n", [0, 1, 3, 5, 8, 100])
def test_count_that_does_not_match_the_block_is_an_error(n):
    block = encode(**RICH)                   # 4 records
    with pytest.raises(ValueError, match="records block") as e:
        parse(block, n)
    assert str(e.value)


def test_count_one_less_on_the_sample_is_an_error():
    with pytest.raises(ValueError, match="records block"):
        parse(_block(), 1)


def test_any_single_corrupt_byte_fails_only_with_value_error():
    # Parsing arbitrary bytes must never surface numpy / index / struct errors.
    block = encode(**RICH)
    for pos in range(len(block)):
        bad = bytearray(block)
        bad[pos] ^= 0xFF
        try:
            list(iter_rows(parse(bytes(bad), 4)))
        except ValueError:
            pass


@pytest.mark.parametrize("deltas", [[1, 0], [0, 0], [5, 5]], ids=["decreasing", "repeated-0", "repeated-5"])
def test_offset_deltas_that_do_not_increase_are_an_error(deltas):
    # Offsets inside a batch are ascending: last_delta() is taken as the
    # batch's last offset (codec.BatchHeader.last_offset), which is only
    # true if the deltas increase. Gaps (compaction) are fine, see select.
    with pytest.raises(ValueError, match="records block"):
        parse(_block(offset_delta=deltas), 2)


@pytest.mark.parametrize("section,data", [("tags_data", b"\xffy"), ("pk_data", b"p\xc3"),
                                          ("pv_data", b"\xe2\x82w")], ids=["tags", "property-key",
                                                                           "property-value"])
def test_text_that_is_not_utf8_is_an_error(section, data):
    # The layout says tags and properties are utf-8; a block parse() accepts
    # must not fail later in iter_rows() (a poison message for every reader).
    assert len(data) == len(SAMPLE[section])
    with pytest.raises(ValueError, match="records block"):
        parse(_block(**{section: data}), 2)


def test_all_names_are_exported():
    assert set(records.__all__) == {"Columns", "FLAG_KEY", "FLAG_NULL_VALUE", "concat", "encode", "parse",
                                    "last_delta", "iter_rows", "select", "min_block_size", "sound_single"}


@pytest.mark.parametrize("keys, tags, props", [
    (None, None, None),
    ([None, None, None], ["", "", ""], [{}, {}, {}]),
    ([None, b"", b"k"], ["", "a", "\u00e9"], [{}, {"a": "b"}, {"x": "", "": "y"}]),
    ([b"k1", None, None], None, [{}, {}, {"p": "q"}]),
])
def test_columns_without_data_encode_like_columns_given_item_by_item(keys, tags, props):
    values = [b"a", b"", b"ccc"]
    explicit = encode(values, keys or [None] * 3, tags or [""] * 3, props or [{}] * 3, [1, 2, 3])
    assert encode(values, keys, tags, props, [1, 2, 3]) == explicit
    rows = list(iter_rows(parse(explicit, 3)))
    assert [r[1] for r in rows] == (keys or [None] * 3)
    assert [r[3] for r in rows] == (tags or [""] * 3)
    assert [r[4] for r in rows] == (props or [{}] * 3)


# ---------------------------------------------------------------- tombstones

def test_null_value_round_trips_distinct_from_an_empty_value():
    block = encode([None, b"", b"v", None], keys=[b"a", b"b", None, None], born_ts=[1, 2, 3, 4])
    cols = parse(block, 4)
    assert cols.flags.tolist() == [3, 1, 0, 2]
    assert cols.has_key().tolist() == [True, True, False, False]
    assert cols.value_null().tolist() == [True, False, False, True]
    assert cols.value_off.tolist() == [0, 0, 0, 1, 1]          # a null value takes no bytes
    assert [(r[1], r[2]) for r in iter_rows(cols)] == [(b"a", None), (b"b", b""), (None, b"v"),
                                                       (None, None)]


def test_blocks_from_before_tombstones_read_the_same():
    # Stored blocks have flags 0/1 only (the old key_valid byte): bit0 is still "has a key".
    assert list(iter_rows(parse(_block(), 2))) == SAMPLE_ROWS
    assert not parse(_block(), 2).value_null().any()


def test_select_keeps_tombstones():
    block = encode([b"x", None, b""], keys=[b"k", b"k", b"j"], offset_deltas=[0, 1, 2])
    out = select(parse(block, 3), [1, 2])
    assert [(r[0], r[1], r[2]) for r in iter_rows(parse(out, 2))] == [(1, b"k", None), (2, b"j", b"")]


@pytest.mark.parametrize("flags", [[1, 4], [0x81, 0], [0xFF, 0]])
def test_unknown_flag_bits_are_an_error(flags):
    with pytest.raises(ValueError, match="unknown flag bits"):
        parse(_block(flags=flags), 2)


def test_a_null_value_with_value_bytes_is_an_error():
    with pytest.raises(ValueError, match="message 0 has a null value but value bytes"):
        parse(_block(flags=[3, 0]), 2)          # record 0 holds b"abc"
    assert [r[2] for r in iter_rows(parse(_block(flags=[1, 2]), 2))] == [b"abc", None]


# ------------------------------------------------- trusted parse, concat

def test_parse_without_content_checks_still_checks_section_bounds():
    # check=False is for CRC-verified stored blocks: contents are trusted, bounds never.
    assert list(iter_rows(parse(_block(), 2, check=False))) == SAMPLE_ROWS
    parse(_block(offset_delta=[1, 0]), 2, check=False)              # contents not checked
    for bad in (_block(value_off=[0, 3, 9]), _block(pk_off=[0, 1, -5]), _block() + b"x",
                _block()[:-1]):
        with pytest.raises(ValueError, match="records block"):
            parse(bad, 2, check=False)


def _spans(blocks: list[tuple[bytes, int]], gap: bytes = b"HDR") -> tuple[bytes, list]:
    """Blocks laid out in one buffer with ``gap`` before each (as frame headers are)."""
    buf, spans = b"", []
    for block, n in blocks:
        buf += gap
        spans.append((len(buf), len(buf) + len(block), n))
        buf += block
    return buf, spans


def test_concat_equals_the_blocks_parsed_one_by_one():
    blocks = [(_encode_sample(), 2),
              (encode([b"x" * 300, None, b""], keys=[None, b"k", b""], tags=["", "t", "\u00e9"],
                      born_ts=[7, 8, 9], offset_deltas=[0, 4, 5]), 3),
              (encode([b"last"], properties=[{"a": "1", "b": "22"}], born_ts=[10]), 1)]
    buf, spans = _spans(blocks)
    c = concat(buf, spans)
    one_by_one = [r for block, n in blocks for r in iter_rows(parse(block, n))]
    assert c.n == 6 and list(iter_rows(c)) == one_by_one
    assert c.offset_delta.tolist() == [0, 1, 0, 4, 5, 0]       # still relative to each block
    assert c.value_null().tolist() == [False, False, False, True, False, False]
    assert c.size == sum(len(b) for b, _ in blocks)


@pytest.mark.parametrize("bad", [_block()[:-1], _block() + b"x", _block(tags_off=[0, 1, 99])])
def test_concat_refuses_a_block_whose_sections_do_not_fit(bad):
    buf, spans = _spans([(_encode_sample(), 2), (bad, 2)])
    with pytest.raises(ValueError, match="records block"):
        concat(buf, spans)


@pytest.mark.parametrize("bad", [
    _block(value_off=[0, 3, 1], value_data=b"a"),   # decreasing: Arrow would read past the data
    _block(key_off=[1, 2, 2]),                       # not from 0
    _block(pv_off=[0, 5, 3]),
    _block(flags=[4, 0]),                        # unknown flag bits
    _block(flags=[3, 0]),                        # a null value with value bytes
])
def test_concat_refuses_offsets_arrow_cannot_trust_and_unknown_flags(bad):
    # A CRC only says the bytes are the ones stored: the columns handed to Arrow
    # must still be in bounds, whatever a block says.
    buf, spans = _spans([(_encode_sample(), 2), (bad, 2)])
    with pytest.raises(ValueError, match="records block"):
        concat(buf, spans)


def test_parse_without_content_checks_still_checks_flags():
    with pytest.raises(ValueError, match="unknown flag bits"):
        parse(_block(flags=[2 | 4, 0]), 2, check=False)
