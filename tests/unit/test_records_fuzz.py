"""The records-block and batch-framing parsers take any bytes (issue 18, hostile input):
a block that is not well formed raises ValueError naming what is wrong, never anything else."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage_service.protocol import framing, records

pytestmark = pytest.mark.unit

VALID = records.encode([b"v1", None, b"v3"], [b"k", b"k2", None], ["T", "", "x"], [{"a": "b"}, {}, {}], [1, 2, 3])


@settings(max_examples=400, deadline=None, database=None)
@given(st.binary(max_size=400), st.integers(-2, 50))
def test_random_bytes_are_refused_with_value_error(block, count):
    try:
        records.parse(block, count)
    except ValueError as e:
        assert str(e)
    except Exception as e:          # noqa: BLE001 - the property under test
        pytest.fail(f"records.parse raised {type(e).__name__}: {e}")


@settings(max_examples=400, deadline=None, database=None)
@given(st.data())
def test_a_valid_block_with_bytes_changed_is_refused_or_parsed_never_crashes(data):
    block = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(block) - 1))
        block[i] = data.draw(st.integers(0, 255))
    try:
        cols = records.parse(bytes(block), 3)
        cols.message_sizes()
    except ValueError:
        pass


@settings(max_examples=300, deadline=None, database=None)
@given(st.binary(max_size=300))
def test_framing_scans_any_bytes_to_a_valid_prefix(buf):
    valid, headers = framing.scan_valid_prefix(buf)
    assert 0 <= valid <= len(buf)
    assert sum(h.size for h in headers) == valid


_ROW = st.tuples(st.one_of(st.none(), st.binary(max_size=20)), st.one_of(st.none(), st.binary(max_size=8)),
                 st.text(max_size=6), st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
                 st.integers(-2 ** 40, 2 ** 40))


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(_ROW, min_size=1, max_size=6), st.data())
def test_row_at_reads_the_row_iter_rows_reads(rows, data):
    """A key-value get reads one record with ``row_at``: the same record ``parse`` and
    ``iter_rows`` give, for any delta present (sparse ones too, as after compaction),
    and None for a delta the block does not hold."""
    gaps = data.draw(st.lists(st.integers(1, 3), min_size=len(rows), max_size=len(rows)))
    deltas = [sum(gaps[:i + 1]) - 1 for i in range(len(rows))]
    block = records.encode([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                           [r[3] for r in rows], [r[4] for r in rows], deltas)
    expected = list(records.iter_rows(records.parse(block, len(rows))))
    for want in expected:
        assert records.row_at(memoryview(block), len(rows), want[0]) == want
    assert records.row_at(block, len(rows), deltas[-1] + 1) is None
    missing = set(range(deltas[-1])) - set(deltas)
    assert all(records.row_at(block, len(rows), d) is None for d in missing)


@settings(max_examples=300, deadline=None, database=None)
@given(st.data())
def test_row_at_on_changed_bytes_answers_value_error_or_a_row_never_crashes(data):
    block = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        block[data.draw(st.integers(0, len(block) - 1))] = data.draw(st.integers(0, 255))
    try:
        records.row_at(bytes(block), 3, data.draw(st.integers(0, 3)))
    except (ValueError, UnicodeDecodeError):
        pass


_TWO = records.encode([b"v1", b"v2"], [b"k1", b"k2"], None, [{}, {"p": "q"}])


@pytest.mark.parametrize("block,why", [
    (_TWO + b"\0" * 4, "trailing bytes"),
    (_TWO[:-2], "truncated"),
    (_TWO[:24] + bytes([3]) + _TWO[25:], "null value but value bytes"),
    (_TWO[:25] + bytes([0x81]) + _TWO[26:], "unknown flag bits"),
], ids=["trailing", "truncated-properties", "null-with-bytes", "unknown-flags-elsewhere"])
@pytest.mark.parametrize("delta", [0, 1, 5], ids=["first", "second", "absent"])
def test_row_at_refuses_what_parse_refuses_whichever_row_is_asked(block, why, delta):
    with pytest.raises(ValueError, match=why):
        records.parse(block, 2, check=False)
    with pytest.raises(ValueError, match=why):
        records.row_at(block, 2, delta)


def _single_by_parse(block) -> tuple[int, bool] | None:
    """What ``sound_single`` must answer, from the full numpy parse (None: parse refuses it,
    or it is not a one-record block with delta 0 and no properties)."""
    try:
        cols = records.parse(block, 1)
    except ValueError:
        return None
    if cols.offset_delta[0] != 0 or cols.prop_off[-1]:
        return None
    return int(cols.message_sizes()[0]), bool(cols.has_key()[0])


_ONE = st.tuples(st.one_of(st.none(), st.binary(max_size=12)), st.one_of(st.none(), st.binary(max_size=6)),
                 st.text(max_size=4), st.integers(-2 ** 40, 2 ** 40))


@settings(max_examples=400, deadline=None, database=None)
@given(_ONE, st.data())
def test_one_record_check_agrees_with_parse_on_changed_bytes(row, data):
    """The produce path checks a one-record block with ``struct`` (``sound_single``):
    it accepts exactly the blocks the full parse accepts (with delta 0 and no
    properties) and reads the same message size and key flag, however the bytes
    were changed; a block it does not accept goes to the full parse."""
    value, key, tags, born = row
    block = bytearray(records.encode([value], [key], [tags], None, [born]))
    assert records.sound_single(bytes(block)) == _single_by_parse(bytes(block)) is not None
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(0, len(block) - 1))
        block[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, 2))       # a truncated or padded block too
    changed = bytes(block[:len(block) - cut]) if data.draw(st.booleans()) else bytes(block) + bytes(cut)
    assert records.sound_single(changed) == _single_by_parse(changed)


@settings(max_examples=300, deadline=None, database=None)
@given(st.binary(max_size=80))
def test_one_record_check_agrees_with_parse_on_random_bytes(block):
    assert records.sound_single(block) == _single_by_parse(block)


def test_one_record_check_leaves_properties_and_other_deltas_to_parse():
    with_props = records.encode([b"v"], None, None, [{"a": "b"}])
    assert records.parse(with_props, 1) and records.sound_single(with_props) is None
    later = records.encode([b"v"], offset_deltas=[3])
    assert records.parse(later, 1) and records.sound_single(later) is None
    assert records.sound_single(records.encode([None], [b"k"])) == (1, True)   # a tombstone
