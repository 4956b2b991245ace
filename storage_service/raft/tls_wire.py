"""The raft port over TLS: only nodes of the cluster may speak raft to a node.

A raft frame is a pickle, and unpickling runs code: on a plaintext raft port
anyone who reaches it could run code on the node, and anyone could pose as a
peer and vote. With TLS (the node's ``--tls-*`` files) both ends present a
certificate signed by the cluster's CA and check that the other's names a
node (``RaftTls.check``: its subject's common name is one of the node
names); a connection that fails either is closed before a frame is read.

``TlsTcpConnection`` is ``FastTcpConnection`` with a non-blocking handshake
in front: an outgoing connection starts it once TCP connects and counts as
connected (pysyncobj's ``onConnected``) only after the handshake and the
peer check; an accepted one handshakes before its first frame is parsed.
The handshake is bounded by the connection's timeout (the hub drops a
connect or an accepted connection that has not said who it is by then).
TLS runs over memory buffers (``protocol.tls.TlsBuffers``), the socket
stays plain: ciphertext goes out through the plain write path, a read
decrypts everything the kernel had.
"""
from __future__ import annotations

import logging
import pickle
import socket
import ssl
import time
from dataclasses import dataclass, field

from pysyncobj.poller import POLL_EVENT_TYPE

from ..protocol.tls import TlsBuffers, TlsFiles, client_context, common_name, server_context
from ..security.certs import certificate_common_name
from ._pysyncobj import CONNECTED, DISCONNECTED, Server
from .transport import _LEN, FastTcpConnection

__all__ = ["HubServer", "RaftTls", "TlsTcpConnection"]

log = logging.getLogger(__name__)

_READ = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
_READ_WRITE = _READ | POLL_EVENT_TYPE.WRITE


@dataclass
class RaftTls:
    """A node's TLS for its raft port: its files, and the names its peers' certificates
    must carry (default: the common name of its own certificate)."""
    files: TlsFiles
    node_names: frozenset[str] = frozenset()
    server: ssl.SSLContext = field(init=False, repr=False)
    client: ssl.SSLContext = field(init=False, repr=False)

    def __post_init__(self):
        self.server = server_context(self.files, require_client_cert=True)
        self.client = client_context(self.files)
        if not self.node_names:
            self.node_names = frozenset({certificate_common_name(self.files.cert)})

    def check(self, cert: dict | None) -> str | None:
        """None for a node's certificate, else what is wrong with it."""
        name = common_name(cert)
        if name in self.node_names:
            return None
        return (f"certificate of {name!r} is not a node's (node names: "
                f"{', '.join(sorted(self.node_names))})")


