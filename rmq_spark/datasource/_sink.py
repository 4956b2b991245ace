"""A write's produce calls: Arrow batches -> idempotent, pipelined produce calls.

Exactly-once: a task writes as producer ``f"{writer_id}-{partition}"`` and
numbers every produce call to a queue with ``(batch_id << 32) + position``,
where position is the index, among this task's rows for that queue, of the
call's first row. The service drops a call whose sequence is not above the
last one it applied for that producer and queue.

That is only safe if a retry cuts its rows into the *same* calls. Rows are
cut by a rule that depends only on the rows (``_Lane.cut``), and a task sends
a call only once the rows after it exist, so every call it sends is complete.
The last, partial call of each queue (the *tail*) is not sent by the task:
when an upstream operator fails, Spark ends the task's input early as if it
were complete, and a tail sent then would be shorter than the retry's call
with the same sequence, which the service would then drop (rows lost). Tails
travel in the commit message instead and the driver sends them once Spark
has accepted the task (``send_tails``).

A task sends through one pipelined producer (``Client.producer``,
``send_block`` with the task's identity): up to ``MAX_IN_FLIGHT`` requests
per node, and a queue's calls pipelined in sequence order (the node refuses
one whose predecessor is not stored, so none is stored out of order; a
call that starts the task's run on a queue goes alone). At most
``MAX_PENDING`` calls wait for their answers at once (memory).
"""
from __future__ import annotations

import logging
import time
import zlib
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.client import Client, NotFound, TlsFiles

from ._encode import encode_block, row_sizes
from ._writer_plan import SinkPlan
from .errors import SinkError

__all__ = ["Tail", "TaskResult", "write_task", "send_tails"]

log = logging.getLogger(__name__)
CHUNK_BYTES = 1 << 20        # per call; also bounds a tail (the service accepts 16 MiB)
CHUNK_ROWS = 10_000          # per call (the service accepts 100,000 messages)
MAX_IN_FLIGHT = 4            # requests per node (the producer's max_in_flight)
MAX_PENDING = 16             # calls sent and not yet answered, per task


@dataclass
class Tail:
    """The last, partial call of one queue of one task; the driver sends it."""
    topic: str
    queue: int
    sequence: int
    rows: pa.RecordBatch         # normalized (``_encode.NORMALIZED``)


@dataclass
class TaskResult:
    rows: int = 0                # rows sent by the task itself (tails not included)
    calls: int = 0
    duplicate_rows: int = 0      # rows the service had already applied (a retry or replay)
    tails: list[Tail] = field(default_factory=list)


def _send(producer, topic: str, queue: int, batch: pa.RecordBatch, producer_id: str, sequence: int) -> Future:
    """One produce call of a pre-encoded block; the future's result says if it was a duplicate."""
    return producer.send_block(topic, queue, encode_block(batch), batch.num_rows, producer_id=producer_id,
                               sequence=sequence)


class _Lane:
    """Rows bound for one (topic, queue) in this task, and its in-flight call."""

    def __init__(self, topic: str, queue: int):
        self.topic, self.queue = topic, queue
        self.pieces: list[pa.RecordBatch] = []
        self.rows = self.bytes = 0
        self.position = 0                 # rows of this lane already cut into calls

    def add(self, batch: pa.RecordBatch, sizes: np.ndarray) -> None:
        self.pieces.append(batch)
        self.rows += batch.num_rows
        self.bytes += int(sizes.sum())

    def full(self) -> bool:
        return self.rows > CHUNK_ROWS or self.bytes > CHUNK_BYTES

    def cut(self, final: bool) -> list[tuple[int, pa.RecordBatch]]:
        """(position, rows) of each complete call; with ``final``, the rest too."""
        if not self.rows:
            return []
        whole = pa.Table.from_batches(self.pieces).combine_chunks().to_batches()[0]
        cum = np.cumsum(row_sizes(whole))
        out, i = [], 0
        while i < whole.num_rows:
            base = cum[i - 1] if i else 0
            j = int(np.searchsorted(cum, base + CHUNK_BYTES, side="right"))
            j = max(i + 1, min(j, i + CHUNK_ROWS))
            if j >= whole.num_rows and not final:
                break                     # the call is not complete yet: more rows may come
            out.append((self.position, whole.slice(i, j - i)))
            self.position += j - i
            i = j
        rest = whole.slice(i)
        self.pieces = [rest] if rest.num_rows else []
        self.rows = rest.num_rows
        self.bytes = int(cum[-1] - (cum[i - 1] if i else 0)) if rest.num_rows else 0
        return out


