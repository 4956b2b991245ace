"""The client's one status table (errors.from_status) and its one retry policy
(_routing: the route cache and the backoff), without a cluster. Calls against a
real cluster (leader changes, nodes down) are in tests/test_service.py."""
from __future__ import annotations

import time

import grpc
import pytest

from rmq_spark.client import (DeadlineExceeded, InternalError, InvalidArgument, NotFound,
                              NotLeader, RmqError, Unavailable)
from rmq_spark.client._produce_wire import WireCallError
from rmq_spark.client._routing import SUSPECT_S, MAX_DELAY, RetryClock, Routes
from rmq_spark.client.errors import from_rpc_error, from_status
from storage_service.protocol.errors import LEADER_METADATA_KEY

pytestmark = pytest.mark.unit
NODES = ["a:1", "b:2", "c:3"]


@pytest.mark.parametrize("code", [grpc.StatusCode.NOT_FOUND, grpc.StatusCode.NOT_FOUND.value[0]])
def test_a_status_code_or_its_number_maps_to_the_same_exception(code):
    err = from_status(code, "topic 't' does not exist", address="a:1")
    assert type(err) is NotFound and str(err) == "topic 't' does not exist [a:1]"
    assert err.code == grpc.StatusCode.NOT_FOUND and not err.retriable


def test_unavailable_with_a_leader_hint_or_saying_so_is_not_leader():
    hinted = from_status(grpc.StatusCode.UNAVAILABLE.value[0], "moved", leader="b:2")
    assert type(hinted) is NotLeader and hinted.leader == "b:2" and hinted.retriable
    said = from_status(grpc.StatusCode.UNAVAILABLE, "not leader of group 3", leader="")
    assert type(said) is NotLeader and said.leader is None
    assert type(from_status(grpc.StatusCode.UNAVAILABLE, "node down")) is Unavailable


def test_unknown_numbers_and_codes_are_still_in_the_tree():
    assert type(from_status(999, "?")) is InternalError        # UNKNOWN
    assert type(from_status(None, "?")) is RmqError


def test_rpc_errors_go_through_the_same_table():
    class Call(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

        def details(self):
            return "not leader"

        def trailing_metadata(self):
            return ((LEADER_METADATA_KEY, "c:3"),)

    err = from_rpc_error(Call(), "a:1")
    assert type(err) is NotLeader and err.leader == "c:3" and str(err) == "not leader [a:1]"
    wire = from_rpc_error(WireCallError(grpc.StatusCode.INVALID_ARGUMENT, "bad block"), "a:1")
    assert type(wire) is InvalidArgument and str(wire) == "bad block [a:1]"


def test_routes_learn_the_leader_from_a_hint_and_try_it_first():
    r = Routes(NODES)
    assert r.learn(7, NotLeader("x", leader="c:3"), "a:1") == "c:3"
    assert r.target(7) == "c:3"
    for _ in range(4):
        order = r.candidates(7)
        assert order[0] == "c:3" and sorted(order) == sorted(NODES)
    assert r.learn(None, NotLeader("x", leader="c:3"), "a:1") is None     # no group: no route


def test_routes_drop_a_route_on_a_failure_of_that_node_only():
    r = Routes(NODES)
    r.learn(1, NotLeader("x", leader="b:2"), "a:1")
    assert r.learn(1, Unavailable("down"), "a:1") is None and r.target(1) == "b:2"
    assert r.learn(1, DeadlineExceeded("slow"), "b:2") is None
    # asking around again, the two nodes that did not answer last
    assert {r.target(1) for _ in range(len(NODES))} == {"c:3"}
    assert r.candidates(1)[1:] in (["a:1", "b:2"], ["b:2", "a:1"])
    r.learn(1, NotLeader("x", leader="b:2"), "a:1")                      # a fresh hint wins
    assert r.target(1) == "b:2"
    r.learn(1, NotLeader("no hint"), "c:3")                              # nobody knows
    assert {r.target(1) for _ in range(len(NODES))} == {"c:3"}


def test_a_node_that_did_not_answer_is_tried_last_for_a_while(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    r = Routes(NODES)
    r.learn(None, Unavailable("connection refused"), "a:1")
    assert all(r.candidates(None)[-1] == "a:1" for _ in range(len(NODES)))
    r.learn(None, NotLeader("no hint"), "b:2")                           # it answered: not suspect
    assert all(r.candidates(None)[-1] == "a:1" for _ in range(len(NODES)))
    now[0] += SUSPECT_S
    assert {r.candidates(None)[-1] for _ in range(len(NODES))} == set(NODES)   # trusted again


def test_candidates_rotate_without_a_route():
    r = Routes(NODES)
    firsts = {r.candidates(None)[0] for _ in range(len(NODES))}
    assert firsts == set(NODES)


def test_retry_clock_sleeps_a_jittered_doubling_backoff_capped_at_one_second(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    clock = RetryClock(60.0)
    for _ in range(9):
        clock.pause(Unavailable("x"))
    delays = [0.02 * 2 ** i for i in range(6)] + [MAX_DELAY] * 3
    assert all(0.5 * d <= s < 1.5 * d for s, d in zip(slept, [min(d, MAX_DELAY) for d in delays]))
    assert clock.delay == MAX_DELAY
    clock.pause(Unavailable("x"), sleep=False)     # a leader hint arrived: straight on
    assert len(slept) == 9


def test_retry_clock_raises_the_last_error_once_the_backoff_would_pass_the_deadline():
    clock = RetryClock(0.05)
    last = Unavailable("last answer")
    t0 = time.monotonic()
    with pytest.raises(Unavailable, match="last answer"):
        while True:
            clock.pause(last)
    assert time.monotonic() - t0 < 0.2 and clock.left(5.0) < 0.05
