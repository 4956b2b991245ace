"""The sink's Arrow -> records block encoder writes null value cells as tombstones."""
from __future__ import annotations

import pyarrow as pa
import pytest

from rmq_spark.datasource._encode import encode_block, normalize_columns
from storage_service.protocol import records

pytestmark = pytest.mark.unit


def test_null_value_and_key_cells_encode_like_the_service_codec():
    value = pa.array([b"x", None, b"", None], pa.binary())
    key = pa.array([b"a", b"a", None, None], pa.binary())
    block = encode_block(normalize_columns(value, key, None, None, pa.array([1, 2, 3, 4]), now_ms=0))
    assert block == records.encode([b"x", None, b"", None], [b"a", b"a", None, None],
                                   born_ts=[1, 2, 3, 4])
    assert records.parse(block, 4).value_null().tolist() == [False, True, False, True]
