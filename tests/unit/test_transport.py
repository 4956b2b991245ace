"""FastTcpConnection on real loopback sockets: what goes on the wire, in which order."""
from __future__ import annotations

import pickle
import socket
import struct
import time

import pytest
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import CONNECTION_STATE

from storage_service.raft.transport import FastTcpConnection

pytestmark = pytest.mark.unit

_LEN = struct.Struct("<I")


def _frame(sock: socket.socket):
    sock.settimeout(5)
    head = b""
    while len(head) < 4:
        head += sock.recv(4 - len(head))
    n = _LEN.unpack(head)[0]
    body = b""
    while len(body) < n:
        body += sock.recv(n - len(body))
    return pickle.loads(body)


def _poll_until(poller, cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        poller.poll(0.01)


def test_a_message_never_goes_out_before_a_reconnected_sockets_handshake():
    """Issue 18: a node that had read nothing for ``connectionTimeout`` (its leader
    paused) sent a vote; the send found the connection timed out, pysyncobj's
    disconnect callback opened a new socket at once, and the vote went out on it
    ahead of the node's address: the peer failed with "unhashable type: 'dict'"
    and the election lost a round."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    poller = createPoller("auto")
    conn = FastTcpConnection(poller, timeout=0.3, sendBufferSize=1 << 16, recvBufferSize=1 << 16)
    # As pysyncobj's TCPTransport: reconnect inside the disconnect callback, and
    # send this node's address first on every new connection.
    conn.setOnDisconnectedCallback(lambda: conn.connect("127.0.0.1", port))
    conn.setOnConnectedCallback(lambda: conn.send("10.0.0.1:7001"))
    try:
        assert conn.connect("127.0.0.1", port)
        _poll_until(poller, lambda: conn.state == CONNECTION_STATE.CONNECTED)
        first, _ = srv.accept()
        assert _frame(first) == "10.0.0.1:7001"
        conn.send({"type": "append_entries"})
        assert _frame(first) == {"type": "append_entries"}

        time.sleep(0.4)                       # nothing read for longer than the timeout
        conn.send({"type": "request_vote", "term": 7})
        _poll_until(poller, lambda: conn.state == CONNECTION_STATE.CONNECTED)
        second, _ = srv.accept()
        assert _frame(second) == "10.0.0.1:7001"
        conn.send({"type": "request_vote", "term": 8})   # the connection works after it
        assert _frame(second) == {"type": "request_vote", "term": 8}
        first.close()
        second.close()
    finally:
        conn.disconnect()
        srv.close()


def test_big_frames_are_received_into_their_own_buffer_between_small_ones():
    """A frame of ``BIG_FRAME`` bytes or more (a raft append of many batches) is read
    straight into a buffer of its own, however the sender splits it; the frames
    around it come whole and in order; a length past ``KEEP_BIG`` (a stranger's bytes)
    allocates nothing; a frame that is not a message drops the connection."""
    from storage_service.raft import transport
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    poller = createPoller("auto")
    conn = FastTcpConnection(poller, timeout=30, sendBufferSize=1 << 16, recvBufferSize=1 << 16)
    got = []
    conn.setOnMessageReceivedCallback(got.append)
    big = {"entries": [b"x" * 700_000, b"y" * 300_000]}
    sent = [{"n": 1}, big, {"n": 2}, {"entries": [b"z" * (transport.BIG_FRAME + 1)]}, "last"]
    try:
        assert conn.connect("127.0.0.1", srv.getsockname()[1])
        _poll_until(poller, lambda: conn.state == CONNECTION_STATE.CONNECTED)
        peer, _ = srv.accept()
        wire = b"".join(_LEN.pack(len(p)) + p for p in (pickle.dumps(m, pickle.HIGHEST_PROTOCOL) for m in sent))
        for at in range(0, len(wire), 70_001):       # pieces that cut frames and headers anywhere
            peer.sendall(wire[at:at + 70_001])
            poller.poll(0.01)
        _poll_until(poller, lambda: len(got) == len(sent))
        assert got == sent
        assert conn._big is None
        store = conn._big_store
        peer.sendall(b"GET / HTTP/1.1\r\n" + b"x" * 200_000)   # "GET " reads as a 542 MB frame:
        _poll_until(poller, lambda: len(conn.buffers()[0]) == 200_016)   # gathered, nothing allocated
        assert conn._big is None and conn._big_store is store
        conn.buffers()[0].clear()
        peer.sendall(_LEN.pack(transport.BIG_FRAME) + b"\x80" * 1000)    # begun ...
        _poll_until(poller, lambda: conn._big is not None and conn._big[2] == 1000)
        peer.sendall(b"\x00" * (transport.BIG_FRAME - 1000))           # ... not a pickle
        _poll_until(poller, lambda: conn.state == CONNECTION_STATE.DISCONNECTED)
        assert got == sent
        peer.close()
    finally:
        conn.disconnect()
        srv.close()
