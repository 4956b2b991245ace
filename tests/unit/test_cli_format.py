"""CLI parsing helpers (rmq_spark.cli._format)."""
from __future__ import annotations

import pytest

from rmq_spark.cli._format import human_bytes, parse_duration_ms, parse_size_bytes, table

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text,ms", [
    ("500ms", 500), ("30s", 30_000), ("5m", 300_000), ("2h", 7_200_000),
    ("7d", 7 * 86_400_000), ("0s", 0), (" 10S ", 10_000), ("1D", 86_400_000),
])
def test_parse_duration_units(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["0", "forever", "none", "FOREVER"])
def test_parse_duration_no_limit_is_zero(text):
    assert parse_duration_ms(text) == 0


@pytest.mark.parametrize("text", ["", "7", "d", "1.5h", "-1s", "7 days", "10w", "s10", "1h30m"])
def test_parse_duration_bad_input_names_the_input_and_units(text):
    with pytest.raises(ValueError) as e:
        parse_duration_ms(text)
    msg = str(e.value)
    assert repr(text) in msg
    assert "s, m, h or d" in msg and "7d" in msg


@pytest.mark.parametrize("text,n", [
    ("0", 0), ("512", 512), ("512B", 512), ("4KB", 4 << 10), ("4k", 4 << 10),
    ("10MB", 10 << 20), ("10 mb", 10 << 20), ("3GB", 3 << 30), ("2TB", 2 << 40), ("1t", 1 << 40),
])
def test_parse_size_units_are_powers_of_1024(text, n):
    assert parse_size_bytes(text) == n


@pytest.mark.parametrize("text", ["", "GB", "1.5GB", "-1KB", "10PB", "10 gigabytes"])
def test_parse_size_bad_input_names_the_input_and_units(text):
    with pytest.raises(ValueError) as e:
        parse_size_bytes(text)
    assert repr(text) in str(e.value) and "GB" in str(e.value)


def test_human_bytes():
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(10 << 30) == "10.0 GiB"
    assert human_bytes(5 << 50) == "5120.0 TiB"


def test_table_aligns_columns_under_a_rule():
    out = table([["a", 1], ["bbb", 22]], ["name", "n"])
    assert out.splitlines() == ["name  n", "----  --", "a     1", "bbb   22"]
