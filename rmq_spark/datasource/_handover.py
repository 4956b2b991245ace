"""Small micro-batches read by the driver and handed to Spark in memory.

A Spark task of a Python data source costs some 50 ms before it reads a byte
(a Python worker round trip, the pickled reader, an Arrow stream each way);
for a micro-batch of a few hundred records that is most of the batch. Spark
has a path without that task, made for its ``SimpleDataSourceStreamReader``:
when the planner process's reader is a ``_SimpleStreamReaderWrapper``, the
planner asks it ``getCache(start, end)`` right after ``partitions`` and sends
the Arrow batches it returns to the JVM, which keeps them in the block manager
and reads them in a JVM task (``PythonMicroBatchStream.planInputPartitions``,
``PythonStreamingPartitionReaderFactory``). If that block is ever missing the
task reads the one planned partition as usual, so the handover is only an
optimisation.

The same check makes the planner drop ``reportLatestOffset`` (it answers
"none" for a wrapper), and the stream reader wants both. So the reader is a
``HandingOver`` (``_stream_reader.py``) only from a ``partitions`` call that
read its batch to its next call from Spark: in between Spark asks for
``getCache`` and nothing else, and ``latestOffset`` (which comes before every
``reportLatestOffset``) turns it back. pyspark is pinned; the test
``test_small_batches_are_handed_over_in_memory`` fails if that contract moves.
"""
from __future__ import annotations

import pyarrow as pa

from rmq_spark.client import Client

from ._options import ReadOptions
from ._planning import ArchiveRange, QueueRanges
from ._read import read_partition

__all__ = ["HANDOVER_MAX_BYTES", "read_small_batch"]

HANDOVER_MAX_BYTES = 4 << 20       # a batch over this goes to a task after all


def read_small_batch(client: Client, opts: ReadOptions, parts: list) -> list[pa.RecordBatch] | None:
    """The records of a plan of one hot-log partition of at most ``driverReadRecords``
    records and ``HANDOVER_MAX_BYTES``, or None: then a task reads them."""
    if not opts.driver_read_records or len(parts) != 1 or isinstance(parts[0], ArchiveRange):
        return None
    ranges = parts[0].ranges if isinstance(parts[0], QueueRanges) else (parts[0],)
    if sum(r.end - r.start for r in ranges) > opts.driver_read_records:
        return None
    batches, size = [], 0
    for rb in read_partition(opts, parts[0], client):
        size += rb.nbytes
        if size > HANDOVER_MAX_BYTES:
            return None
        batches.append(rb)
    return batches
