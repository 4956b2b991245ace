"""The client side of a node's produce port (``storage_service.server.produce_port``).

``ProduceTransport.future(request, timeout)`` has the shape of a gRPC
``ProduceBatches.future``: a ``Future`` whose result is a
``ProduceBatchesResponse`` or whose exception is a ``grpc.RpcError``
(``WireCallError``), so ``ProduceSender`` coalesces calls and maps errors
the same way over either transport. A node whose produce port cannot be set
up (refused: not served, e.g. its port was taken; another protocol on it; at
its connection limit; no hello in time) is asked over gRPC for
``FALLBACK_SECONDS`` before the port is tried again, and so is a request
bigger than a frame may be (gRPC then names the limit).

``ProduceTransport.fetch(request, timeout)`` sends a ``Fetch`` the same way
and waits for it: the reply, or None when the port did not answer it and the
caller should ask over gRPC (see ``fetch``).

A connection answers its requests in order (but for key-value puts, which
the node answers as they commit: answers are matched by request id), so a
transport keeps up to
``max_connections`` of them for produce requests, as many again for fetches
(never mixed: see ``__init__``), and gives each request one with nothing in
flight when it can. A request past its deadline fails with
DEADLINE_EXCEEDED and takes its connection down with it (a stuck or paused
node): the next request opens a new one. A connection unused for
``IDLE_CLOSE`` closes itself, so a Client dropped without ``close()`` does
not hold nodes' connection slots for ever.

Over TLS (a Client with ``tls``), a connection keeps an ``ssl.SSLObject``
over memory buffers (``protocol.tls.TlsBuffers``) rather than an ``SSLSocket``: callers send and
the reader thread receives at the same time, and OpenSSL's SSL object must
not be used by two threads at once, so every use of it is under one lock and
the socket carries the bytes it produces. Ciphertext goes out only from the
senders (which hold the connection's lock, so records leave in the order
they were made); the reader only decrypts.
"""
from __future__ import annotations

import logging
import os
import select
import socket
import ssl
import threading
import time
from concurrent.futures import Future
from typing import Callable

import grpc

from storage_service.proto import rmq_pb2
from storage_service.protocol.errors import status_code
from storage_service.protocol.fetch_wire import FetchReply, decode_fetch_response
from storage_service.protocol.tls import TlsBuffers
from storage_service.protocol.produce_frames import (HELLO, MAX_FRAME, METHOD_FETCH, METHOD_KV_PUT, METHOD_KV_READ,
                                                     METHOD_PRODUCE_BATCHES,
                                                     FrameReader, WireProtocolError, check_hello, frame_head,
                                                     hello)

__all__ = ["KV_METHODS", "ProduceTransport", "WireCallError"]

log = logging.getLogger(__name__)
FALLBACK_SECONDS = 30.0
KV_METHODS = {"KvPut": (METHOD_KV_PUT, rmq_pb2.KvPutResponse.FromString),
              "KvRead": (METHOD_KV_READ, rmq_pb2.KvReadResponse.FromString)}
# Errors of a key-value call over the port that settle it: raised as they are. Others go
# to gRPC, whose answer carries what the caller's retries need (UNAVAILABLE: the leader's
# address; RESOURCE_EXHAUSTED: the retry-after hint that makes it Overloaded, retried).
SETTLED = {grpc.StatusCode.ABORTED, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
           grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED,
           grpc.StatusCode.UNAUTHENTICATED}
CONNECT_TIMEOUT = 2.0
IDLE_CLOSE = 30.0          # a connection unused this long closes (nodes close theirs at 120 s)
PRODUCE, FETCH, ORDERED = "produce", "fetch", "ordered"    # the kinds of connection a transport keeps apart


