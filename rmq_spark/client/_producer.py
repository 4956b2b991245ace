"""A producer that keeps several requests in flight per node (``Client.producer``).

``Client.produce_batches`` waits for each call: one thread keeps one request
in flight, and a call touching several groups waits for the slowest commit.
Kafka's producer keeps up to 5 requests in flight per broker and still stores
each partition's batches once and in order (idempotence with sequence
checks). ``Producer`` does the same with our parts:

* every batch carries the producer's id, its queue's next sequence and
  ``in_order``: the node refuses (OUT_OF_ORDER, retriable) a batch whose
  predecessor was not stored, so no batch is stored before an earlier one;
* a node's requests go over one produce-port connection, which the node
  submits in the order sent (``produce_port._Answers``), so batches of one
  queue enter the raft log in order and the refusal is rare;
* a queue's first batch (the node does not know the producer there yet) and
  every retry go alone, one at a time, until one is acknowledged; then the
  queue pipelines again. Retries are idempotent (same id and sequence);
* a batch that fails for good (a non-retriable error, or its ``timeout``
  passed) fails the queue's later batches too, and the queue starts over
  under a new producer id: nothing behind a lost batch is stored out of order.

``send_block`` takes the identity from the caller instead (the Spark sink
numbers its own calls so that a retried task sends the same ones): a batch
whose sequence does not follow its lane's last one starts a new run and goes
alone (not ``in_order``), and a batch that fails for good fails the lane's
later batches, and every one sent for that identity afterwards, without a new
id (the caller's retry resends them all).

One thread (``producer-<id>``) sends, retries and completes the futures;
``send`` only queues. Futures' callbacks run on that thread.
"""
from __future__ import annotations

import collections
import logging
import random
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field

import grpc

from storage_service.proto import rmq_pb2

from ._messages import plain_block
from ._outcomes import outcomes
from .errors import InvalidArgument, NotLeader, OutOfOrderSequence, ResourceExhausted, RmqError

__all__ = ["Producer"]

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16 << 20     # one request to a node carries at most this (and one batch more)
# ... and at most this many batches. A node answers a request once all its batches are
# committed; 10,000 small batches to fresh queues took longer than an attempt (5 s),
# and each retry sent all of them again (issue 39.5). Kafka bounds a request the same
# way (max.request.size, a batch per partition).
MAX_REQUEST_BATCHES = 512
# A node remembers a producer's last 8 batches per queue (statemachine/data.py): a retried batch
# must be among them to be answered with its offsets, so a queue has at most 7 in flight.
LANE_IN_FLIGHT = 7
FIRST_DELAY, MAX_DELAY = 0.01, 1.0


@dataclass(eq=False)
class _Batch:
    lane: "_Lane | None"
    request: rmq_pb2.ProduceRequest
    future: Future
    deadline: float
    retry_at: float = 0.0
    attempts: int = 0
    in_flight: bool = False
    group: int = 0
    doomed: BaseException | None = None   # an earlier batch failed for good: this error unless stored
    alone: bool = False            # starts a run of the caller's sequences: sent when nothing is before it


@dataclass(eq=False)
class _Lane:
    """One queue's batches not yet done, in sequence order."""
    topic: str
    queue: int
    group: int
    producer_id: str
    next_sequence: int = 0
    explicit: bool = False         # the caller's identity (``send_block``): never renamed
    failed: BaseException | None = None   # explicit: a batch failed for good; later ones fail at once
    failed_at: int = -1
    known: bool = False            # a batch of this producer id was stored: pipelining is safe
    serial: bool = False           # retrying: one batch at a time until one is acknowledged
    batches: collections.deque = field(default_factory=collections.deque)
    in_flight: int = 0
    # batches it may have in flight: halved when a node says it is at a limit, one more per
    # batch stored, at most LANE_IN_FLIGHT (a burst into a full commit backlog is refused, and
    # the batches behind the refused one then come back out of order)
    window: int = LANE_IN_FLIGHT


