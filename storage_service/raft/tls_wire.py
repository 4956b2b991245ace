"""The raft port over TLS: only nodes of the cluster may speak raft to a node.

A raft frame is a pickle, and unpickling runs code: on a plaintext raft port
anyone who reaches it could run code on the node, and anyone could pose as a
peer and vote. With TLS (the node's ``--tls-*`` files) both ends present a
certificate signed by the cluster's CA and check that the other's names a
node (``RaftTls.check``: its subject's common name is one of the node
names); a connection that fails either is closed before a frame is read.

``TlsTcpConnection`` is ``FastTcpConnection`` with a non-blocking handshake
in front: an outgoing connection wraps its socket once TCP connects and
counts as connected (pysyncobj's ``onConnected``) only after the handshake
and the peer check; an accepted one handshakes before its first frame is
parsed. The handshake is bounded by the connection's timeout (the hub drops
a connect or an accepted connection that has not said who it is by then).
TLS has no ``sendmsg``: frames go out through the write buffer, at most
``CHUNK`` bytes a write. A read drains the TLS layer until it wants more
from the socket, so no decrypted bytes wait inside it for a poll that never
comes.
"""
from __future__ import annotations

import logging
import pickle
import socket
import ssl
from dataclasses import dataclass, field

import pysyncobj.tcp_connection as tc
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_server import TcpServer

from ..protocol.tls import TlsFiles, client_context, common_name, server_context
from .transport import _LEN, FastTcpConnection

__all__ = ["HubServer", "RaftTls", "TlsTcpConnection", "common_name"]

log = logging.getLogger(__name__)

CHUNK = 256 << 10
_WANT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)
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
            self.node_names = frozenset({own_common_name(self.files)})

    def check(self, cert: dict | None) -> str | None:
        """None for a node's certificate, else what is wrong with it."""
        name = common_name(cert)
        if name in self.node_names:
            return None
        return (f"certificate of {name!r} is not a node's (node names: "
                f"{', '.join(sorted(self.node_names))})")