class WireCallError(grpc.RpcError):
    """A ProduceBatches call that failed as a whole (or was answered wrongly), seen as a gRPC status."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return ()


class _Connection:
    """One produce-port connection: requests by id, answered by a reader thread.

    The socket is non-blocking and every wait is a ``poll`` with the
    request's own deadline: callers' sends and the reader share no socket
    timeout (with one, a reader's short wait could cut a caller's big send).
    A frame half sent or half read leaves the stream unusable: the
    connection closes and fails everything in flight on it.
    """

    def __init__(self, address: str, timeout: float, token: str | None = None,
                 ssl_context: ssl.SSLContext | None = None, pipelined: bool = False):
        host, port = address.rsplit(":", 1)
        self.address = address
        self._sock = socket.create_connection((host, int(port)), timeout=timeout)
        self._tls: TlsBuffers | None = None
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ssl_context is not None:
                self._tls = TlsBuffers(ssl_context, host=host)
                self._tls.handshake(self._sock)
            # A node refusing the token answers an error frame instead of its hello: this
            # transport then falls back to gRPC, which names the reason (UNAUTHENTICATED).
            self._send_blocking(hello(token, pipelined))
            check_hello(self._recv_hello())
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[Future, float, Callable]] = {}   # id -> (future, deadline, parse)
        self._next_id = 0
        self.closed = False
        # The reader sleeps in poll until the earliest deadline in flight (idle: until it
        # would close the connection); a call due before that wakes it through this pipe.
        # (It used to wake every 0.1 s: ~0.004 of a core per idle Client, 48 producer
        # processes ~0.2 of a core, issue 39.3.)
        self._asleep_until = 0.0                # monotonic; set under the lock
        pipe = ()
        try:
            pipe = self._wake_r, self._wake_w = os.pipe()
            for fd in pipe:
                os.set_blocking(fd, False)
            self._reader = threading.Thread(target=self._read, name=f"produce-wire-{address}", daemon=True)
            self._reader.start()
        except BaseException:                   # (no reader: nobody else closes them)
            for fd in pipe:
                os.close(fd)
            self._sock.close()
            raise

    def call(self, body: bytes, timeout: float, method: int = METHOD_PRODUCE_BATCHES,
             parse: Callable = rmq_pb2.ProduceBatchesResponse.FromString) -> Future:
        """Send one request; its future gets ``parse(reply body)`` or a WireCallError."""
        fut: Future = Future()
        deadline = time.monotonic() + timeout
        with self._lock:
            if self.closed:
                raise OSError(f"produce connection to {self.address} is closed")
            self._next_id = self._next_id % 0xFFFFFFFF + 1      # 0 is for connection errors
            rid = self._next_id
            self._pending[rid] = (fut, deadline, parse)
            if deadline < self._asleep_until:
                try:
                    os.write(self._wake_w, b"\0")
                except BlockingIOError:          # a wake-up is on its way already
                    pass
            try:
                self._send(frame_head(rid, method, len(body)), body, deadline)
                return fut
            except OSError as e:
                self._pending.pop(rid, None)
                error = e
                failed = self._shut_locked()
        _fail(failed, grpc.StatusCode.UNAVAILABLE, f"send to {self.address} failed: {error}")
        raise error

    def _send_blocking(self, data: bytes) -> None:
        self._sock.sendall(self._tls.encrypt(data) if self._tls else data)

    def _recv_hello(self) -> bytes:
        """The node's hello (the socket still blocks, with the connect timeout)."""
        data = self._tls.decrypt(b"") if self._tls else b""     # (came with the handshake)
        while len(data) < HELLO.size:
            chunk = self._sock.recv(HELLO.size - len(data) if self._tls is None else 1 << 14)
            if not chunk:
                raise WireProtocolError(f"connection closed after {len(data)} bytes of the hello")
            data += self._tls.decrypt(chunk) if self._tls else chunk
        return data

    def _send(self, head: bytes, body: bytes, deadline: float) -> None:
        if self._tls is not None:
            parts = [memoryview(self._tls.encrypt(head, body))]
        else:
            parts = [memoryview(head), memoryview(body)] if body else [memoryview(head)]
        poller = select.poll()
        poller.register(self._sock, select.POLLOUT)
        while parts:
            try:
                sent = self._sock.sendmsg(parts)
            except BlockingIOError:
                sent = 0
            while sent and parts:
                if sent >= len(parts[0]):
                    sent -= len(parts.pop(0))
                else:
                    parts[0], sent = parts[0][sent:], 0
            if parts:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the node took nothing more before the call's deadline")
                poller.poll(left * 1000)

    def _read(self) -> None:
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        sock_fd = self._sock.fileno()
        frames = FrameReader(MAX_FRAME)
        idle_since = time.monotonic()
        try:
            while not self.closed:
                events = poller.poll(self._wait(idle_since + IDLE_CLOSE) * 1000)
                ready = any(fd == sock_fd for fd, _ in events)
                if len(events) > ready:
                    _drain(self._wake_r)
                if self._pending:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > IDLE_CLOSE:
                    # Unused for a while (or its Client dropped without close()):
                    # give the node its connection slot back; a new one opens on demand.
                    self._close(grpc.StatusCode.UNAVAILABLE, "idle")
                    return
                if ready and self._tls is None:
                    self._receive_into(frames)
                elif ready:
                    try:
                        chunk = self._sock.recv(1 << 16)
                    except BlockingIOError:
                        chunk = None
                    if chunk == b"":
                        raise WireProtocolError("closed by the node")
                    for f in frames.feed(self._tls.decrypt(chunk) if chunk else b""):
                        self._answer(f.request_id, f.code, f.body)
                if self._expired():
                    return
        except Exception as e:             # whatever it is, nobody may be left waiting
            self._close(grpc.StatusCode.UNAVAILABLE, f"produce connection to {self.address}: {e}")
        finally:
            self._sock.close()             # only here: no other thread polls it after a shutdown
            with self._lock:               # callers write to the pipe only while not closed
                self.closed = True
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _receive_into(self, frames: FrameReader) -> None:
        """Plaintext: received straight into the frame's buffer (a fetch's megabytes
        are not copied out of 64 KiB chunks), until the socket has no more."""
        while True:
            with frames.want() as view:      # released before the next want() grows the body
                try:
                    n = self._sock.recv_into(view)
                except BlockingIOError:
                    return
            if not n:
                raise WireProtocolError("closed by the node")
            f = frames.got(n)
            if f is not None:
                self._answer(f.request_id, f.code, f.body)

    def _wait(self, idle_until: float) -> float:
        """Seconds until the earliest deadline in flight, or ``idle_until`` with none; a
        call sent meanwhile with an earlier deadline wakes the reader (``call``)."""
        with self._lock:
            until = min((d for _, d, _ in self._pending.values()), default=idle_until)
            self._asleep_until = until
        return max(0.0, until - time.monotonic())

    def _expired(self) -> bool:
        now = time.monotonic()
        with self._lock:
            if not any(d <= now for _, d, _ in self._pending.values()):
                return False
        self._close(grpc.StatusCode.DEADLINE_EXCEEDED, f"{self.address} did not answer in time")
        return True

    def _answer(self, rid: int, code: int, body: bytearray) -> None:
        if rid == 0:        # the node closes the connection after this
            raise WireProtocolError(body.decode(errors="replace"))
        with self._lock:
            fut, _, parse = self._pending.pop(rid, (None, 0.0, None))
        if fut is None:
            return
        if code:
            fut.set_exception(WireCallError(status_code(code),
                                            body.decode(errors="replace")))
            return
        try:
            fut.set_result(parse(body))
        except Exception as e:             # a garbled answer: this request is lost, not the others
            fut.set_exception(WireCallError(grpc.StatusCode.UNAVAILABLE, f"bad answer from {self.address}: {e}"))

    def _shut_locked(self) -> list[Future]:
        """Mark closed and wake the reader (which closes the socket); the futures
        in flight, to fail once the lock is released (their callbacks may send)."""
        if not self.closed:
            self.closed = True
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        pending, self._pending = self._pending, {}
        return [fut for fut, _, _ in pending.values()]

    def _close(self, code: grpc.StatusCode, why: str) -> None:
        with self._lock:
            failed = self._shut_locked()
        _fail(failed, code, why)

    def close(self) -> None:
        self._close(grpc.StatusCode.CANCELLED, "client closed")


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _fail(futures: list[Future], code: grpc.StatusCode, why: str) -> None:
    for fut in futures:
        fut.set_exception(WireCallError(code, why))


