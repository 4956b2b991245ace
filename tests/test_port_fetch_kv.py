"""Fetch and key-value calls on the produce port (storage_service.server.produce_port),
against a real 3-node cluster, and the client's transport for them (ProduceBatches:
test_produce_wire.py)."""
from __future__ import annotations

import signal
import socket
import threading
import time

import grpc
import pytest

from rmq_spark.client import Client
from rmq_spark.client._produce_wire import ProduceTransport
from rmq_spark.client.errors import FailedPrecondition, InvalidArgument, KvConflict, NotLeader, OutOfRange
from storage_service.protocol.fetch_wire import decode_fetch_response
from storage_service.protocol.produce_frames import FRAME, METHOD_FETCH, METHOD_KV_PUT
from storage_service.server.produce_port import ProduceWireServer, recv_exact
from storage_service.proto import rmq_pb2

from .conftest import wait_until
from .scrape import total
from .wire import Recorder, call, connect, leader_of, unused_port

pytestmark = pytest.mark.integration


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
    follower = cluster.addresses[(leader_of(client, topic, 1) + 1) % cluster.nodes]
    # (a short deadline: a not-leader answer from a pinned node is retried until it ends)
    with Client(cluster.endpoints, timeout=3) as wire, \
            Client(cluster.endpoints, produce_port=False, timeout=3) as over_grpc:
        for c in (wire, over_grpc):
            with pytest.raises(OutOfRange) as e:
                c.fetch(topic, 1, 4)
            assert (e.value.earliest, e.value.latest) == (0, 3)
            with pytest.raises(NotLeader) as e:
                c.fetch(topic, 1, 0, address=follower)
            assert e.value.leader == cluster.addresses[leader_of(client, topic, 1)]
            assert [r.offset for r in c.fetch(topic, 1, 0).records] == [0, 1, 2]   # routed on


def test_fetch_frames_bad_input_and_a_long_poll_on_the_raw_port(cluster, client, topic):
    q = 3
    with connect(cluster, leader_of(client, topic, q)) as s:
        rid, code, body = call(s, b"\xff\xff\xff garbage", method=METHOD_FETCH, rid=3)
        assert (rid, code) == (3, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        assert b"not a FetchRequest" in body
        req = rmq_pb2.FetchRequest(topic=topic, queue=q, offset=0, max_bytes=-1)
        rid, code, body = call(s, req.SerializeToString(), method=METHOD_FETCH, rid=4)
        assert (rid, code) == (4, grpc.StatusCode.INVALID_ARGUMENT.value[0]) and b"max_bytes" in body
        # a long poll at the end of the queue waits for the next message (parked, as over gRPC)
        later = threading.Timer(0.5, lambda: client.produce(topic, [b"late"], queue=q))
        later.start()
        started = time.monotonic()
        req = rmq_pb2.FetchRequest(topic=topic, queue=q, offset=0, wait_ms=20_000)
        rid, code, body = call(s, req.SerializeToString(), method=METHOD_FETCH, rid=5)
        later.join()
        reply = decode_fetch_response(body)
        assert (rid, code, reply.next_offset, reply.latest) == (5, 0, 1, 1)
        assert b"late" in bytes(reply.batches) and time.monotonic() - started < 15


def test_a_node_whose_produce_port_predates_fetch_is_asked_over_grpc():
    """A node of an older version answers Fetch on its port UNIMPLEMENTED: the
    transport says so (None: ask over gRPC) and stops asking the port for a while."""
    old = ProduceWireServer(lambda request: rmq_pb2.ProduceBatchesResponse(), "127.0.0.1", 0)
    t = ProduceTransport(old.address, fallback=Recorder())
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
    gone = ProduceTransport(f"127.0.0.1:{unused_port()}", fallback=Recorder())
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
    leader = leader_of(client, topic, 0)
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
    leader = leader_of(client, "kv-port", q)
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
    leader = leader_of(client, "kv-inflight", 0)
    followers = [i for i in range(cluster.nodes) if i != leader]

    def put(value: bytes, key: bytes = b"k") -> bytes:
        return rmq_pb2.KvPutRequest(topic="kv-inflight", key=key, value=value).SerializeToString()

    with connect(cluster, leader) as s:
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
    t = ProduceTransport(old.address, fallback=Recorder())
    try:
        assert t.kv("KvRead", rmq_pb2.KvReadRequest(topic="t", key=b"k"), timeout=5) is None
        assert t._kv_unserved_until > time.monotonic() + 20
    finally:
        t.close()
        old.stop()
