"""The produce port (storage_service.server.produce_port): ProduceBatches over plain TCP
frames, against a real 3-node cluster, and the client's transport for it."""
from __future__ import annotations

import socket
import struct
import threading
import time

import grpc
import pytest

from rmq_spark.client import Client
from rmq_spark.client._produce_wire import ProduceTransport, WireCallError, _Connection
from rmq_spark.client.errors import InvalidArgument, NotFound
from storage_service.protocol.produce_frames import (FRAME, HELLO, MAX_FRAME, METHOD_PRODUCE_BATCHES,
                                                     WireProtocolError, hello)
from storage_service.server.produce_port import ProduceWireServer, recv_exact
from storage_service.proto import rmq_pb2
from storage_service.app import _produce_server

from .conftest import wait_until
from .wire import Recorder, batch, call, closed, connect, leader_of, port_of, unused_port

pytestmark = pytest.mark.integration


class _NoServicer:
    """A servicer whose produce methods are never called (the port is not served)."""
    def produce_batches(self, request):
        raise AssertionError("not served")
    submit_batches = finish_batches = produce_batches



# ------------------------------------------------------------- the client path
def test_produce_batches_goes_over_the_produce_port(cluster, client, topic):
    res = client.produce_batches([(topic, q, [f"v{q}".encode()]) for q in range(4)])
    assert [(r.queue, r.base_offset, r.count) for r in res] == [(q, 0, 1) for q in range(4)]
    conns = [c for t in client._transports.values() for c in t._conns["produce"] if not c.closed]
    assert conns, "no produce-port connection was opened"
    for q in range(4):
        assert [r.value for r in client.fetch(topic, q, 0).records] == [f"v{q}".encode()]


def test_both_transports_store_the_same_batches(cluster, topic):
    """The same calls over the produce port and over gRPC give the same offsets
    and records; gRPC-only clients open no produce connection."""
    got = {}
    for wire in (True, False):
        with Client(cluster.endpoints, timeout=30, produce_port=wire) as c:
            got[wire] = [(r.queue, r.base_offset, r.count) for r in c.produce_batches(
                [(topic, q, [f"{wire}-{q}-{i}".encode() for i in range(5)]) for q in range(4)])]
            assert bool(c._transports) == wire
    assert got[True] == [(q, 0, 5) for q in range(4)]
    assert got[False] == [(q, 5, 5) for q in range(4)]


def test_a_retry_with_the_same_identity_is_applied_once(client, topic):
    first = client.produce_batches([(topic, 1, [b"a", b"b"], "wire-retry", 0)])
    again = client.produce_batches([(topic, 1, [b"a", b"b"], "wire-retry", 0)])
    assert (first[0].base_offset, first[0].duplicate) == (0, False)
    assert (again[0].base_offset, again[0].duplicate) == (0, True)
    assert client.offsets(topic)[1].latest == 2
    with pytest.raises(ValueError, match="producer_id, sequence"):
        client.produce_batches([(topic, 1, [b"x"], "only-an-id")])


def test_per_batch_errors_come_back_as_over_grpc(client, topic):
    with pytest.raises(NotFound, match="no-such-topic"):
        client.produce_batches([("no-such-topic", 0, [b"x"])])
    with pytest.raises(InvalidArgument, match="queue 9"):
        client.produce_batches([(topic, 9, [b"x"])])
    assert all(o.latest == 0 for o in client.offsets(topic))