def own_common_name(files: TlsFiles) -> str:
    from cryptography import x509
    from cryptography.x509.oid import NameOID
    with open(files.cert, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise ValueError(f"{files.cert}: the node certificate has no common name (CN): "
                         "peers recognise nodes by it")
    return str(names[0].value)


class TlsTcpConnection(FastTcpConnection):
    """A raft connection over TLS (see the module's doc)."""

    def __init__(self, *args, tls: RaftTls, **kwargs):
        self._tls = tls
        self._shaking = False
        self._host: str | None = None
        super().__init__(*args, **kwargs)
        sock = self._TcpConnection__socket
        if sock is not None:                     # accepted: handshake before the first frame
            self._TcpConnection__socket = tls.server.wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False)
            self._shaking = True

    def connect(self, host, port):
        self._host = host
        self._shaking = True
        return super().connect(host, port)

    @property
    def peer_name(self) -> str | None:
        sock = self._TcpConnection__socket
        return common_name(sock.getpeercert()) if isinstance(sock, ssl.SSLSocket) and not self._shaking else None

    def _TcpConnection__processConnection(self, descr, eventType):
        if not self._shaking:
            return super()._TcpConnection__processConnection(descr, eventType)
        poller = self._TcpConnection__poller
        if descr != self.fileno():
            poller.unsubscribe(descr)
            return
        if eventType & POLL_EVENT_TYPE.ERROR:
            self.disconnect()
            return
        self._TcpConnection__processConnectionTimeout()
        if self.state == tc.CONNECTION_STATE.DISCONNECTED:
            return
        sock = self._TcpConnection__socket
        if not isinstance(sock, ssl.SSLSocket):  # outgoing: TCP connected (or failed)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.disconnect()
                return
            sock = self._TcpConnection__socket = self._tls.client.wrap_socket(
                sock, server_side=False, do_handshake_on_connect=False, server_hostname=self._host)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            poller.subscribe(descr, self._TcpConnection__processConnection, _READ)
            return
        except ssl.SSLWantWriteError:
            poller.subscribe(descr, self._TcpConnection__processConnection, _READ_WRITE)
            return
        except (ssl.SSLError, OSError) as e:
            log.warning("raft port: TLS handshake with %s failed: %s", _peer(sock), e)
            self.disconnect()
            return
        problem = self._tls.check(sock.getpeercert())
        if problem is not None:
            log.warning("raft port: refusing %s: %s", _peer(sock), problem)
            self.disconnect()
            return
        self._shaking = False
        # outgoing: pysyncobj's connected path (onConnected, state CONNECTED); accepted:
        # read what came with the handshake and wait for frames
        super()._TcpConnection__processConnection(descr, POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.READ)
        if self.state != tc.CONNECTION_STATE.DISCONNECTED:
            _, wbuf = self._bufs()
            poller.subscribe(descr, self._TcpConnection__processConnection, _READ_WRITE if wbuf else _READ)

    def send(self, message):
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        _, wbuf = self._bufs()
        wbuf += _LEN.pack(len(data))
        wbuf += data
        if self._shaking:                        # goes out once the handshake is done
            return
        self._TcpConnection__trySendBuffer()
        if wbuf and self.state == tc.CONNECTION_STATE.CONNECTED:
            self._TcpConnection__poller.subscribe(
                self._TcpConnection__fileno, self._TcpConnection__processConnection, _READ_WRITE)

    def _TcpConnection__processSend(self):
        _, wbuf = self._bufs()
        if not wbuf or self._shaking:
            return False
        try:
            # TLS retries a write it could not finish with the same bytes: the
            # buffer only grows at its end, so its first CHUNK stays what it was
            res = self._TcpConnection__socket.send(wbuf[:CHUNK])
        except _WANT:
            return False
        except OSError:
            self.disconnect()
            return False
        if res <= 0:
            return False
        del wbuf[:res]
        return True

    def _TcpConnection__processRead(self):
        if self._shaking:
            return False
        chunk = getattr(self, "_chunk", None)
        if chunk is None:
            chunk = self._chunk = memoryview(bytearray(self._TcpConnection__recvBufferSize))
        try:
            n = self._TcpConnection__socket.recv_into(chunk)
        except _WANT:
            return False
        except OSError:                          # SSLError, SSLZeroReturnError, reset
            self.disconnect()
            return False
        if not n:
            self.disconnect()
            return False
        rbuf, _ = self._bufs()
        rbuf += chunk[:n]
        return True


def _peer(sock) -> str:
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "a peer"


class HubServer(TcpServer):
    """pysyncobj's server, making the hub's connections (TLS ones when ``tls`` is given)."""

    def __init__(self, poller, host, port, onNewConnection, tls: RaftTls | None, **kwargs):
        super().__init__(poller, host, port, onNewConnection, **kwargs)
        self._tls = tls
        self._kwargs = kwargs

    def _TcpServer__onNewConnection(self, descr, event):
        if event & POLL_EVENT_TYPE.READ:
            try:
                sock, _ = self._TcpServer__socket.accept()
            except OSError as e:
                if e.errno not in (socket.errno.EAGAIN, socket.errno.EWOULDBLOCK):
                    self.unbind()
                return
            send, recv = self._kwargs.get("sendBufferSize"), self._kwargs.get("recvBufferSize")
            if send:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send)
            if recv:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            conn = make_connection(self._TcpServer__poller, self._tls, socket=sock,
                                   timeout=self._TcpServer__connectionTimeout,
                                   sendBufferSize=send or 2 ** 13, recvBufferSize=recv or 2 ** 13)
            self._TcpServer__onNewConnectionCallback(conn)
        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()


def make_connection(poller, tls: RaftTls | None, **kwargs) -> FastTcpConnection:
    if tls is None:
        return FastTcpConnection(poller=poller, **kwargs)
    return TlsTcpConnection(poller=poller, tls=tls, **kwargs)
