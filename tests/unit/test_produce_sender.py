"""The client's ProduceBatches coalescing (rmq_spark.client._produce_sender.ProduceSender).

A stand-in for the gRPC stub records each RPC and lets the test finish it
(with outcomes or an RPC error): what is checked is how the sender groups
calls into RPCs and hands every call its own outcomes or the RPC's error.
The real path is covered against a cluster in tests/test_service.py.
"""
from __future__ import annotations

import threading

import grpc
import pytest

from rmq_spark.client._produce_sender import ProduceSender
from storage_service.proto import rmq_pb2

pytestmark = pytest.mark.unit


class _Call:
    def __init__(self, request):
        self.request, self._callbacks, self._result, self._error = request, [], None, None
        self.done = False

    def add_done_callback(self, cb):
        if self.done:
            cb(self)
        else:
            self._callbacks.append(cb)

    def result(self):
        if self._error is not None:
            raise self._error
        return self._result

    def finish(self, result=None, error=None):
        self._result, self._error, self.done = result, error, True
        for cb in self._callbacks:
            cb(self)


class _Stub:
    def __init__(self):
        self.calls: list[_Call] = []
        self.ProduceBatches = self

    def future(self, request, timeout=None):
        call = _Call(request)
        call.timeout = timeout
        self.calls.append(call)
        return call


class _Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE


def _reqs(*queues):
    return [rmq_pb2.ProduceRequest(topic="t", queue=q, records=b"x" * 10, count=1) for q in queues]


def _answer(call):
    """One successful outcome per batch, carrying the batch's queue."""
    return rmq_pb2.ProduceBatchesResponse(outcomes=[
        rmq_pb2.ProduceOutcome(result=rmq_pb2.ProduceResult(queue=b.queue, count=1))
        for b in call.request.batches])


def test_one_caller_sends_at_once():
    stub = _Stub()
    slot = ProduceSender(stub.future).send(_reqs(0, 1), 5)
    assert [len(c.request.batches) for c in stub.calls] == [2]
    stub.calls[0].finish(_answer(stub.calls[0]))
    assert [o.result.queue for o in slot.result()] == [0, 1]


def test_calls_made_while_rpcs_are_in_flight_go_out_together_and_get_their_own_outcomes():
    stub = _Stub()
    sender = ProduceSender(stub.future, max_in_flight=2)
    slots = [sender.send(_reqs(i, 10 + i), 5) for i in range(5)]
    assert len(stub.calls) == 2                          # the limit: three calls wait
    stub.calls[0].finish(_answer(stub.calls[0]))
    assert len(stub.calls) == 3 and len(stub.calls[2].request.batches) == 6   # the three, in one RPC
    stub.calls[2].finish(_answer(stub.calls[2]))
    stub.calls[1].finish(_answer(stub.calls[1]))
    assert [[o.result.queue for o in s.result()] for s in slots] == [[i, 10 + i] for i in range(5)]


def test_an_rpc_error_is_every_contained_calls_error_and_the_queue_moves_on():
    stub = _Stub()
    sender = ProduceSender(stub.future, max_in_flight=1)
    first = sender.send(_reqs(0), 5)
    waiting = [sender.send(_reqs(q), 5) for q in (1, 2)]
    stub.calls[0].finish(_answer(stub.calls[0]))
    assert first.result()[0].result.queue == 0
    stub.calls[1].finish(error=_Unavailable())
    for s in waiting:
        with pytest.raises(_Unavailable):
            s.result()
    later = sender.send(_reqs(3), 5)                     # nothing left in flight: sent at once
    assert len(stub.calls) == 3
    stub.calls[2].finish(_answer(stub.calls[2]))
    assert later.result()[0].result.queue == 3


