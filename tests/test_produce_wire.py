"""The produce port (storage_service.server.produce_port): ProduceBatches over plain TCP
frames, against a real 3-node cluster, and the client's transport for it."""
from __future__ import annotations

import signal
import socket
import struct
import threading
import time

import grpc
import pytest

from rmq_spark.client import Client
from rmq_spark.client._produce_wire import ProduceTransport, WireCallError, _Connection
from rmq_spark.client.errors import (FailedPrecondition, InvalidArgument, KvConflict, NotFound, NotLeader,
                                     OutOfRange)
from storage_service.protocol.fetch_wire import decode_fetch_response
from storage_service.protocol.produce_frames import (FRAME, HELLO, MAX_FRAME, METHOD_FETCH, METHOD_KV_PUT,
                                                     METHOD_PRODUCE_BATCHES,
                                                     WireProtocolError, hello)
from storage_service.server.produce_port import ProduceWireServer, recv_exact
from storage_service.proto import rmq_pb2
from storage_service.protocol.records import encode
from storage_service.protocol.placement import produce_address
from storage_service.app import _produce_server

from .conftest import wait_until
from .scrape import total

pytestmark = pytest.mark.integration


class _NoServicer:
    """A servicer whose produce methods are never called (the port is not served)."""
    def produce_batches(self, request):
        raise AssertionError("not served")
    submit_batches = finish_batches = produce_batches


def _port_of(cluster, node: int = 0) -> tuple[str, int]:
    host, port = produce_address(cluster.addresses[node]).rsplit(":", 1)
    return host, int(port)


def _leader_of(client, topic: str, queue: int) -> int:
    """Index of the node leading the queue's group."""
    g = client.group_of(topic, queue)
    for n in client.cluster_status()["nodes"]:
        for st in n["groups"]:
            if st["group"] == g and st["leader"]:
                return client.endpoints.index(st["leader"])
    raise AssertionError(f"group {g} has no leader")


def _connect(cluster, node: int = 0) -> socket.socket:
    s = socket.create_connection(_port_of(cluster, node), timeout=10)
    s.sendall(hello())
    assert HELLO.unpack(recv_exact(s, HELLO.size))[0] == b"RMQP"
    return s


def _call(s: socket.socket, body: bytes, method: int = METHOD_PRODUCE_BATCHES, rid: int = 7):
    s.sendall(FRAME.pack(len(body), rid, method) + body)
    length, got_rid, code = FRAME.unpack(recv_exact(s, FRAME.size))
    return got_rid, code, bytes(recv_exact(s, length))


def _batch(topic: str, queue: int, values: list[bytes], **kw) -> rmq_pb2.ProduceRequest:
    return rmq_pb2.ProduceRequest(topic=topic, queue=queue, records=encode(values), count=len(values), **kw)