class TlsTcpConnection(FastTcpConnection):
    """A raft connection over TLS (see the module's doc).

    The socket stays a plain non-blocking socket; TLS is a ``TlsBuffers`` (an
    ``SSLObject`` over memory buffers) between it and the frames: a read takes
    what the kernel has (up to the receive buffer, many records at once) and
    decrypts it from memory, a frame is encrypted into ciphertext that goes out
    through ``FastTcpConnection``'s plain write path. (An ``SSLSocket`` read one
    16 KiB record per call with two ``recv`` syscalls each.)
    """

    def __init__(self, *args, tls: RaftTls, **kwargs):
        self._tls = tls
        self._buffers: TlsBuffers | None = None
        self._shaking = False
        self._host: str | None = None
        self._early: list[bytes] = []            # frames queued before the handshake finished
        self.peer_name: str | None = None
        super().__init__(*args, **kwargs)
        if self.sock is not None:     # accepted: handshake before the first frame
            self._buffers = TlsBuffers(tls.server, server_side=True)
            self._shaking = True

    def connect(self, host, port):
        self._host, self._buffers, self._shaking, self.peer_name = host, None, True, None
        self._early = []
        return super().connect(host, port)

    def on_event(self, descr, eventType):
        if not self._shaking:
            return self.base_event(descr, eventType)
        poller = self.poller
        if descr != self.fileno():
            poller.unsubscribe(descr)
            return
        if eventType & POLL_EVENT_TYPE.ERROR:
            self.disconnect()
            return
        self.check_timeout()
        if self.state == DISCONNECTED:
            return
        sock = self.sock
        if self._buffers is None:                # outgoing: TCP connected (or failed)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.disconnect()
                return
            self._buffers = TlsBuffers(self._tls.client, host=self._host)
        if eventType & POLL_EVENT_TYPE.READ:
            try:
                data = sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                self.disconnect()
                return
            if data == b"":
                self.disconnect()
                return
            if data:
                self._buffers.feed(data)
        try:
            done = self._buffers.step()
        except (ssl.SSLError, OSError) as e:
            log.warning("raft port: TLS handshake with %s failed: %s", _peer(sock), e)
            self.disconnect()
            return
        self._queue_raw(self._buffers.output())
        if self.state == DISCONNECTED:
            return
        if not done:
            _, wbuf = self.buffers()
            self.watch(_READ_WRITE if wbuf else _READ, descr)
            return
        cert = self._buffers.getpeercert()
        problem = self._tls.check(cert)
        if problem is not None:
            log.warning("raft port: refusing %s: %s", _peer(sock), problem)
            self.disconnect()
            return
        self._shaking, self.peer_name = False, common_name(cert)
        early, self._early = self._early, []
        for frame in early:
            self._queue_raw(self._buffers.encrypt(frame))
        # outgoing: pysyncobj's connected path (onConnected: the hub's hello; state
        # CONNECTED); then frames that came with the handshake's last read
        self.base_event(descr, POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.READ)
        if self.state != DISCONNECTED:
            self.base_event(descr, POLL_EVENT_TYPE.READ)
        if self.state != DISCONNECTED:
            _, wbuf = self.buffers()
            self.watch(_READ_WRITE if wbuf else _READ, descr)

    def _queue_raw(self, data: bytes) -> None:
        """Ciphertext out, in the order it was made: straight to the socket when nothing
        waits before it, the rest behind the write buffer."""
        if not data:
            return
        _, wbuf = self.buffers()
        if not wbuf and self.state != DISCONNECTED:
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.disconnect()
                return
            if sent == len(data):
                return
            data = memoryview(data)[sent:]
        wbuf += data

    def send(self, message):
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        head = _LEN.pack(len(data))
        if self._shaking or self._buffers is None:
            self._early.append(head + data)
            return
        # read-timeout check on every send, as pysyncobj's connection does
        self.check_timeout()
        if self.state == DISCONNECTED:
            return
        # a small frame in one record; a big one without copying it behind its head first
        self._queue_raw(self._buffers.encrypt(head + data) if len(data) < 4096 else
                        self._buffers.encrypt(head, data))
        _, wbuf = self.buffers()
        if wbuf and self.state == CONNECTED:
            self.watch(_READ_WRITE)

    def on_send_ready(self):
        if self._shaking:
            return False
        return super().on_send_ready()

    def on_readable(self):
        if self._shaking:
            return False
        rbuf, _ = self.buffers()
        chunk = self._recv_chunk()
        try:
            n = self.sock.recv_into(chunk)
        except (BlockingIOError, InterruptedError):
            self._buffers.decrypt_into(b"", rbuf)    # records fed during the handshake
            return False
        except OSError:
            self.disconnect()
            return False
        if not n:
            self.disconnect()
            return False
        try:
            self._buffers.decrypt_into(chunk[:n], rbuf)
        except (ssl.SSLError, ConnectionError) as e:
            log.warning("raft port: TLS from %s: %s; closing", _peer(self.sock), e)
            self.disconnect()
            return False
        return True


def _peer(sock) -> str:
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "a peer"


class HubServer(Server):
    """pysyncobj's server, making the hub's connections (TLS ones when ``tls`` is given).

    pysyncobj closed its listening socket for good on any failed accept: a node
    out of file descriptors for a moment (EMFILE) lost its raft port until
    restarted. Here a failed accept pauses accepting for ``PAUSE_S`` (the
    pending connection stays in the backlog, and a level-triggered poll would
    otherwise spin on it); the hub's tick resumes it."""
    PAUSE_S = 0.5

    def __init__(self, poller, host, port, onNewConnection, tls: RaftTls | None, **kwargs):
        super().__init__(poller, host, port, onNewConnection, **kwargs)
        self._tls = tls
        self._kwargs = kwargs
        self._paused_until: float | None = None

    def resume_if_paused(self, now: float) -> None:
        if self._paused_until is not None and now >= self._paused_until and self.accept_again():
            self._paused_until = None

    def on_accept(self, descr, event):
        if event & POLL_EVENT_TYPE.READ:
            try:
                sock, _ = self.listening.accept()
            except OSError as e:
                if e.errno not in (socket.errno.EAGAIN, socket.errno.EWOULDBLOCK):
                    log.warning("raft port: accept failed (%s); accepting again in %g s", e, self.PAUSE_S)
                    self._paused_until = time.monotonic() + self.PAUSE_S
                    self.server_poller.unsubscribe(descr)
                return
            send, recv = self._kwargs.get("sendBufferSize"), self._kwargs.get("recvBufferSize")
            if send:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send)
            if recv:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            conn = make_connection(self.server_poller, self._tls, socket=sock,
                                   timeout=self.connection_timeout,
                                   sendBufferSize=send or 2 ** 13, recvBufferSize=recv or 2 ** 13)
            self.hand_over(conn)
        if event & POLL_EVENT_TYPE.ERROR:
            log.warning("raft port: an error on the listening socket; accepting again in %g s", self.PAUSE_S)
            self._paused_until = time.monotonic() + self.PAUSE_S
            self.server_poller.unsubscribe(descr)


def make_connection(poller, tls: RaftTls | None, **kwargs) -> FastTcpConnection:
    if tls is None:
        return FastTcpConnection(poller=poller, **kwargs)
    return TlsTcpConnection(poller=poller, tls=tls, **kwargs)
