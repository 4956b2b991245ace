"""``spark.readStream.format("rocketmq")``: micro-batches over offset ranges.

Offsets are ``{"topic": {"queue": next_offset}}``. Spark keeps one instance
of this reader alive on the driver for the whole query run (its planner
process), so the client, the ``Trigger.AvailableNow`` target and the time of
the last batch (for ``maxTriggerDelay``) live on the instance. Executors get
a pickled copy, built before any of that state exists, and only call
``read``.
"""
from __future__ import annotations

import logging
import time
from typing import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.datasource_internal import _SimpleStreamReaderWrapper
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              ReadMinRows, SupportsTriggerAvailableNow)

from rmq_spark.client import Client

from . import _archive_hot, _offsets, _planning
from ._handover import read_small_batch
from ._options import ReadOptions
from ._planning import QueueRange
from ._read import read_partition

__all__ = ["StreamReader", "HandingOver"]

log = logging.getLogger(__name__)
Key = tuple[str, int]


def _flat(positions: _offsets.Positions) -> dict[Key, int]:
    return {(t, q): o for t, qs in positions.items() for q, o in qs.items()}


def _nest(flat: dict[Key, int]) -> _offsets.Positions:
    out: _offsets.Positions = {}
    for (t, q), o in flat.items():
        out.setdefault(t, {})[q] = o
    return out


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self._client: Client | None = None
        self._target: dict[Key, int] | None = None     # Trigger.AvailableNow: read up to here
        self._last_batch: float | None = None          # monotonic time of the last admitted batch
        self._latest: _offsets.Positions | None = None  # for reportLatestOffset
        self._committed: _offsets.Positions | None = None  # last consumer-group commit
        self._initial: dict | None = None                  # initialOffset, once resolved
        # The end latestOffset last returned and the queue state it saw: Spark plans
        # that batch next, and partitions() need not ask the service again.
        self._planned: tuple[_offsets.Positions, _planning.State] | None = None
        # A small batch partitions() read itself, for getCache (``_handover.py``).
        self._handover: tuple[tuple[dict, dict], list[pa.RecordBatch]] | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_client": None}

    def _c(self) -> Client:
        if self._client is None:
            self._client = Client(self.opts.endpoints, tls=self.opts.tls, token=self.opts.token)
        return self._client

    def _state(self) -> _planning.State:
        return _planning.subscribed_state(self._c(), self.opts)

    # ----------------------------------------------------------- offsets
    def initialOffset(self) -> dict:
        # Spark asks more than once as a new query starts, and plans batch 0 from
        # the last answer with an end chosen after an earlier one: resolved again,
        # "latest" could pass that end (a spurious data-loss error). One answer.
        if self._initial is None:
            start = _planning.resolve(self._c(), self.opts.starting, self._state(), "latest")
            self._initial = _offsets.to_spark(start)
        return self._initial

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {k: o.latest for k, o in self._flat_state(self._state()).items()}
        log.info("Trigger.AvailableNow: reading up to %s", _offsets.dumps(_nest(self._target)))

    @staticmethod
    def _flat_state(state: _planning.State) -> dict:
        return {(t, q): o for t, qs in state.items() for q, o in qs.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self.__class__ = StreamReader       # (reportLatestOffset follows: be ourselves)
        # Spark asks for the next batch only once the previous one is done, so
        # ``start`` is processed; committing it here (and not only in commit(),
        # which Spark calls late, when the next batch starts) keeps lag current.
        self._commit_group(_offsets.from_spark(start))
        begin = _flat(_offsets.from_spark(start))
        views = self._state()
        state = self._flat_state(views)
        self._latest = _nest({k: o.latest for k, o in state.items()})
        first, avail = self._available(begin, state)
        if not self._admit(first, avail, limit):
            return _offsets.to_spark(_nest(begin))
        if isinstance(limit, ReadMaxRows):
            end = _planning.cap_by_backlog(first, avail, limit.max_rows)
        else:
            end = avail
        if end != begin:
            self._last_batch = time.monotonic()
        self._planned = (_nest(end), views)
        return _offsets.to_spark(_nest(end))

    def _available(self, begin: dict[Key, int], state: dict) -> tuple[dict, dict]:
        """Per queue: where reading resumes, and how far it may go now."""
        first, avail = {}, {}
        for k, o in state.items():
            s = begin.get(k)
            if s is None or s > o.latest:
                s = o.earliest            # a new queue, or one re-created behind our back
            if self._target is not None:
                if k not in self._target:
                    continue              # appeared after AvailableNow started: not this run
                avail[k] = max(s, min(o.latest, self._target[k]))
            else:
                avail[k] = o.latest
            first[k] = s
        for k in begin.keys() - state.keys():
            log.warning("topic %r queue %d no longer exists; it is no longer read", *k)
        return first, avail

    def _admit(self, first: dict, avail: dict, limit: ReadLimit) -> bool:
        """minOffsetsPerTrigger / maxTriggerDelay: is there enough for a batch now?"""
        if isinstance(limit, ReadAllAvailable) or self._target is not None:
            return True
        minimum = (limit.min_rows if isinstance(limit, ReadMinRows)
                   else self.opts.min_offsets_per_trigger)
        if not minimum:
            return True
        backlog = sum(max(0, avail[k] - first[k]) for k in avail)
        if backlog >= minimum:
            return True
        now = time.monotonic()
        if self._last_batch is None:
            self._last_batch = now
        return backlog > 0 and (now - self._last_batch) * 1000 >= self.opts.max_trigger_delay_ms

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest is None else _offsets.to_spark(self._latest)

    # ---------------------------------------------------------- planning
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        self.__class__ = StreamReader
        s_pos, e_pos = _offsets.from_spark(start), _offsets.from_spark(end)
        state = self._state_for(e_pos)
        archived, hot = [], []
        for t in sorted(e_pos):
            for q in sorted(e_pos[t]):
                o, e = state[t].get(q), e_pos[t][q]
                s = self._checked_start(t, q, s_pos.get(t, {}).get(q), e, o)
                if o is None:
                    hot.append(QueueRange(t, q, s, e))
                    continue
                a, h = _archive_hot.plan(self.opts, t, o, s, e)
                archived += a
                hot += [h] if h is not None else []
        parts = archived + _planning.plan_hot(hot, self.opts.min_partitions, self.opts.pack_records)
        batches = read_small_batch(self._c(), self.opts, parts)
        if batches is not None:
            self._handover = ((start, end), batches)
            self.__class__ = HandingOver
        return parts

    def getCache(self, start: dict, end: dict) -> Iterator[pa.RecordBatch] | None:
        """The batch partitions() just read for [start, end), once (Spark's planner asks)."""
        handover, self._handover = self._handover, None
        if handover is None or handover[0] != (start, end):
            return None
        return iter(handover[1])

    def _state_for(self, end: _offsets.Positions) -> _planning.State:
        """The queue state latestOffset saw when it chose ``end`` (the usual case),
        or fresh from the service (a batch replayed from the offset log on restart)."""
        if self._planned is not None and self._planned[0] == end:
            return self._planned[1]
        return _planning.queue_state(self._c(), sorted(end), self.opts.read_archive)

    def _checked_start(self, topic: str, queue: int, s: int | None, e: int, o) -> int:
        """Where the range really starts, after data-loss checks."""
        earliest = o.earliest if o is not None else e
        if s is None:
            return min(earliest, e)      # a queue new in this batch: from its earliest
        if s > e:
            _planning.report_data_loss(
                self.opts, topic, queue, s, None,
                f"are gone: the queue went back to {e} (was the topic deleted and created "
                f"again?); reading it again from its earliest offset {earliest}")
            return min(earliest, e)
        if s < earliest:
            _planning.report_data_loss(self.opts, topic, queue, s, min(earliest, e),
                                       f"were removed by retention before they were read "
                                       f"(the queue now starts at {earliest})")
            return min(earliest, e)
        return s

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)

    # ------------------------------------------------------------ commit
    def commit(self, end: dict) -> None:
        self.__class__ = StreamReader
        self._commit_group(_offsets.from_spark(end))

    def _commit_group(self, positions: _offsets.Positions) -> None:
        """consumerGroup: record processed offsets in the service (``rmq offsets`` shows lag)."""
        if not self.opts.consumer_group or not positions or positions == self._committed:
            return
        for topic, queues in positions.items():
            self._c().commit_offsets(self.opts.consumer_group, topic, queues)
        self._committed = positions

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class HandingOver(StreamReader, _SimpleStreamReaderWrapper):
    """A ``StreamReader`` that Spark's planner takes for a simple reader's wrapper,
    so it sends what ``getCache`` returns to the JVM (``_handover.py``)."""

    @property
    def simple_reader(self) -> StreamReader:
        return self
