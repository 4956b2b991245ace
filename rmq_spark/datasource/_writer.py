"""``df.write`` / ``df.writeStream`` ``.format("rocketmq")``: the exactly-once sink.

Every task writes its rows as one producer and numbers its calls (see
``_sink``); this module only picks the producer identity and the batch id:

- streaming: ``f"{query id}-{partition}"`` and Spark's micro-batch id. The
  query id is kept in the checkpoint, so a micro-batch replayed after a
  driver crash writes with the same identity and sequences.
- batch: ``f"{idempotenceKey}-{partition}"`` (or a random job id when the
  option is not given) and batch id 0.

Tasks send every complete produce call themselves; the last partial call of
each queue comes back in the commit message and ``commit`` sends it (see
``_sink`` for why). ``commit`` is safe to repeat: the calls are idempotent.
``abort`` has nothing to undo: rows of failed attempts are already in the
log, and the retry's duplicates of them are dropped by the service.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)
from pyspark.sql.types import StructType

from ._options import WriteOptions
from ._sink import Tail, send_tails, write_task
from ._writer_plan import SinkPlan
from .errors import ConnectorError

__all__ = ["BatchWriter", "StreamWriter", "WriteCommit"]

log = logging.getLogger(__name__)
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


@dataclass
class WriteCommit(WriterCommitMessage):
    """What one task wrote; ``duplicate_rows`` were already in the log (a retry)."""
    partition: int
    attempt: int
    producer_id: str
    rows: int
    calls: int
    duplicate_rows: int
    tails: list[Tail] = field(default_factory=list)


def _task_write(plan: SinkPlan, batches: Iterator[pa.RecordBatch], writer_id: str,
                batch_id: int) -> WriteCommit:
    tc = TaskContext.get()
    partition = tc.partitionId()
    producer_id = f"{writer_id}-{partition}"
    res = write_task(plan, batches, producer_id, batch_id, partition)
    return WriteCommit(partition, tc.attemptNumber(), producer_id, res.rows, res.calls,
                       res.duplicate_rows, res.tails)


def _commit(plan: SinkPlan, messages: Sequence[Optional[WriterCommitMessage]]) -> str:
    """Send the tasks' tails; return a summary for the log."""
    done = [m for m in messages if isinstance(m, WriteCommit)]
    tail_rows, tail_dups = send_tails(plan.endpoints, [(m.producer_id, t) for m in done
                                                       for t in m.tails], plan.tls, plan.token)
    rows = sum(m.rows for m in done) + tail_rows
    dups = sum(m.duplicate_rows for m in done) + tail_dups
    return (f"{len(done)}/{len(messages)} tasks, {rows} rows "
            f"({dups} already written by an earlier attempt)")


def _summary(messages: Sequence[Optional[WriterCommitMessage]]) -> str:
    done = [m for m in messages if isinstance(m, WriteCommit)]
    return f"{len(done)}/{len(messages)} tasks reported, {sum(m.rows for m in done)} rows sent"


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: WriteOptions, schema: StructType):
        self.plan = SinkPlan.from_schema(schema, opts)
        self.writer_id = opts.idempotence_key or f"job-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        return _task_write(self.plan, iterator, self.writer_id, 0)

    def commit(self, messages: list[Optional[WriterCommitMessage]]) -> None:
        log.info("rocketmq write %s committed: %s", self.writer_id, _commit(self.plan, messages))

    def abort(self, messages: list[Optional[WriterCommitMessage]]) -> None:
        log.warning("rocketmq write %s aborted: %s; rows already sent stay in the log (re-run "
                    "with the same idempotenceKey to complete it without duplicates)",
                    self.writer_id, _summary(messages))


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: WriteOptions, schema: StructType):
        self.plan = SinkPlan.from_schema(schema, opts)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        tc = TaskContext.get()
        batch_id = tc.getLocalProperty(BATCH_ID_PROPERTY)
        query_id = tc.getLocalProperty(QUERY_ID_PROPERTY)
        if batch_id is None or query_id is None:
            raise ConnectorError("the streaming sink runs without Spark's micro-batch id or "
                                 f"query id ({BATCH_ID_PROPERTY}, {QUERY_ID_PROPERTY}); cannot "
                                 "write exactly once")
        return _task_write(self.plan, iterator, query_id, int(batch_id))

    def commit(self, messages: list[Optional[WriterCommitMessage]], batchId: int) -> None:
        log.info("rocketmq micro-batch %d committed: %s", batchId, _commit(self.plan, messages))

    def abort(self, messages: list[Optional[WriterCommitMessage]], batchId: int) -> None:
        log.warning("rocketmq micro-batch %d aborted: %s; Spark replays it and the service "
                    "drops rows already written", batchId, _summary(messages))
