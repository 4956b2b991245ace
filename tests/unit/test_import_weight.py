"""What a Spark Python process imports to plan and read hot ranges: nothing it does not use.

Every streaming query's start launches a Python process for the source's driver
side, and every executor's Python worker imports the reader; their imports are
part of each query's start (bench/README.md). pandas (~0.35 s) came in through
``pa.array()`` of numpy arrays, ``pyarrow.parquet`` through the archive reader
(needed only where an archive is read), and crc32c's package looks its own
version up through ``importlib.metadata``, which walks every ``sys.path`` entry
(in Spark, its zips and jars): the planner never checks a CRC, so never needs
it. A subprocess imports the planner's modules, then converts a fetched batch
as a worker does, and says what got loaded after each. (pyarrow's
``to_numpy`` imports pandas as well, whatever the array.)
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

_PROBE = r"""
import json, sys
import pyspark_rocketmq                                   # what Spark's planner process loads
from rmq_spark.datasource import _batch_reader, _stream_reader, _planning, _read
print(json.dumps(sorted(sys.modules)))
from rmq_spark.client.arrow import batches_to_arrow, with_headers
from storage_service.protocol import framing, records

block = records.encode([b"v%d" % i for i in range(100)], keys=[b"k"] * 100,
                       properties=[{"p": str(i)} if i % 3 else {} for i in range(100)])
# a range ending inside a batch (the batch is cut), with headers (includeHeaders)
rb = batches_to_arrow(framing.frame_batch(0, 1_700_000_000_000, 100, 0, block), "t", 0, start=10, end=90)
assert rb.num_rows == 80 and with_headers(rb).column("headers").null_count == 26
print(json.dumps(sorted(sys.modules)))
"""


def test_the_reader_imports_neither_pandas_nor_parquet_nor_package_metadata():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    planner, worker = (set(json.loads(line)) for line in out.stdout.splitlines()[-2:])
    assert "rmq_spark.datasource._read" in planner and "crc32c" in worker     # the probe did run
    assert not {"pandas", "pyarrow.parquet", "rmq_spark.archive.reader", "crc32c"} & planner
    assert not {"pandas", "pyarrow.parquet", "rmq_spark.archive.reader"} & worker