class _Denied(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.PERMISSION_DENIED


def test_a_merged_rpc_refused_for_one_call_is_sent_again_call_by_call():
    """A node refuses a ProduceBatches whole when one topic in it may not be written:
    the calls merged with that one are not failed for it (review of 51bd33e)."""
    stub = _Stub()
    sender = ProduceSender(stub.future, max_in_flight=1)
    first = sender.send(_reqs(0), 5)
    allowed, denied = sender.send(_reqs(1), 5), sender.send(_reqs(2), 5)
    stub.calls[0].finish(_answer(stub.calls[0]))
    assert first.result()[0].result.queue == 0 and len(stub.calls[1].request.batches) == 2
    stub.calls[1].finish(error=_Denied())
    assert [[b.queue for b in c.request.batches] for c in stub.calls[2:]] == [[1], [2]]    # one by one
    stub.calls[2].finish(_answer(stub.calls[2]))
    stub.calls[3].finish(error=_Denied())
    assert allowed.result()[0].result.queue == 1
    with pytest.raises(_Denied):
        denied.result()
    later = sender.send(_reqs(3), 5)                     # the in-flight count came back to 0
    assert len(stub.calls) == 5 and [b.queue for b in stub.calls[4].request.batches] == [3]


def test_a_merged_rpc_runs_to_its_latest_deadline_and_a_short_caller_stops_at_its_own():
    """One caller's short timeout must not fail the calls merged with it (review of
    51bd33e): the RPC gets the latest deadline; the short caller stops waiting at its
    own (``outcomes(timeout=)``), DEADLINE_EXCEEDED, while the others get their answer."""
    from rmq_spark.client._outcomes import outcomes
    from rmq_spark.client.errors import RmqError

    stub = _Stub()
    sender = ProduceSender(stub.future, max_in_flight=1)
    first = sender.send(_reqs(0), 5)
    short, long_ = sender.send(_reqs(1), 0.05), sender.send(_reqs(2), 30)
    stub.calls[0].finish(_answer(stub.calls[0]))
    assert first.result()[0].result.queue == 0
    assert len(stub.calls[1].request.batches) == 2 and stub.calls[1].timeout > 20
    [err] = outcomes(short, "n1:1", 1, timeout=0.05)
    assert isinstance(err, RmqError) and err.code == grpc.StatusCode.DEADLINE_EXCEEDED and err.retriable
    stub.calls[1].finish(_answer(stub.calls[1]))
    assert [o.queue for o in outcomes(long_, "n1:1", 1, timeout=1)] == [2]


def test_a_short_answer_fails_the_calls_instead_of_misattributing_outcomes():
    stub = _Stub()
    slot = ProduceSender(stub.future).send(_reqs(0, 1), 5)
    stub.calls[0].finish(rmq_pb2.ProduceBatchesResponse(outcomes=[rmq_pb2.ProduceOutcome()]))
    with pytest.raises(grpc.RpcError) as e:
        slot.result()
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "1 outcomes for 2 batches" in e.value.details()


def test_rpcs_are_capped_in_bytes():
    stub = _Stub()
    sender = ProduceSender(stub.future, max_in_flight=1, max_bytes=50)
    sender.send(_reqs(0), 5)
    for q in (1, 2, 3):
        sender.send(_reqs(q), 5)                         # ~20 bytes each
    stub.calls[0].finish(_answer(stub.calls[0]))
    assert [len(c.request.batches) for c in stub.calls] == [1, 2]
    stub.calls[1].finish(_answer(stub.calls[1]))
    assert [len(c.request.batches) for c in stub.calls] == [1, 2, 1]


def test_many_threads_never_exceed_the_in_flight_limit():
    stub = _Stub()
    sender = ProduceSender(stub.future, max_in_flight=2)
    lock, slots = threading.Lock(), []

    def caller(q):
        s = sender.send(_reqs(q), 5)
        with lock:
            slots.append(s)

    threads = [threading.Thread(target=caller, args=(q,)) for q in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while not all(c.done for c in stub.calls):
        open_calls = [c for c in stub.calls if not c.done]
        assert len(open_calls) <= 2
        open_calls[0].finish(_answer(open_calls[0]))
    assert sum(len(c.request.batches) for c in stub.calls) == 16
    assert sorted(s.result()[0].result.queue for s in slots) == list(range(16))