def _closed(s: socket.socket) -> bool:
    s.settimeout(10)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


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
    with _connect(cluster, _leader_of(client, topic, q)) as s:
        rid, code, body = _call(s, rmq_pb2.ProduceBatchesRequest().SerializeToString())
        assert (rid, code) == (7, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        assert b"batches is empty" in body
        rid, code, body = _call(s, b"\xff\xff\xff garbage", rid=8)
        assert (rid, code) == (8, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        assert b"not a ProduceBatchesRequest" in body
        rid, code, body = _call(s, b"", method=99, rid=9)
        assert (rid, code) == (9, grpc.StatusCode.UNIMPLEMENTED.value[0])
        assert b"method 99" in body and b"ProduceBatches" in body
        assert all(o.latest == 0 for o in client.offsets(topic))      # nothing changed
        # the same connection still produces
        req = rmq_pb2.ProduceBatchesRequest(batches=[_batch(topic, q, [b"ok"])])
        rid, code, body = _call(s, req.SerializeToString(), rid=10)
        assert (rid, code) == (10, 0)
        out = rmq_pb2.ProduceBatchesResponse.FromString(body).outcomes
        assert [(o.code, o.result.base_offset, o.result.count) for o in out] == [(0, 0, 1)]


def test_a_not_leader_batch_names_the_leader(cluster, client, topic):
    q = 2
    follower = (_leader_of(client, topic, q) + 1) % cluster.nodes
    with _connect(cluster, follower) as s:
        req = rmq_pb2.ProduceBatchesRequest(batches=[_batch(topic, q, [b"x"])])
        _, code, body = _call(s, req.SerializeToString())
    out = rmq_pb2.ProduceBatchesResponse.FromString(body).outcomes[0]
    assert code == 0 and out.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert out.leader == cluster.addresses[_leader_of(client, topic, q)]


@pytest.mark.parametrize("what", ["hello", "length"])
def test_a_stream_that_is_not_ours_gets_an_error_and_is_closed(cluster, client, what):
    s = socket.create_connection(_port_of(cluster), timeout=10)
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
        assert _closed(s)
    assert client.health(cluster.addresses[0])["serving"]


def test_a_client_gone_mid_frame_leaves_the_node_serving(cluster, client, topic):
    for cut in (2, FRAME.size + 3):
        s = socket.create_connection(_port_of(cluster), timeout=10)
        s.sendall(hello())
        recv_exact(s, HELLO.size)
        body = rmq_pb2.ProduceBatchesRequest(batches=[_batch(topic, 3, [b"half"])]).SerializeToString()
        s.sendall((FRAME.pack(len(body), 1, METHOD_PRODUCE_BATCHES) + body)[:cut])
        s.close()
    assert client.produce_batches([(topic, 3, [b"whole"])])[0].base_offset == 0
    assert [r.value for r in client.fetch(topic, 3, 0).records] == [b"whole"]


# ------------------------------------------------------------ transport faults
class _Recorder:
    """Stands in for gRPC's ProduceBatches.future: records that it was asked."""

    def __init__(self):
        self.calls = []
        self.timeouts = []

    def __call__(self, request, timeout=None):
        self.calls.append(len(request.batches))
        self.timeouts.append(timeout)
        fut = __import__("concurrent.futures").futures.Future()
        fut.set_result(rmq_pb2.ProduceBatchesResponse())
        return fut


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_node_without_a_produce_port_is_asked_over_grpc():
    grpc_call = _Recorder()
    t = ProduceTransport(f"127.0.0.1:{_unused_port()}", fallback=grpc_call)
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
    grpc_call = _Recorder()
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
    t = ProduceTransport(f"127.0.0.1:{srv.getsockname()[1]}", fallback=_Recorder())
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
    host, port = _port_of(cluster, 1)            # taken: node 1 serves it
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
            assert _closed(extra)
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
    grpc_call = _Recorder()
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
    grpc_call = _Recorder()
    t = ProduceTransport(address, fallback=grpc_call)
    try:
        t.future(rmq_pb2.ProduceBatchesRequest(batches=[_batch("t", 0, [b"x" * 100])]), timeout=5).result(5)
        assert grpc_call.calls == [1] and accepted == []
    finally:
        t.close()
        srv.close()


def test_requests_in_flight_together_get_a_connection_each_and_none_after_close():
    srv, address, accepted = _serve_once(None)                    # answers nothing
    t = ProduceTransport(address, fallback=_Recorder(), max_connections=2)
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


# ------------------------------------------------------------ Fetch on the port
def _fetch_answers(cluster, protocol: str) -> float:
    return total(cluster, "rmq_requests_total", method="Fetch", protocol=protocol, code="OK")


def test_a_fetch_goes_over_the_produce_port_and_reads_what_grpc_reads(cluster, client, topic):
    big = [bytes([65 + i % 26]) * 1024 for i in range(3000)]           # ~3 MB: a frame of many reads
    client.produce_batches([(topic, 0, big[:1500])])
    client.produce_batches([(topic, 0, big[1500:])])
    client.produce_batches([(topic, q, [f"k{q}-{i}".encode() for i in range(50)]) for q in (1, 2, 3)])
    before = _fetch_answers(cluster, "produce_port")
    with Client(cluster.endpoints, produce_port=False) as over_grpc:
        for q in range(4):
            wire = client.fetch_arrow(topic, q, 0, max_bytes=8 << 20)
            grpc_ = over_grpc.fetch_arrow(topic, q, 0, max_bytes=8 << 20)
            # (the test cluster's 64 KiB segments hold one of the 1.5 MB batches each)
            assert wire[0].num_rows == (1500 if q == 0 else 50)
            assert wire[0].equals(grpc_[0]) and wire[1:] == grpc_[1:]
            a, b = client.fetch(topic, q, 3, max_messages=5), over_grpc.fetch(topic, q, 3, max_messages=5)
            assert [(r.offset, r.value, r.store_timestamp) for r in a.records] == \
                   [(r.offset, r.value, r.store_timestamp) for r in b.records]
            assert (a.next_offset, a.earliest, a.latest, a.served_by) == \
                   (b.next_offset, b.earliest, b.latest, b.served_by)
    assert _fetch_answers(cluster, "produce_port") - before >= 8                  # all of the above
    # fetches and produce requests never share a connection (a fetch's megabytes and a
    # produce sent from the reader thread would wait on each other's socket buffers)
    kinds = {kind: {id(c) for t in client._transports.values() for c in t._conns[kind]}
             for kind in ("produce", "fetch")}
    assert kinds["produce"] and kinds["fetch"] and not kinds["produce"] & kinds["fetch"]


def test_a_failed_fetch_on_the_port_raises_what_grpc_raises(cluster, client, topic):
    """The node's error is asked again over gRPC, whose answer carries the leader's
    address and the queue's offsets: the same exception either way."""
    client.produce(topic, [b"x"] * 3, queue=1)
    follower = cluster.addresses[(_leader_of(client, topic, 1) + 1) % cluster.nodes]
    # (a short deadline: a not-leader answer from a pinned node is retried until it ends)
    with Client(cluster.endpoints, timeout=3) as wire, \
            Client(cluster.endpoints, produce_port=False, timeout=3) as over_grpc:
        for c in (wire, over_grpc):
            with pytest.raises(OutOfRange) as e:
                c.fetch(topic, 1, 4)
            assert (e.value.earliest, e.value.latest) == (0, 3)
            with pytest.raises(NotLeader) as e:
                c.fetch(topic, 1, 0, address=follower)
            assert e.value.leader == cluster.addresses[_leader_of(client, topic, 1)]
            assert [r.offset for r in c.fetch(topic, 1, 0).records] == [0, 1, 2]   # routed on


def test_fetch_frames_bad_input_and_a_long_poll_on_the_raw_port(cluster, client, topic):
    q = 3
    with _connect(cluster, _leader_of(client, topic, q)) as s:
        rid, code, body = _call(s, b"\xff\xff\xff garbage", method=METHOD_FETCH, rid=3)
        assert (rid, code) == (3, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        assert b"not a FetchRequest" in body
        req = rmq_pb2.FetchRequest(topic=topic, queue=q, offset=0, max_bytes=-1)
        rid, code, body = _call(s, req.SerializeToString(), method=METHOD_FETCH, rid=4)
        assert (rid, code) == (4, grpc.StatusCode.INVALID_ARGUMENT.value[0]) and b"max_bytes" in body
        # a long poll at the end of the queue waits for the next message (parked, as over gRPC)
        later = threading.Timer(0.5, lambda: client.produce(topic, [b"late"], queue=q))
        later.start()
        started = time.monotonic()
        req = rmq_pb2.FetchRequest(topic=topic, queue=q, offset=0, wait_ms=20_000)
        rid, code, body = _call(s, req.SerializeToString(), method=METHOD_FETCH, rid=5)
        later.join()
        reply = decode_fetch_response(body)
        assert (rid, code, reply.next_offset, reply.latest) == (5, 0, 1, 1)
        assert b"late" in bytes(reply.batches) and time.monotonic() - started < 15


def test_a_node_whose_produce_port_predates_fetch_is_asked_over_grpc():
    """A node of an older version answers Fetch on its port UNIMPLEMENTED: the
    transport says so (None: ask over gRPC) and stops asking the port for a while."""
    old = ProduceWireServer(lambda request: rmq_pb2.ProduceBatchesResponse(), "127.0.0.1", 0)
    t = ProduceTransport(old.address, fallback=_Recorder())
    try:
        req = rmq_pb2.FetchRequest(topic="t", queue=0, offset=0)
        assert t.fetch(req, timeout=5) is None
        assert t._fetch_unserved_until > time.monotonic() + 20
        assert t.future(rmq_pb2.ProduceBatchesRequest(batches=[rmq_pb2.ProduceRequest(topic="t")]),
                        timeout=5).result(5) == rmq_pb2.ProduceBatchesResponse()   # produce still does
        assert t._fallback_until == 0
    finally:
        t.close()
        old.stop()
    gone = ProduceTransport(f"127.0.0.1:{_unused_port()}", fallback=_Recorder())
    assert gone.fetch(rmq_pb2.FetchRequest(topic="t"), timeout=5) is None and gone._fallback_until > 0


def test_a_rotten_segment_sent_from_its_file_is_fetched_again_checked_and_healed(cluster, client, topic,
                                                                                 caplog):
    """Over the plaintext port the node sends batches from the segment file unchecked
    (sendfile); the client's CRC check finds rot that came after the node opened the
    file, and asks again over gRPC, where the node checks, repairs from a replica and
    answers the right bytes."""
    import glob
    import os

    from tests.node_faults import flip

    values = [f"{i:06d}".encode() * 200 for i in range(600)]           # ~720 KB: sealed segments
    for i in range(0, 600, 50):
        client.produce_batches([(topic, 0, values[i:i + 50])])
    leader = _leader_of(client, topic, 0)
    qdir, = glob.glob(os.path.join(cluster.data_dir, f"node-{leader}", "group-*", "queues", f"{topic}~*~0"))
    first = sorted(glob.glob(os.path.join(qdir, "*.log")))[0]
    # inside a record body (not a batch header, which the node looks at to find the
    # span); the node has the file open: only a read can find it
    flip(first, os.path.getsize(first) * 3 // 4)
    got = []
    with caplog.at_level("INFO", logger="rmq_spark.client.client"):
        while len(got) < 600:
            got += [r.value for r in client.fetch(topic, 0, len(got), max_bytes=1 << 20).records]
    assert got == values
    assert "fetching it again over gRPC" in caplog.text          # the port's copy was the rotten one


def test_a_span_whose_file_was_replaced_or_shortened_is_read_not_sent(tmp_path):
    """The node sends a span from its file only if the file is the one the span was
    found in (inode, device) and still holds it; else the batches are read instead."""
    import os

    from storage_service.protocol.fetch_wire import LocalSpan, encode_fetch_response
    from storage_service.server.produce_port import _FileReply

    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"0123456789" * 10)
    st = os.stat(path)

    def reply(inode=st.st_ino, length=40):
        return encode_fetch_response(b"", 9, 0, 9, "n:1", LocalSpan(str(path), 30, length, inode, st.st_dev))

    assert _FileReply.of(reply(inode=st.st_ino + 1)) is None            # rewritten: another file
    assert _FileReply.of(reply(length=200)) is None                     # shorter than the span
    assert _FileReply.of(encode_fetch_response(b"", 9, 0, 9, "n:1")) is None   # no span at all
    file_reply = _FileReply.of(reply())
    a, b = socket.socketpair()
    with a, b:
        file_reply.send(a, 11)
        length, rid, code = FRAME.unpack(recv_exact(b, FRAME.size))
        got = decode_fetch_response(bytes(recv_exact(b, length)))
    assert (rid, code, got.next_offset, got.latest, got.served_by, got.local) == (11, 0, 9, 9, "n:1", None)
    assert bytes(got.batches) == (b"0123456789" * 10)[30:70]


# ------------------------------------------------------ key-value on the port
def test_kv_calls_go_over_the_produce_port_and_answer_as_grpc_does(cluster, client, topic):
    """KvPut and KvRead on the port (gRPC's framing was most of a get's node CPU): the
    same answers and the same exceptions as over gRPC; a call to a follower is asked
    again over gRPC, whose answer names the leader."""
    client.create_topic("kv-port", queues=2, cleanup_policy="compact")

    def answers(method):
        return total(cluster, "rmq_requests_total", method=method, protocol="produce_port", code="OK")

    before = answers("KvPut"), answers("KvRead")
    with Client(cluster.endpoints, produce_port=False) as over_grpc:
        r1 = client.kv_put("kv-port", "a", b"one", if_absent=True)
        r2 = over_grpc.kv_put("kv-port", "a", b"two", if_revision=r1)
        for c in (client, over_grpc):
            got = c.kv_get("kv-port", "a")
            assert (got.value, got.revision) == (b"two", r2)
            assert c.kv_get("kv-port", "a", revision=r1).value == b"one"
            assert [e.value for e in c.kv_history("kv-port", "a")] == [b"one", b"two"]
            with pytest.raises(KvConflict) as e:
                c.kv_put("kv-port", "a", b"x", if_revision=r1)
            assert e.value.current_revision == r2
            with pytest.raises(InvalidArgument, match="key"):
                c.kv_put("kv-port", b"", b"x")
            with pytest.raises(FailedPrecondition, match="compact"):
                c.kv_get(topic, "a")
    assert answers("KvPut") - before[0] >= 1 and answers("KvRead") - before[1] >= 3
    # a follower pinned as the only endpoint: not the leader, asked again over gRPC
    q = client.kv_get("kv-port", "a").queue
    leader = _leader_of(client, "kv-port", q)
    follower = cluster.endpoints.split(",")[(leader + 1) % cluster.nodes]
    with Client(follower, timeout=30) as lone:
        assert lone.kv_get("kv-port", "a").value == b"two"
        # a follower's own applied state: it learns the commit a moment after the leader
        wait_until(lambda: lone.kv_get("kv-port", "a", follower_ok=True).value == b"two", timeout=30)


def _send_frame(s: socket.socket, rid: int, method: int, body: bytes) -> None:
    s.sendall(FRAME.pack(len(body), rid, method) + body)


def _read_answer(s: socket.socket) -> tuple[int, int, bytes]:
    length, rid, code = FRAME.unpack(recv_exact(s, FRAME.size))
    return rid, code, bytes(recv_exact(s, length))


def test_kv_puts_in_flight_together_on_one_connection(cluster, client):
    """A put waits for its commit without holding its connection: frames sent after it
    are read and answered meanwhile (bad input at once, while the put cannot commit),
    and puts sent back to back on one connection are all stored, in the order sent."""
    client.create_topic("kv-inflight", queues=1, cleanup_policy="compact")
    client.kv_put("kv-inflight", "k", b"warm")
    leader = _leader_of(client, "kv-inflight", 0)
    followers = [i for i in range(cluster.nodes) if i != leader]

    def put(value: bytes, key: bytes = b"k") -> bytes:
        return rmq_pb2.KvPutRequest(topic="kv-inflight", key=key, value=value).SerializeToString()

    with _connect(cluster, leader) as s:
        s.settimeout(60)
        for i in followers:
            cluster.kill(i, signal.SIGSTOP)      # the put cannot commit while both are stopped
        try:
            _send_frame(s, 1, METHOD_KV_PUT, put(b"held"))
            _send_frame(s, 2, METHOD_KV_PUT, put(b"x", key=b""))
            rid, code, body = _read_answer(s)
        finally:
            for i in followers:
                cluster.kill(i, signal.SIGCONT)
        assert (rid, code) == (2, grpc.StatusCode.INVALID_ARGUMENT.value[0]), body
        assert b"key is empty" in body
        rid, code, body = _read_answer(s)
        assert (rid, code) == (1, 0), body
        held = rmq_pb2.KvPutResponse.FromString(body).revision

        for n in range(20):                   # back to back, then the answers
            _send_frame(s, 10 + n, METHOD_KV_PUT, put(b"v%d" % n))
        answers = [_read_answer(s) for _ in range(20)]
    assert sorted(rid for rid, _, _ in answers) == list(range(10, 30))
    assert all(code == 0 for _, code, _ in answers), answers
    revs = {rid: rmq_pb2.KvPutResponse.FromString(body).revision for rid, _, body in answers}
    assert [revs[10 + n] for n in range(20)] == sorted(revs.values()) and min(revs.values()) > held
    assert len(set(revs.values())) == 20
    latest = client.kv_get("kv-inflight", "k")
    assert (latest.value, latest.revision) == (b"v19", revs[29])
    assert [e.value for e in client.kv_history("kv-inflight", "k")][-21:] == [b"held"] + [b"v%d" % n for n in range(20)]


def test_a_node_whose_produce_port_predates_kv_is_asked_over_grpc():
    old = ProduceWireServer(lambda request: rmq_pb2.ProduceBatchesResponse(), "127.0.0.1", 0)
    t = ProduceTransport(old.address, fallback=_Recorder())
    try:
        assert t.kv("KvRead", rmq_pb2.KvReadRequest(topic="t", key=b"k"), timeout=5) is None
        assert t._kv_unserved_until > time.monotonic() + 20
    finally:
        t.close()
        old.stop()