class _TaskWriter:
    def __init__(self, plan: SinkPlan, client: Client, producer_id: str, batch_id: int,
                 partition: int):
        self.plan, self.client = plan, client
        self.producer_id, self.batch_id, self.partition = producer_id, batch_id, partition
        self.lanes: dict[tuple[str, int], _Lane] = {}
        self.queue_counts: dict[str, int] = {}
        self._topic_names: list[str] = []
        self.row_index = 0
        self.result = TaskResult()
        self.producer = client.producer(max_in_flight=MAX_IN_FLIGHT)
        self.in_flight: list[tuple[int, Future]] = []

    def queues_of(self, topic: str) -> int:
        if topic not in self.queue_counts:
            try:
                self.queue_counts[topic] = int(self.client.describe_topic(topic)["queues"])
            except NotFound as e:
                raise SinkError(f"topic {topic!r} does not exist; create it first "
                                f"(rmq topic create {topic})") from e
        return self.queue_counts[topic]

    def add(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        norm = self.plan.normalized(batch, int(time.time() * 1000))
        topics, queues = self._route(batch, norm)
        order = np.lexsort((queues, topics))
        bounds = np.flatnonzero(np.diff(topics[order]) | np.diff(queues[order])) + 1
        names = self._topic_names
        for idx in np.split(order, bounds):
            lane = self._lane(names[topics[idx[0]]], int(queues[idx[0]]))
            part = norm.take(pa.array(idx))
            lane.add(part, row_sizes(part))
            if lane.full():
                self._submit(lane, lane.cut(final=False))
        self.row_index += batch.num_rows

    def _lane(self, topic: str, queue: int) -> _Lane:
        key = (topic, queue)
        if key not in self.lanes:
            self.lanes[key] = _Lane(topic, queue)
        return self.lanes[key]

    def _route(self, batch: pa.RecordBatch, norm: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
        """Per row: topic index (into ``self._topic_names``) and queue."""
        n = batch.num_rows
        topic_col = self.plan.topic_column(batch)
        if topic_col is None:
            self._topic_names = [self.plan.topic]
            topics = np.zeros(n, np.int64)
        else:
            if topic_col.null_count:
                row = self.row_index + int(pc.index(topic_col.is_null(), True).as_py())
                raise SinkError(f"row {row} of partition {self.partition} has a null topic; "
                                "set the topic column or the 'topic' option")
            enc = pc.dictionary_encode(topic_col)
            self._topic_names = enc.dictionary.to_pylist()
            topics = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        counts = np.array([self.queues_of(t) for t in self._topic_names], np.int64)[topics]
        queues = self._queues(batch, norm, counts)
        return topics, queues

    def _queues(self, batch: pa.RecordBatch, norm: pa.RecordBatch,
                counts: np.ndarray) -> np.ndarray:
        n = batch.num_rows
        explicit = self.plan.queue_column(batch)
        queues = np.full(n, -1, np.int64)
        if explicit is not None:
            filled = pc.fill_null(explicit.cast(pa.int64()), -1)
            queues = filled.to_numpy(zero_copy_only=False).copy()
            bad = np.flatnonzero((queues < -1) | (queues >= counts))
            if len(bad):
                i = int(bad[0])
                raise SinkError(f"row {self.row_index + i} of partition {self.partition}: "
                                f"queue {int(queues[i])} does not exist (the topic has "
                                f"{int(counts[i])} queues, 0..{int(counts[i]) - 1})")
        need = queues < 0
        key = norm.column(1)
        keyed = need & key.is_valid().to_numpy(zero_copy_only=False)
        if keyed.any():                   # the service's rule: crc32(key) % queues
            idx = np.flatnonzero(keyed)
            hashes = [zlib.crc32(k) for k in key.take(pa.array(idx)).to_pylist()]
            queues[idx] = np.array(hashes, np.int64) % counts[idx]
        spread = need & ~keyed
        rows = self.row_index + self.partition + np.arange(n)
        queues[spread] = (rows % counts)[spread]
        return queues

    def _submit(self, lane: _Lane, calls: list[tuple[int, pa.RecordBatch]]) -> None:
        for position, rows in calls:
            for _, f in self.in_flight:          # a call failed: stop now (Spark retries the task)
                if f.done() and f.exception() is not None:
                    raise f.exception()
            while len(self.in_flight) >= MAX_PENDING:
                self._wait_first()
            seq = (self.batch_id << 32) + position
            self.in_flight.append((rows.num_rows, _send(self.producer, lane.topic, lane.queue, rows,
                                                        self.producer_id, seq)))

    def _wait_first(self) -> None:
        n, fut = self.in_flight.pop(0)
        dup = fut.result().duplicate      # a failed call fails the task: Spark retries it
        r = self.result
        r.rows += n
        r.calls += 1
        r.duplicate_rows += n if dup else 0

    def finish(self) -> TaskResult:
        """Wait for the calls in flight; hand the tails over for the driver."""
        while self.in_flight:
            self._wait_first()
        for lane in self.lanes.values():
            for position, rows in lane.cut(final=True):
                seq = (self.batch_id << 32) + position
                self.result.tails.append(Tail(lane.topic, lane.queue, seq, rows))
        return self.result

    def close(self) -> None:
        self.producer.close()             # (waits for calls still in flight after a failure)


def send_tails(endpoints: str, work: list[tuple[str, Tail]],
               tls: TlsFiles | None = None, token: str | None = None) -> tuple[int, int]:
    """Driver: send (producer id, tail) calls; returns (rows, duplicate rows)."""
    if not work:
        return 0, 0
    client = Client(endpoints, tls=tls, token=token)
    try:
        # each (producer, topic, queue) has one tail, so all of them may be in flight at once
        with client.producer(max_in_flight=MAX_IN_FLIGHT) as producer:
            futs = [(t.rows.num_rows, _send(producer, t.topic, t.queue, t.rows, pid, t.sequence))
                    for pid, t in work]
            dups = sum(n for n, f in futs if f.result().duplicate)
        return sum(n for n, _ in futs), dups
    finally:
        client.close()


def write_task(plan: SinkPlan, batches: Iterator[pa.RecordBatch], producer_id: str,
               batch_id: int, partition: int) -> TaskResult:
    """Write one task's rows exactly once; returns what was written."""
    client = Client(plan.endpoints, tls=plan.tls, token=plan.token)
    writer = _TaskWriter(plan, client, producer_id, batch_id, partition)
    try:
        for batch in batches:
            writer.add(batch)
        return writer.finish()
    finally:
        writer.close()
        client.close()