# --------------------------------------------------------- bad input, raw socket
def test_a_request_with_no_batches_is_invalid_and_the_connection_goes_on(cluster, client, topic):
    q = 0
    with connect(cluster, leader_of(client, topic, q)) as s:
        rid, code, body = call(s, rmq_pb2.ProduceBatchesRequest().SerializeToString())
        assert (rid, code) == (7, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        assert b"batches is empty" in body
        rid, code, body = call(s, b"\xff\xff\xff garbage", rid=8)
        assert (rid, code) == (8, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        assert b"not a ProduceBatchesRequest" in body
        rid, code, body = call(s, b"", method=99, rid=9)
        assert (rid, code) == (9, grpc.StatusCode.UNIMPLEMENTED.value[0])
        assert b"method 99" in body and b"ProduceBatches" in body
        assert all(o.latest == 0 for o in client.offsets(topic))      # nothing changed
        # the same connection still produces
        req = rmq_pb2.ProduceBatchesRequest(batches=[batch(topic, q, [b"ok"])])
        rid, code, body = call(s, req.SerializeToString(), rid=10)
        assert (rid, code) == (10, 0)
        out = rmq_pb2.ProduceBatchesResponse.FromString(body).outcomes
        assert [(o.code, o.result.base_offset, o.result.count) for o in out] == [(0, 0, 1)]


def test_a_not_leader_batch_names_the_leader(cluster, client, topic):
    q = 2
    follower = (leader_of(client, topic, q) + 1) % cluster.nodes
    with connect(cluster, follower) as s:
        req = rmq_pb2.ProduceBatchesRequest(batches=[batch(topic, q, [b"x"])])
        _, code, body = call(s, req.SerializeToString())
    out = rmq_pb2.ProduceBatchesResponse.FromString(body).outcomes[0]
    assert code == 0 and out.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert out.leader == cluster.addresses[leader_of(client, topic, q)]


@pytest.mark.parametrize("what", ["hello", "length"])
def test_a_stream_that_is_not_ours_gets_an_error_and_is_closed(cluster, client, what):
    s = socket.create_connection(port_of(cluster), timeout=10)
    with s:
        if what == "hello":
            s.sendall(b"PRI * HTTP/2.0\r\n")                        # e.g. a gRPC client
            want, text = grpc.StatusCode.INVALID_ARGUMENT, b"not an rmq produce stream"
        else:
            s.sendall(hello())
            recv_exact(s, HELLO.size)
            s.sendall(FRAME.pack(MAX_FRAME + 1, 5, METHOD_PRODUCE_BATCHES))
            want, text = grpc.StatusCode.RESOURCE_EXHAUSTED, b"the limit is"
        length, rid, code = FRAME.unpack(recv_exact(s, FRAME.size))
        assert (rid, code) == (0, want.value[0])
        assert text in bytes(recv_exact(s, length))
        assert closed(s)
    assert client.health(cluster.addresses[0])["serving"]


def test_a_client_gone_mid_frame_leaves_the_node_serving(cluster, client, topic):
    for cut in (2, FRAME.size + 3):
        s = socket.create_connection(port_of(cluster), timeout=10)
        s.sendall(hello())
        recv_exact(s, HELLO.size)
        body = rmq_pb2.ProduceBatchesRequest(batches=[batch(topic, 3, [b"half"])]).SerializeToString()
        s.sendall((FRAME.pack(len(body), 1, METHOD_PRODUCE_BATCHES) + body)[:cut])
        s.close()
    assert client.produce_batches([(topic, 3, [b"whole"])])[0].base_offset == 0
    assert [r.value for r in client.fetch(topic, 3, 0).records] == [b"whole"]


# ------------------------------------------------------------ transport faults

def test_a_node_without_a_produce_port_is_asked_over_grpc():
    grpc_call = Recorder()
    t = ProduceTransport(f"127.0.0.1:{unused_port()}", fallback=grpc_call)
    req = rmq_pb2.ProduceBatchesRequest(batches=[rmq_pb2.ProduceRequest(topic="t")])
    assert t.future(req, timeout=5).result(5) == rmq_pb2.ProduceBatchesResponse()
    t.future(req, timeout=5).result(5)          # remembered: not tried again at once
    assert grpc_call.calls == [1, 1]
    t.close()


def test_a_fallback_after_a_silent_produce_port_gets_only_what_is_left_of_the_attempt():
    """A node whose port takes the connection but never says hello (cut off, paused):
    the gRPC fallback gets what is left of the call's timeout, not a whole one more
    (issue 18: a cut-off leader cost a produce the connect timeout plus an attempt)."""
    srv = socket.create_server(("127.0.0.1", 0))                # accepts, never answers
    grpc_call = Recorder()
    t = ProduceTransport(f"127.0.0.1:{srv.getsockname()[1]}", fallback=grpc_call)
    req = rmq_pb2.ProduceBatchesRequest(batches=[rmq_pb2.ProduceRequest(topic="t")])
    try:
        t0 = time.monotonic()
        t.future(req, timeout=1.0).result(5)
        spent = time.monotonic() - t0
        assert grpc_call.calls == [1] and spent >= 0.9
        assert grpc_call.timeouts[0] <= 1.0 - spent + 0.05
    finally:
        t.close()
        srv.close()


def _silent_node() -> tuple[socket.socket, list]:
    """A listening socket that answers the hello of its first connection, then nothing
    (a paused node: the kernel accepts); the accepted sockets, to close."""
    srv = socket.create_server(("127.0.0.1", 0))
    conns = []

    def accept():
        c, _ = srv.accept()
        conns.append(c)
        recv_exact(c, HELLO.size)
        c.sendall(hello())                       # then silence

    threading.Thread(target=accept, daemon=True).start()
    return srv, conns


def test_a_node_that_stops_answering_fails_the_call_at_its_deadline():
    """A paused node accepts connections (the kernel does) but answers nothing:
    the call fails with DEADLINE_EXCEEDED at its deadline, and the connection
    is dropped so the next call starts afresh."""
    srv, conns = _silent_node()
    t = ProduceTransport(f"127.0.0.1:{srv.getsockname()[1]}", fallback=Recorder())
    req = rmq_pb2.ProduceBatchesRequest(batches=[rmq_pb2.ProduceRequest(topic="t")])
    t0 = time.monotonic()
    fut = t.future(req, timeout=0.5)
    with pytest.raises(WireCallError) as e:
        fut.result(10)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.4 < time.monotonic() - t0 < 5
    assert all(c.closed for c in t._conns["produce"])
    t.close()
    srv.close()
    for c in conns:
        c.close()


def test_an_idle_connections_reader_wakes_for_a_new_calls_deadline():
    """An idle connection's reader sleeps until it would close the connection (30 s),
    not waking every 0.1 s; a call sent meanwhile wakes it, so a node that never
    answers still fails the call at the call's own deadline."""
    srv, conns = _silent_node()
    conn = _Connection(f"127.0.0.1:{srv.getsockname()[1]}", timeout=5)
    wait_until(lambda: conn._asleep_until > time.monotonic() + 20, timeout=10, what="the reader asleep, idle")
    t0 = time.monotonic()
    fut = conn.call(b"", timeout=0.5)
    with pytest.raises(WireCallError) as e:
        fut.result(10)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.4 < time.monotonic() - t0 < 5
    assert conn.closed
    srv.close()
    for c in conns:
        c.close()


def test_a_produce_port_that_cannot_be_bound_leaves_the_node_on_grpc(cluster, caplog):
    host, port = port_of(cluster, 1)            # taken: node 1 serves it
    assert _produce_server(_NoServicer(), f"{host}:{port}") is None
    assert "not served" in caplog.text and "over gRPC" in caplog.text


def test_frame_header_layout():
    """u32 length | u32 request id | u32 code, little-endian (the docstring's layout)."""
    assert FRAME.pack(3, 2, 1) == struct.pack("<III", 3, 2, 1)
    assert hello() == b"RMQP\x01\x00\x00\x00"
    assert hello(pipelined=True) == b"RMQP\x01\x00\x02\x00"       # FLAG_PIPELINED: Client.producer's


def test_connections_past_the_limit_are_refused_with_resource_exhausted():
    """A produce server that takes 2 connections (what it answers is not under test here)."""
    srv = ProduceWireServer(lambda req: rmq_pb2.ProduceBatchesResponse(), "127.0.0.1", 0,
                            max_connections=2)
    host, port = srv.address.rsplit(":", 1)
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(2)]
    try:
        for s in held:
            s.sendall(hello())
            recv_exact(s, HELLO.size)               # both admitted
        with socket.create_connection((host, int(port)), timeout=10) as extra:
            length, rid, code = FRAME.unpack(recv_exact(extra, FRAME.size))
            assert (rid, code) == (0, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
            assert b"the limit is 2" in bytes(recv_exact(extra, length))
            assert closed(extra)
        held.pop().close()                         # a slot frees up
        def admitted():
            try:
                with _connect_to(host, int(port)):
                    return True
            except (AssertionError, OSError, WireProtocolError):
                return False
        wait_until(admitted, timeout=10, what="a new connection admitted")
    finally:
        for s in held:
            s.close()
        srv.stop()


def _connect_to(host: str, port: int) -> socket.socket:
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(hello())
    got = bytes(recv_exact(s, HELLO.size))
    assert got[:4] == b"RMQP", got
    return s


def test_recv_exact_reassembles_a_frame_sent_in_pieces_past_its_first_buffer():
    a, b = socket.socketpair()
    payload = bytes(range(256)) * (3 * 4096 + 1)       # ~3 MiB: two growth steps
    def send():
        for i in range(0, len(payload), 100_003):
            a.sendall(payload[i:i + 100_003])
        a.close()
    t = threading.Thread(target=send)
    t.start()
    try:
        assert recv_exact(b, len(payload)) == payload
        with pytest.raises(WireProtocolError, match="closed after 0 of 10"):
            recv_exact(b, 10)
    finally:
        t.join()
        b.close()


def _serve_once(reply: bytes | None):
    """A TCP server (not ours) that answers every connection with ``reply``
    (None: the right hello, then silence); returns (address, accepted sockets)."""
    srv = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def run():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            accepted.append(c)
            try:
                if reply is None:
                    recv_exact(c, HELLO.size)
                    c.sendall(hello())
                else:
                    c.sendall(reply)
            except (OSError, WireProtocolError):
                pass

    threading.Thread(target=run, daemon=True).start()
    return srv, f"127.0.0.1:{srv.getsockname()[1]}", accepted


@pytest.mark.parametrize("reply", [b"HTTP/1.1 400 Bad Request\r\n\r\n",        # another server
                                   FRAME.pack(5, 0, 8) + b"full!"])              # a node at its limit
def test_a_port_that_does_not_speak_the_protocol_sends_produce_over_grpc(reply):
    srv, address, accepted = _serve_once(reply)
    grpc_call = Recorder()
    t = ProduceTransport(address, fallback=grpc_call)
    req = rmq_pb2.ProduceBatchesRequest(batches=[rmq_pb2.ProduceRequest(topic="t")])
    try:
        assert t.future(req, timeout=5).result(5) == rmq_pb2.ProduceBatchesResponse()
        t.future(req, timeout=5).result(5)
        assert grpc_call.calls == [1, 1] and len(accepted) == 1     # not retried at once
    finally:
        t.close()
        srv.close()


def test_a_request_bigger_than_a_frame_goes_over_grpc(monkeypatch):
    import rmq_spark.client._produce_wire as pw
    monkeypatch.setattr(pw, "MAX_FRAME", 64)
    srv, address, accepted = _serve_once(None)
    grpc_call = Recorder()
    t = ProduceTransport(address, fallback=grpc_call)
    try:
        t.future(rmq_pb2.ProduceBatchesRequest(batches=[batch("t", 0, [b"x" * 100])]), timeout=5).result(5)
        assert grpc_call.calls == [1] and accepted == []
    finally:
        t.close()
        srv.close()


def test_requests_in_flight_together_get_a_connection_each_and_none_after_close():
    srv, address, accepted = _serve_once(None)                    # answers nothing
    t = ProduceTransport(address, fallback=Recorder(), max_connections=2)
    req = rmq_pb2.ProduceBatchesRequest(batches=[rmq_pb2.ProduceRequest(topic="t")])
    try:
        futs = [t.future(req, timeout=30) for _ in range(3)]
        assert len(accepted) == 2                                  # the third shares one
        assert len({id(c) for c in t._conns["produce"]}) == 2
        t.close()
        for f in futs:
            with pytest.raises(WireCallError) as e:
                f.result(5)
            assert e.value.code() == grpc.StatusCode.CANCELLED
        with pytest.raises(WireCallError, match="client closed"):
            t.future(req, timeout=5).result(5)
        assert len(accepted) == 2
    finally:
        srv.close()


def test_an_idle_connection_closes_itself_and_the_next_call_reopens(cluster, topic, monkeypatch):
    import rmq_spark.client._produce_wire as pw
    monkeypatch.setattr(pw, "IDLE_CLOSE", 0.3)
    with Client(cluster.endpoints, timeout=30) as c:
        c.produce_batches([(topic, 0, [b"a"])])
        first = [conn for t in c._transports.values() for conn in t._conns["produce"]]
        assert first
        wait_until(lambda: all(conn.closed for conn in first), timeout=10, what="idle connections closed")
        assert c.produce_batches([(topic, 0, [b"b"])])[0].base_offset == 1
        assert any(not conn.closed for t in c._transports.values() for conn in t._conns["produce"])


def test_a_produce_port_on_another_nodes_port_is_not_served(cluster, caplog):
    taken = set(cluster.addresses)
    assert _produce_server(_NoServicer(), cluster.addresses[1], taken) is None
    assert "another node's gRPC or raft port" in caplog.text
