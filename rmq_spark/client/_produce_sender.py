"""Concurrent ``produce_batches`` calls to one node share ProduceBatches RPCs."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

import grpc

from storage_service.proto import rmq_pb2

from ._produce_wire import WireCallError

__all__ = ["ProduceSender"]

# A ProduceBatches refused as a whole with one of these may have been refused for one
# of the calls it merged: they are sent again one by one (``ProduceSender._done``).
SPLIT_ON = frozenset({grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT,
                      grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
                      grpc.StatusCode.RESOURCE_EXHAUSTED})


class ProduceSender:
    """Concurrent ``produce_batches`` calls to one node share ProduceBatches RPCs.

    A Python gRPC call costs ~0.5 ms of server CPU and ~0.35 ms of client CPU
    before its first byte (an echo of 1 KiB on the test VM; `bench/README.md`),
    so eight producer threads each sending their own RPC per node paid that
    eight times. Like Kafka's producer, which sends one request per broker with
    what all application threads queued, at most ``max_in_flight`` RPCs per node
    are in flight; calls made meanwhile wait and go out together in the next
    one (up to ``max_bytes``). One thread alone sends at once, as before.
    Every call keeps its own batches and outcomes, and waits for them until its own
    deadline (the RPC runs to the latest of the calls' deadlines); an RPC error
    is every contained call's error (each retries its own batches, idempotently),
    but for a refusal that one call's content may have caused (``SPLIT_ON``):
    then each call is sent again alone and gets its own answer.
    """

    def __init__(self, call: Callable[..., Any], max_in_flight: int = 2, max_bytes: int = 32 << 20):
        self._call = call           # ProduceBatches.future: over the produce port or gRPC
        self.max_in_flight = max_in_flight
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._queue: list[tuple[list, Future, float, int]] = []
        self._in_flight = 0

    def send(self, reqs: list, timeout: float) -> Future:
        """``Future`` of the outcomes of ``reqs``, in order (or the RPC's error)."""
        slot: Future = Future()
        size = sum(r.ByteSize() for r in reqs)
        with self._lock:
            self._queue.append((reqs, slot, time.monotonic() + timeout, size))
            items = self._take() if self._in_flight < self.max_in_flight else None
        if items:
            self._issue(items)
        return slot

    def _take(self) -> list:
        """Queued calls for one RPC (under the lock); counts it in flight."""
        items, total = [], 0
        while self._queue and (not items or total + self._queue[0][3] <= self.max_bytes):
            item = self._queue.pop(0)
            items.append(item)
            total += item[3]
        self._in_flight += 1
        return items

    def _issue(self, items: list) -> None:
        request = rmq_pb2.ProduceBatchesRequest(batches=[r for reqs, _, _, _ in items for r in reqs])
        # The latest deadline: a caller with a shorter one stops waiting at its own
        # (``outcomes(timeout=)``) without failing the others' batches with it.
        left = max(0.01, max(deadline for _, _, deadline, _ in items) - time.monotonic())
        try:
            call = self._call(request, timeout=left)
        except Exception as e:         # never leave a caller waiting
            self._done(items, None, e)
            return
        call.add_done_callback(lambda f: self._done(items, f, None))

    def _done(self, items: list, call, error: BaseException | None) -> None:
        outcomes = None
        if error is None:
            try:
                outcomes = list(call.result().outcomes)
            except grpc.RpcError as e:
                error = e
            except Exception as e:     # cancelled, or anything unexpected
                error = WireCallError(grpc.StatusCode.UNAVAILABLE, f"ProduceBatches failed: {e!r}")
        if len(items) > 1 and isinstance(error, grpc.RpcError) and hasattr(error, "code") \
                and error.code() in SPLIT_ON:
            # Refused as a whole for what one call carried (a topic this principal may
            # not write, a request over a size limit): each call goes again alone, so
            # the others are not failed for it. The failed RPC's slot is the first's.
            with self._lock:
                self._in_flight += len(items) - 1
            for item in items:
                self._issue([item])
            return
        want = sum(len(reqs) for reqs, _, _, _ in items)
        if error is None and len(outcomes) != want:
            error = WireCallError(grpc.StatusCode.UNAVAILABLE,
                                  f"ProduceBatches answered {len(outcomes)} outcomes for {want} batches")
        pos = 0
        for reqs, slot, _, _ in items:
            if error is not None:
                slot.set_exception(error)
            else:
                slot.set_result(outcomes[pos:pos + len(reqs)])
                pos += len(reqs)
        with self._lock:
            self._in_flight -= 1
            nxt = self._take() if self._queue and self._in_flight < self.max_in_flight else None
        if nxt:
            self._issue(nxt)