class ProduceTransport:
    """``ProduceBatches`` (and ``Fetch``) to one node over its produce port, else over gRPC."""

    def __init__(self, address: str, fallback: Callable[..., grpc.Future], max_connections: int = 2,
                 token: str | None = None, ssl_context: ssl.SSLContext | None = None):
        self.address = address
        self._token = token
        self._ssl = ssl_context
        self._fallback = fallback
        self.max_connections = max_connections
        self._lock = threading.Lock()
        # Fetches get connections of their own: a fetch's answer (megabytes) and a
        # produce request sent from the reader thread (ProduceSender sends the next
        # one from a reply's callback) must never wait on each other's socket buffers.
        self._conns: dict[str, list[_Connection]] = {PRODUCE: [], FETCH: [], ORDERED: []}
        self._ordered_lock = threading.Lock()
        self._busy: dict[_Connection, int] = {}   # requests given to each connection, not yet done
        self._opening = {PRODUCE: 0, FETCH: 0, ORDERED: 0}
        self._fallback_until = 0.0
        self._fetch_unserved_until = 0.0
        self._kv_unserved_until = 0.0
        self._closed = False

    def future(self, request: rmq_pb2.ProduceBatchesRequest, timeout: float, ordered: bool = False):
        """``ordered``: on the one connection of ordered requests, which the node submits
        in the order they were sent (``Producer``: several requests in flight, each
        queue's batches in order)."""
        if self._closed:
            return _failed(grpc.StatusCode.CANCELLED, "client closed")
        if time.monotonic() < self._fallback_until or request.ByteSize() > MAX_FRAME:
            return self._fallback(request, timeout=timeout)     # too big: gRPC says so precisely
        deadline = time.monotonic() + timeout
        conn = self._open(timeout, ORDERED if ordered else PRODUCE)
        if conn is None:
            # gRPC on that node may still work, within what is left of this attempt (a
            # node cut off from the network must not cost the connect timeout and then
            # a whole attempt more).
            return self._fallback(request, timeout=max(0.01, deadline - time.monotonic()))
        try:
            fut = conn.call(request.SerializeToString(), timeout)
        except OSError as e:
            self._release(conn)
            return _failed(grpc.StatusCode.UNAVAILABLE, f"produce port {self.address}: {e}")
        fut.add_done_callback(lambda _: self._release(conn))
        return fut

    def fetch(self, request: rmq_pb2.FetchRequest, timeout: float) -> FetchReply | None:
        """``Fetch`` over the produce port: the reply, or None when the port did not
        answer it (not served or not reachable, as for ``future``; or the node
        answered an error, whose gRPC form carries what the caller's retries use:
        the leader's address, the queue's offsets). The caller then asks over gRPC.
        At a limit (RESOURCE_EXHAUSTED) it raises: the caller backs off, not asks again."""
        return self._unary(request, timeout, METHOD_FETCH, decode_fetch_response, "_fetch_unserved_until",
                           {grpc.StatusCode.RESOURCE_EXHAUSTED})

    def kv(self, method: str, request, timeout: float):
        """``KvPut``/``KvRead`` over the produce port: the response, or None when the port
        did not answer it (not served, not reachable, or an answer the caller's retries
        need in its gRPC form: not the leader, with its address; unavailable; at a
        limit): the caller then asks over gRPC. An answer that settles the call (a
        conflict, bad input, not allowed) raises the client's exception for it."""
        code, parse = KV_METHODS[method]
        return self._unary(request, timeout, code, parse, "_kv_unserved_until", SETTLED)

    def _unary(self, request, timeout: float, method: int, parse, unserved: str, raised: set):
        """One request on a fetch connection of the port: ``parse(reply)``, or None for the
        caller to ask over gRPC. An error whose code is in ``raised`` is raised; a node
        that does not serve ``method`` (UNIMPLEMENTED: an older version) is not asked it
        on the port for ``FALLBACK_SECONDS`` (the attribute named ``unserved``)."""
        if self._closed or time.monotonic() < max(self._fallback_until, getattr(self, unserved)):
            return None
        deadline = time.monotonic() + timeout
        conn = self._open(timeout, FETCH)
        if conn is None:
            return None
        try:
            left = deadline - time.monotonic()      # (connecting took some of it)
            if left <= 0:
                return None
            return conn.call(request.SerializeToString(), left, method, parse).result()
        except WireCallError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                setattr(self, unserved, time.monotonic() + FALLBACK_SECONDS)
            if e.code() in raised:
                raise
            return None
        except OSError:
            return None
        finally:
            self._release(conn)

    def _open(self, timeout: float, kind: str) -> _Connection | None:
        """``_connection``, or None when the port cannot be set up (refused, not our
        protocol: another server on the port, or a node at its connection limit; no
        hello in time): the node is then asked over gRPC for ``FALLBACK_SECONDS``."""
        try:
            return self._connection(timeout, kind)
        except (OSError, WireProtocolError) as e:
            log.info("produce port %s: %s; ProduceBatches and Fetch over gRPC for %.0f s",
                     self.address, e, FALLBACK_SECONDS)
            self._fallback_until = time.monotonic() + FALLBACK_SECONDS
            return None

    def _connection(self, timeout: float, kind: str) -> _Connection:
        """A connection of ``kind`` (``PRODUCE``, ``FETCH``) with nothing in flight if
        there is one (or can be one), else the least busy; counted busy until its
        request is done."""
        if kind == ORDERED:
            with self._ordered_lock:             # exactly one: opened by one caller at a time
                return self._one_connection(timeout, kind, 1)
        return self._one_connection(timeout, kind, self.max_connections)

    def _one_connection(self, timeout: float, kind: str, limit: int) -> _Connection:
        with self._lock:
            conns = self._conns[kind] = [c for c in self._conns[kind] if not c.closed]
            idle = [c for c in conns if not self._busy.get(c)]
            if idle or (conns and len(conns) + self._opening[kind] >= limit):
                conn = idle[0] if idle else min(conns, key=lambda c: self._busy.get(c, 0))
                self._busy[conn] = self._busy.get(conn, 0) + 1
                return conn
            self._opening[kind] += 1
        try:
            conn = _Connection(self.address, min(CONNECT_TIMEOUT, max(0.05, timeout)), self._token,
                               self._ssl, pipelined=kind == ORDERED)
        finally:
            with self._lock:
                self._opening[kind] -= 1
        with self._lock:
            if self._closed:
                conn.close()
                raise OSError("client closed")
            self._conns[kind].append(conn)
            self._busy[conn] = 1
        return conn

    def _release(self, conn: _Connection) -> None:
        with self._lock:
            left = self._busy.get(conn, 1) - 1
            if left > 0:
                self._busy[conn] = left
            else:
                self._busy.pop(conn, None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = [c for kind in self._conns.values() for c in kind]
            self._conns = {PRODUCE: [], FETCH: [], ORDERED: []}
        for c in conns:
            c.close()


def _failed(code: grpc.StatusCode, why: str) -> Future:
    fut: Future = Future()
    fut.set_exception(WireCallError(code, why))
    return fut
