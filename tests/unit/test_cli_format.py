"""CLI printing helpers (rmq_spark.cli._format); durations and sizes: test_units.py."""
from __future__ import annotations

import pytest

from rmq_spark.cli._format import table

pytestmark = pytest.mark.unit


def test_table_aligns_columns_under_a_rule():
    out = table([["a", 1], ["bbb", 22]], ["name", "n"])
    assert out.splitlines() == ["name  n", "----  --", "a     1", "bbb   22"]
