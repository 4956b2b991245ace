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