class Producer:
    """``send`` batches to queues with up to ``max_in_flight`` requests in flight per
    node; each batch's ``Future`` gets its ``ProduceResult`` (module doc)."""

    def __init__(self, client, max_in_flight: int = 5, timeout: float | None = None):
        if max_in_flight < 1:
            raise InvalidArgument(f"max_in_flight={max_in_flight}: give 1 or more")
        self._client = client
        self.max_in_flight = max_in_flight
        self.timeout = timeout or client.timeout
        self._id = f"{client._client_id}-p{uuid.uuid4().hex[:10]}"
        self._lanes: dict[tuple, _Lane] = {}      # (topic, queue[, the caller's producer id])
        self._node_in_flight: collections.Counter = collections.Counter()
        self._cond = threading.Condition()
        self._new: list[_Batch] = []
        self._done: list[tuple[list[_Batch], str, object]] = []
        self._unfinished = 0
        self.peak_in_flight = 0        # the most requests one node had in flight at once
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"producer-{self._id}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ API
    def send(self, topic: str, queue: int, messages) -> Future:
        """Queue one batch for ``queue``; the future gets its ``ProduceResult`` (or the error)."""
        messages = list(messages)
        if not messages:
            raise InvalidArgument(f"batch for {topic}/{queue} is empty: give at least one message")
        return self._queue(rmq_pb2.ProduceRequest(topic=topic, queue=queue, records=plain_block(messages),
                                                  count=len(messages), in_order=True))

    def send_block(self, topic: str, queue: int, block: bytes, count: int, *, producer_id: str,
                   sequence: int) -> Future:
        """Queue an encoded records block of ``count`` messages as producer ``producer_id``
        at ``sequence`` (the caller numbers its batches, as ``Client.produce_block``):
        stored once however often it is sent with that identity; batches of one
        (queue, producer id) whose sequences follow each other are pipelined in order."""
        if count < 1:
            raise InvalidArgument(f"batch for {topic}/{queue} has count={count}: give 1 or more")
        if not producer_id or sequence < 0:
            raise InvalidArgument(f"batch for {topic}/{queue}: give a producer id and a sequence >= 0 "
                                  f"(got {producer_id!r}, {sequence})")
        return self._queue(rmq_pb2.ProduceRequest(topic=topic, queue=queue, records=block, count=count,
                                                  producer_id=producer_id, sequence=sequence, in_order=True))

    def _queue(self, req: rmq_pb2.ProduceRequest) -> Future:
        b = _Batch(None, req, Future(), time.monotonic() + self.timeout)
        b.future.set_running_or_notify_cancel()     # a queued batch cannot be taken back
        b.group = self._client.group_of(req.topic, req.queue)
        with self._cond:
            if self._closed:
                raise RmqError("producer closed")
            self._new.append(b)
            self._unfinished += 1
            self._cond.notify_all()     # (flush waits on it too: a notify() could wake only that)
        return b.future

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every batch sent so far is done (stored or failed)."""
        if threading.current_thread() is self._thread:
            raise RmqError("flush() or close() from a future's callback (the producer's thread) would "
                           "wait for itself: call it from another thread")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._unfinished:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{self._unfinished} batches still in flight after {timeout} s")
                self._cond.wait(left)

    def close(self) -> None:
        """``flush``, then stop the producer's thread."""
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ the thread
    def _lane_id(self) -> str:
        return f"{self._id}-{uuid.uuid4().hex[:8]}"

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:      # noqa: BLE001 - every batch gets an answer, flush() returns
            dead = RmqError(f"the producer's thread failed ({e!r}); batches not answered before fail")
            with self._cond:
                self._closed = True
                waiting, self._new = list(self._new), []
            for b in waiting + [b for lane in self._lanes.values() for b in lane.batches]:
                if not b.future.done():
                    self._resolve(b, dead)
            log.exception("producer %s: its thread failed", self._id)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._new or self._done or self._closed) and not self._retry_due():
                    self._cond.wait(self._next_wait())
                if self._closed and not self._unfinished:
                    return
                new, self._new = self._new, []
                done, self._done = self._done, []
            for b in new:                   # lanes are this thread's alone
                self._enter(b)
            for batches, address, outcome in done:
                self._complete(batches, address, outcome)
            self._dispatch()

    def _enter(self, b: _Batch) -> None:
        """Put a new batch at the end of its lane, with its identity."""
        r = b.request
        explicit = bool(r.producer_id)
        key = (r.topic, r.queue, r.producer_id) if explicit else (r.topic, r.queue)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(r.topic, r.queue, b.group, r.producer_id or self._lane_id(),
                                            next_sequence=-1 if explicit else 0, explicit=explicit)
        b.lane = lane
        if lane.failed is not None:
            # A batch of this identity failed for good: one sent after it would be stored
            # past the gap, and the caller's retry (same ids and sequences) would then
            # take the missing one for a duplicate. The caller starts over instead.
            self._resolve(b, RmqError(f"{r.topic}/{r.queue}: producer {r.producer_id} had a batch fail for "
                                      f"good (sequence {lane.failed_at}); later batches of it are refused: "
                                      f"{lane.failed}"))
            return
        if not explicit:
            r.producer_id, r.sequence = lane.producer_id, lane.next_sequence
        elif r.sequence != lane.next_sequence:
            b.alone = True               # not after the lane's last batch: the node may know none of it
            r.in_order = False
        lane.next_sequence = r.sequence + r.count
        lane.batches.append(b)

    def _retry_due(self) -> bool:
        """A batch waiting for its retry time can be sent now (its lane and node allow it)."""
        now = time.monotonic()
        return any(b.attempts and self._node_in_flight[self._client._routes.target(lane.group)] < self.max_in_flight
                   for lane in self._lanes.values() for b in self._sendable(lane, now))

    def _next_wait(self) -> float:
        """Until the earliest retry a lane would send (the head of a lane sending one at a time)."""
        waits = [lane.batches[0].retry_at for lane in self._lanes.values()
                 if lane.batches and lane.in_flight == 0 and lane.batches[0].attempts]
        return min(0.5, max(0.001, min(waits) - time.monotonic())) if waits else 0.5

    def _sendable(self, lane: _Lane, now: float) -> list[_Batch]:
        """The lane's batches to send now, in order."""
        if not lane.batches:
            return []
        first = lane.batches[0]
        if not lane.known or lane.serial or first.alone:
            return [first] if lane.in_flight == 0 and not first.in_flight and first.retry_at <= now else []
        room = lane.window - lane.in_flight
        out = []
        for b in lane.batches:          # (waiting ones follow those in flight)
            if b.alone:
                break                    # a new run waits for everything before it
            if not b.in_flight:
                out.append(b)
        return out[:max(0, room)]

    def _dispatch(self) -> None:
        now = time.monotonic()
        by_node: dict[str, list[_Batch]] = {}
        for lane in self._lanes.values():
            for b in self._sendable(lane, now):
                if now > b.deadline:
                    self._fail_lane(lane, b, _timed_out(b, self.timeout))
                    break
                by_node.setdefault(self._client._routes.target(lane.group), []).append(b)
        for address, batches in by_node.items():
            while batches and self._node_in_flight[address] < self.max_in_flight:
                take, size = [], 0
                while batches and (not take or (size + batches[0].request.ByteSize() <= MAX_REQUEST_BYTES
                                                and len(take) < MAX_REQUEST_BATCHES)):
                    b = batches.pop(0)
                    take.append(b)
                    size += b.request.ByteSize()
                self._send(address, take)

    def _send(self, address: str, batches: list[_Batch]) -> None:
        for b in batches:
            b.in_flight = True
            b.lane.in_flight += 1
        self._node_in_flight[address] += 1
        self.peak_in_flight = max(self.peak_in_flight, self._node_in_flight[address])
        request = rmq_pb2.ProduceBatchesRequest(batches=[b.request for b in batches])
        # A whole attempt, even for a batch near its deadline: a request that expires takes the
        # node's ordered connection (and the other requests in flight on it) down with it.
        left = self._client.attempt_timeout
        client = self._client
        try:
            if client.produce_port:
                call = client._transport(address).future(request, left, ordered=True)
            else:
                call = client._stub(address).ProduceBatches.future(request, timeout=left,
                                                                   metadata=client._metadata)
        except Exception as e:             # never leave a batch unanswered
            self._finished(batches, address, e)
            return
        call.add_done_callback(lambda f: self._finished(batches, address, f))

    def _finished(self, batches: list[_Batch], address: str, outcome) -> None:
        """A request's answer (any thread): handed to the producer's thread."""
        with self._cond:
            self._done.append((batches, address, outcome))
            self._cond.notify_all()     # (flush waits on it too: a notify() could wake only that)

    def _complete(self, batches: list[_Batch], address: str, outcome) -> None:
        self._node_in_flight[address] -= 1
        for b, res in zip(batches, outcomes(outcome, address, len(batches))):
            lane = b.lane
            b.in_flight = False
            lane.in_flight -= 1
            current = b.request.producer_id == lane.producer_id
            if b.doomed is not None:           # an earlier batch of its lane failed for good
                lane.batches.remove(b)
                self._resolve(b, res if not isinstance(res, RmqError) else b.doomed)
                continue
            if not isinstance(res, RmqError):
                lane.batches.remove(b)
                b.alone = False
                if current:                    # (a batch of an id the lane left says nothing of the new one)
                    lane.known = True
                    lane.window = min(LANE_IN_FLIGHT, lane.window + 1)
                    if lane.serial and lane.in_flight == 0:
                        lane.serial = False
                self._resolve(b, res)
                continue
            if not isinstance(res, (ResourceExhausted, OutOfOrderSequence)):
                self._client._routes.learn(lane.group, res, address)     # (those come from the leader)
            if not res.retriable or time.monotonic() > b.deadline:
                self._fail_lane(lane, b, res if not res.retriable else _timed_out(b, self.timeout, res))
                continue
            b.attempts += 1
            lane.serial = True                 # from here one at a time, in order, until one is stored
            if isinstance(res, ResourceExhausted):
                lane.window = max(1, lane.window // 2)
            hinted = isinstance(res, NotLeader) and res.leader
            delay = 0.0 if hinted or isinstance(res, OutOfOrderSequence) else \
                min(MAX_DELAY, FIRST_DELAY * 2 ** min(b.attempts, 8)) * (0.5 + random.random())
            b.retry_at = time.monotonic() + max(delay, 0 if hinted else getattr(res, "retry_after_ms", 0) / 1000)

    def _fail_lane(self, lane: _Lane, first: _Batch, error: BaseException) -> None:
        """``first`` failed for good: it and every later batch of the lane fail, and the
        lane starts over under a new producer id (its first batch goes alone; the
        caller's own id stays, and its next batch goes alone). A later batch still in
        flight keeps its own answer: stored if the node says so."""
        batches = list(lane.batches)
        doomed = batches[batches.index(first):] if first in batches else [first]
        for b in doomed:
            if b.future.done():
                continue
            why = error if b is first else RmqError(
                f"{lane.topic}/{lane.queue}: an earlier batch (sequence {first.request.sequence}) failed, so "
                f"this one was {'perhaps stored (sent before, answer lost)' if b.attempts else 'not stored'}: "
                f"{error}")
            if b.in_flight:
                b.doomed = why
            else:
                self._resolve(b, why)
        lane.batches = collections.deque(b for b in lane.batches if b not in doomed or b.in_flight)
        if lane.explicit:
            lane.failed, lane.failed_at = error, first.request.sequence
        else:
            lane.producer_id, lane.next_sequence, lane.known, lane.serial = self._lane_id(), 0, False, False

    def _resolve(self, b: _Batch, result) -> None:
        if isinstance(result, BaseException):
            b.future.set_exception(result)
        else:
            b.future.set_result(result)
        with self._cond:
            self._unfinished -= 1
            if not self._unfinished:
                self._cond.notify_all()


def _timed_out(b: _Batch, timeout: float, last: BaseException | None = None) -> RmqError:
    from .errors import DeadlineExceeded
    stored = "perhaps stored: an attempt's answer was lost" if b.attempts or last is not None else "not stored"
    return DeadlineExceeded(f"{b.lane.topic}/{b.lane.queue}: batch at sequence {b.request.sequence} not "
                            f"acknowledged within {timeout} s ({stored})" + (f"; last error: {last}" if last else ""),
                            grpc.StatusCode.DEADLINE_EXCEEDED)
