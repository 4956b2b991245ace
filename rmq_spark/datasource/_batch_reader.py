"""``spark.read.format("rocketmq")``: a snapshot of the subscribed queues.

``partitions()`` runs once, at planning: it resolves the start and end
offsets of every queue (``latest`` included) then, so the DataFrame is a
fixed snapshot however long its tasks take.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from rmq_spark.client import Client

from . import _archive_hot, _planning
from ._options import ReadOptions
from ._planning import QueueRange
from ._read import read_partition
from .errors import OptionError

__all__ = ["BatchReader"]


class BatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions):
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        with Client(self.opts.endpoints, tls=self.opts.tls, token=self.opts.token) as client:
            state = _planning.subscribed_state(client, self.opts)
            start = _planning.resolve(client, self.opts.starting, state, "earliest")
            end = _planning.resolve(client, self.opts.ending, state, "latest")
        archived, hot = [], []
        for t in sorted(state):
            for q in sorted(state[t]):
                a, h = self._range(state, start, end, t, q)
                archived += a
                hot += [h] if h is not None else []
        return archived + _planning.plan_hot(hot, self.opts.min_partitions, self.opts.pack_records)

    def _range(self, state: _planning.State, start: dict, end: dict, topic: str,
               queue: int) -> tuple[list[_planning.ArchiveRange], QueueRange | None]:
        s, e, o = start[topic][queue], end[topic][queue], state[topic][queue]
        if e > o.latest:
            raise OptionError("endingOffsets", f"topic {topic!r} queue {queue}: {e} is past "
                              f"the end of the queue (latest = {o.latest})")
        if s > e:
            raise OptionError("startingOffsets", f"topic {topic!r} queue {queue}: the start "
                              f"({s}) is after the end ({e}); check the starting and ending "
                              "options")
        if s < o.earliest:
            _planning.report_data_loss(self.opts, topic, queue, s, min(o.earliest, e),
                                       f"were removed by retention (the queue now starts "
                                       f"at {o.earliest})")
            s = min(o.earliest, e)
        return _archive_hot.plan(self.opts, topic, o, s, e)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)
