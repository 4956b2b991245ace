"""The produce port: ``ProduceBatches`` over a plain TCP stream, without HTTP/2.

A Python gRPC unary call costs ~0.47 ms of server CPU and ~0.35 ms of client
CPU before its first byte, plus HTTP/2 framing and a hand-off to a pool
thread each way (``bench/grpc_call.py`` on the test VM). Without them the
batched produce benchmark spent ~12% less CPU per message (``bench/README.md``).
So a node also serves ``ProduceBatches`` on its *produce port* (gRPC port +
2, after its raft port: ``placement.produce_address``) as
length-prefixed frames over TCP, as Kafka and NATS carry their data paths.
The wire format is ``storage_service.protocol.produce_frames``; the messages
are exactly the ``.proto``'s ``ProduceBatchesRequest`` and
``ProduceBatchesResponse``, validated and submitted by the same code as the
gRPC method; only the transport differs. gRPC's ``ProduceBatches`` stays, and
the client falls back to it when the produce port does not answer.

The port serves ``Fetch`` too, for the same reason on the read path: Spark
tasks reading 400 MB of 1 KiB records through gRPC cost the nodes 0.72-0.80
CPU s, against 0.2 when the tasks read the segment files themselves
(``bench/README.md``). A fetch on the port runs as a gRPC
``Fetch`` does (``AsyncServer.invoke``: the same gate and ``--max-requests``
limit); the connection's thread waits for its answer, so a long poll
(``wait_ms``) holds that thread and connection for its wait. Clients send
long polls over gRPC, which parks them without a thread. On a plaintext
connection the batches go from the segment file to the socket with
``os.sendfile``, as Kafka serves its fetches: the node asks the fetch where
they are (a local span, as for a reader on its own host) and copies nothing
through Python. The node then does not CRC-check them; the client does (it
always did), and asks again over gRPC, where the node checks and heals what
it reads, when they are corrupt (``Client.fetch_arrow``).

A node takes at most ``MAX_CONNECTIONS`` at once (more are answered
RESOURCE_EXHAUSTED and closed) and closes one that sends nothing for
``IDLE_SECONDS``.
"""
from __future__ import annotations

import functools
import logging
import os
import queue
import socket
import ssl
import threading
import time
from typing import Callable

import grpc
from google.protobuf.message import DecodeError

from ..metrics.threads import note_thread_exit
from ..proto import rmq_pb2
from ..protocol.produce_frames import (FLAG_PIPELINED, FLAG_TOKEN, HELLO, MAX_FRAME, MAX_TOKEN, METHOD_FETCH,
                                       METHOD_KV_PUT, METHOD_KV_READ, METHOD_PRODUCE_BATCHES, TOKEN_LEN, FrameReader, PeerClosed,
                                       WireProtocolError, check_hello, error_frame, frame_head, hello)
from ..protocol.errors import status_code
from ..protocol.fetch_wire import decode_fetch_response, encode_fetch_head
from ..protocol.localread import host_id
from ..protocol.tls import TlsSocket, common_name
from ..protocol.errors import ServiceError

__all__ = ["IDLE_SECONDS", "MAX_CONNECTIONS", "ProduceWireServer", "recv_exact", "send_frame"]

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256       # per node; gRPC's pool has 64 workers
IDLE_SECONDS = 120.0        # a connection with no frame for this long is closed (clients: 30 s)
METHOD_NAMES = {METHOD_PRODUCE_BATCHES: "ProduceBatches", METHOD_FETCH: "Fetch", METHOD_KV_PUT: "KvPut",
                METHOD_KV_READ: "KvRead"}
UNARY_REQUESTS = {METHOD_KV_PUT: rmq_pb2.KvPutRequest, METHOD_KV_READ: rmq_pb2.KvReadRequest}
HANDSHAKE_SECONDS = 10.0    # TLS: a peer that does not finish its handshake gives its slot back
MAX_PIPELINED = 32          # submitted requests in flight per connection before its reader waits


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """``n`` bytes from ``sock``; WireProtocolError on EOF before them.

    The buffer grows with what arrives (doubling from 1 MiB), so a peer that
    announces a big frame and sends little costs little memory.
    """
    buf = bytearray(min(n, 1 << 20))
    got = 0
    while got < n:
        if got == len(buf):
            buf += bytes(min(len(buf), n - len(buf)))
        k = sock.recv_into(memoryview(buf)[got:])
        if not k:
            raise (PeerClosed if not got else WireProtocolError)(
                f"connection closed after {got} of {n} bytes")
        got += k
    return buf


def send_frame(sock: socket.socket, request_id: int, code: int, body: bytes) -> None:
    """One frame, header and body in one ``sendmsg`` (no concatenation of a big body;
    a ``TlsSocket`` encrypts both parts in one go)."""
    head = frame_head(request_id, code, len(body))
    sent = sock.sendmsg([head, body])
    if sent < len(head):
        sock.sendall(head[sent:])
        sent = len(head)
    if sent - len(head) < len(body):
        sock.sendall(memoryview(body)[sent - len(head):])


class ProduceWireServer:
    """Serves ``ProduceBatches`` and ``Fetch`` frames on one TCP port, a thread per connection.

    ``handle(request) -> response`` is the servicer's ProduceBatches (it raises
    ``ServiceError`` for a request that fails as a whole). On a connection
    that does not pipeline, its thread blocks in ``handle`` while its batches
    commit, as a gRPC worker thread does; requests of other connections run
    meanwhile. Pipelined produce requests and KvPuts are submitted by the
    connection's thread and answered by its answer thread (``_Answers``).
    ``fetch(request, credentials) -> bytes`` answers a ``FetchRequest`` with the
    encoded ``FetchResponse`` and raises ``CallFailed`` (None: the port answers
    Fetch UNIMPLEMENTED and clients fetch over gRPC).
    """

    def __init__(self, handle: Callable[[rmq_pb2.ProduceBatchesRequest], rmq_pb2.ProduceBatchesResponse],
                 host: str, port: int, max_frame: int = MAX_FRAME,
                 max_connections: int = MAX_CONNECTIONS, ssl_context=None, gate=None, metrics=None,
                 fetch: Callable[[rmq_pb2.FetchRequest, tuple], bytes] | None = None,
                 submit: Callable[[rmq_pb2.ProduceBatchesRequest], list] | None = None,
                 finish: Callable[[rmq_pb2.ProduceBatchesRequest, list], rmq_pb2.ProduceBatchesResponse]
                 | None = None, unary: dict | None = None, deferred: dict | None = None):
        """``gate``: a secured node's ``authz.Gate``: a connection is authenticated by
        the token in its hello (or its client certificate) and each request checked
        as gRPC's ``ProduceBatches`` is (a fetch is checked by ``fetch`` itself).
        ``submit``/``finish``: ``handle`` in two steps (the servicer's
        ``submit_batches``/``finish_batches``): a connection then keeps reading while
        its requests commit (``_Answers``). ``unary``: method name -> ``fn(request)``
        answering KvPut and KvRead on the connection's thread (``server/kv.py``), each
        request checked by ``gate`` as its gRPC call is. ``deferred``: method name ->
        ``fn(request)`` that submits the call and returns the wait for its answer
        (``kv.kv_put_submit``): served so instead of by ``unary``, the connection's
        reader goes on reading while the call commits, so one connection carries
        several puts at once (from a client's threads) and they can share raft
        entries (``_Answers`` sends the answers)."""
        self._handle = handle
        self._unary = unary or {}
        self._deferred = {m: deferred[n] for m, n in METHOD_NAMES.items() if n in (deferred or {})}
        self._submit, self._finish = (submit, finish) if submit and finish else (None, None)
        self._fetch = fetch
        self._gate = gate
        self._metrics = metrics              # the node's NodeMetrics, or None
        self._ssl = ssl_context              # TLS: each connection's handshake on its own thread
        self.max_frame = max_frame
        self.max_connections = max_connections
        self._sock = socket.create_server((host, port), backlog=128)
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._accept, name="produce-wire", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return                       # closed by stop()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._stopping:
                    conn.close()
                    return
                full = len(self._conns) >= self.max_connections
                if not full:
                    self._conns.add(conn)
            if full:
                if self._ssl is None:            # (a plaintext frame means nothing to a TLS client)
                    _try_send_error(conn, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    f"{self.max_connections} produce connections open; the limit is "
                                    f"{self.max_connections}: retry later or over gRPC")
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="produce-wire-conn",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        plain = conn
        answers = None
        try:
            conn.settimeout(IDLE_SECONDS)    # a peer gone silent (crashed host) frees its slot
            if self._ssl is not None:
                conn.settimeout(HANDSHAKE_SECONDS)
                conn = TlsSocket(conn, self._ssl)     # big raw reads, records decrypted from memory
                conn.settimeout(IDLE_SECONDS)
            answers = _Answers(self, conn)           # (answers go out through TLS too)
            flags = check_hello(recv_exact(conn, HELLO.size))
            token = None
            if flags & FLAG_TOKEN:
                n = TOKEN_LEN.unpack(recv_exact(conn, TOKEN_LEN.size))[0]
                if n > MAX_TOKEN:
                    raise WireProtocolError(f"a token of {n} bytes; at most {MAX_TOKEN}")
                token = "Bearer " + bytes(recv_exact(conn, n)).decode("utf-8", "replace")
            credentials = None
            if self._gate is not None:
                cert = conn.getpeercert() if isinstance(conn, TlsSocket) else None
                credentials = (token, common_name(cert))
                try:                         # a bad token: refused before the node's hello
                    self._gate.principal(*credentials)
                except ServiceError as e:
                    _try_send_error(conn, e.code, e.message)
                    return
            conn.sendall(hello())
            # (a connection that sends one request at a time keeps one thread: no hand-off)
            pipelined = bool(flags & FLAG_PIPELINED) and self._submit is not None
            frames = FrameReader(self.max_frame)
            while True:
                n = conn.recv_into(frames.want())        # straight into the frame's buffer
                if not n:
                    raise (WireProtocolError if frames.buffered else PeerClosed)(
                        f"connection closed with {frames.buffered} bytes of a frame read")
                frame = frames.got(n)
                if frame is None:
                    continue
                started = time.perf_counter()
                if frame.code == METHOD_PRODUCE_BATCHES and pipelined:
                    code, reply = self._pipelined(frame, credentials, started, answers)
                    if reply is None:
                        continue                         # submitted: answered when committed
                elif frame.code in self._deferred:
                    code, reply = self._submit_unary(frame, credentials, started, answers)
                    if reply is None:
                        continue                         # submitted: answered when committed
                else:
                    code, reply = self._answer(frame.code, frame.body, credentials)
                self._count(frame.code, code, started)
                with answers.lock:
                    if isinstance(reply, _FileReply):
                        reply.send(conn, frame.request_id)
                    else:
                        send_frame(conn, frame.request_id, code, reply)
        except PeerClosed:
            pass                             # the client closed between frames
        except WireProtocolError as e:
            log.warning("produce stream from %s: %s; closing it", _peer(conn), e)
            if answers is None:
                _try_send_error(conn, e.code, str(e))
            else:
                with answers.lock:           # (not inside an answer frame its answer thread is sending)
                    _try_send_error(conn, e.code, str(e))
        except ssl.SSLError as e:            # a plaintext client, or a certificate refused
            log.info("produce stream from %s: TLS handshake failed (%s); closing it", _peer(plain),
                     e.reason or e)
        except OSError:
            pass                             # the client went away, or idle past IDLE_SECONDS
        finally:
            if answers is not None:
                answers.close()              # what is in flight is still answered, if it can be
            with self._lock:
                self._conns.discard(plain)
            conn.close()
            note_thread_exit()

    def _count(self, method: int, code: int, started: float) -> None:
        if self._metrics is not None and method in METHOD_NAMES:
            self._metrics.request(METHOD_NAMES[method], "produce_port", status_code(code).name,
                                  time.perf_counter() - started)

    def _pipelined(self, frame, credentials, started: float, answers: "_Answers") -> tuple[int, bytes | None]:
        """Submit a ProduceBatches frame and leave its answer to ``answers``: (0, None); or
        the error to answer now."""
        request, error = self._produce_request(frame.body, credentials)
        if error is not None:
            return error
        try:
            submitted = self._submit(request)
        except ServiceError as e:
            return _error(e.code, e.message)
        except Exception:
            log.exception("ProduceBatches over the produce stream failed")
            return _error(grpc.StatusCode.INTERNAL, "ProduceBatches: internal error (see node log)")
        answers.put(frame.request_id, METHOD_PRODUCE_BATCHES, functools.partial(self._finish, request, submitted),
                    started)
        return 0, None

    def _submit_unary(self, frame, credentials, started: float, answers: "_Answers") -> tuple[int, bytes | None]:
        """A ``deferred`` call (a KvPut): checked and submitted here, its answer left to
        ``answers``: (0, None); or the error to answer now (bad input, not allowed, not
        the leader, at a limit: nothing was submitted)."""
        code, answer = self._call_unary(frame.code, frame.body, credentials, self._deferred[frame.code])
        if code:
            return code, answer
        answers.put(frame.request_id, frame.code, answer, started)
        return 0, None

    def _call_unary(self, method: int, body: bytearray, credentials, fn) -> tuple[int, object]:
        """``(0, fn(request))`` for a key-value frame, decoded and checked by the gate as
        its gRPC call is; or ``(code, message)``, the error to answer."""
        name = METHOD_NAMES[method]
        try:
            request = UNARY_REQUESTS[method].FromString(body)
        except DecodeError as e:
            return _error(grpc.StatusCode.INVALID_ARGUMENT, f"body is not a {name}Request: {e}")
        try:
            if self._gate is not None:
                self._gate.check_call(name, request, self._gate.principal(*credentials))
            return 0, fn(request)
        except ServiceError as e:
            return _error(e.code, e.message)
        except Exception:
            log.exception("%s over the produce stream failed", name)
            return _error(grpc.StatusCode.INTERNAL, f"{name}: internal error (see node log)")

    def _produce_request(self, body: bytearray, credentials):
        """(the ProduceBatchesRequest, None), or (None, the error to answer)."""
        try:
            request = rmq_pb2.ProduceBatchesRequest.FromString(body)   # parses the bytearray as is
        except DecodeError as e:
            return None, _error(grpc.StatusCode.INVALID_ARGUMENT, f"body is not a ProduceBatchesRequest: {e}")
        if self._gate is not None:
            try:
                # every frame: a token rotated, deleted or expired since the hello ends here
                self._gate.check_call("ProduceBatches", request, self._gate.principal(*credentials))
            except ServiceError as e:
                return None, _error(e.code, e.message)
        return request, None

    def _answer(self, method: int, body: bytearray, credentials=None) -> tuple[int, bytes]:
        if method == METHOD_FETCH and self._fetch is not None:
            return self._answer_fetch(body, credentials)
        if method in UNARY_REQUESTS and METHOD_NAMES[method] in self._unary:
            return self._answer_unary(method, body, credentials)
        if method != METHOD_PRODUCE_BATCHES:
            served = {m: n for m, n in METHOD_NAMES.items()
                      if (m != METHOD_FETCH or self._fetch is not None)
                      and (m not in UNARY_REQUESTS or n in self._unary or m in self._deferred)}
            return _error(grpc.StatusCode.UNIMPLEMENTED,
                          f"method {method}: the produce stream serves "
                          + ", ".join(f"{m} ({n})" for m, n in sorted(served.items())))
        request, error = self._produce_request(body, credentials)
        if error is not None:
            return error
        try:
            return 0, self._handle(request).SerializeToString()
        except ServiceError as e:
            return _error(e.code, e.message)
        except Exception:
            log.exception("ProduceBatches over the produce stream failed")
            return _error(grpc.StatusCode.INTERNAL, "ProduceBatches: internal error (see node log)")

    def _answer_unary(self, method: int, body: bytearray, credentials) -> tuple[int, bytes]:
        """A key-value call, answered here as the servicer answers it over gRPC: a
        gRPC worker would block in it just the same (a put waits for its commit)."""
        code, out = self._call_unary(method, body, credentials, self._unary[METHOD_NAMES[method]])
        return (code, out) if code else (0, out.SerializeToString())

    def _answer_fetch(self, body: bytearray, credentials) -> tuple[int, bytes]:
        from .dispatch import CallFailed

        try:
            request = rmq_pb2.FetchRequest.FromString(body)
        except DecodeError as e:
            return _error(grpc.StatusCode.INVALID_ARGUMENT, f"body is not a FetchRequest: {e}")
        try:
            if self._ssl is None and not (request.local_host or request.tags or request.max_messages):
                located = rmq_pb2.FetchRequest()
                located.CopyFrom(request)
                located.local_host = host_id()       # where the batches are, not the batches
                reply = self._fetch(located, credentials or (None, None))
                file_reply = _FileReply.of(reply)
                if file_reply is not None:
                    return 0, file_reply
                if decode_fetch_response(reply).local is None:
                    return 0, reply                  # nothing to read (or no log here): as asked
            return 0, self._fetch(request, credentials or (None, None))
        except CallFailed as e:
            return _error(e.code, e.details)
        except Exception:
            log.exception("Fetch over the produce stream failed")
            return _error(grpc.StatusCode.INTERNAL, "Fetch: internal error (see node log)")

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            conns = list(self._conns)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)


class _Answers:
    """A connection's submitted requests in flight (pipelined produce requests, key-value
    puts), answered in the order they came by a thread of the connection's own while
    its reader goes on reading.

    Requests of one connection are submitted in the order they arrive, so a
    producer's batches to one queue enter their group's raft log in order (a
    client keeps a node's pipelined requests on one connection). At most
    ``MAX_PIPELINED`` wait here; past that the reader waits too, and TCP tells the
    client to stop. Both threads send under ``lock``.
    """

    def __init__(self, server: ProduceWireServer, conn):
        self._server, self._conn = server, conn
        self.lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(MAX_PIPELINED)
        self._thread: threading.Thread | None = None

    def put(self, request_id: int, method: int, answer: Callable[[], object], started: float) -> None:
        """``answer()``: the response message once committed (or it raises ServiceError)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="produce-wire-answers", daemon=True)
            self._thread.start()
        self._queue.put((request_id, method, answer, started))

    def _run(self) -> None:
        srv, sending = self._server, True
        while True:
            item = self._queue.get()
            if item is None:
                note_thread_exit()
                return
            request_id, method, answer, started = item
            try:
                code, body = 0, answer().SerializeToString()
            except ServiceError as e:
                code, body = _error(e.code, e.message)
            except Exception:
                log.exception("%s over the produce stream failed", METHOD_NAMES[method])
                code, body = _error(grpc.StatusCode.INTERNAL, f"{METHOD_NAMES[method]}: internal error (see node log)")
            srv._count(method, code, started)
            if sending:
                try:
                    with self.lock:
                        send_frame(self._conn, request_id, code, body)
                except OSError:
                    sending = False          # the client went away: the rest still finish, unsent

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)


class _FileReply:
    """A FetchResponse whose batches are sent from their segment file (``os.sendfile``)."""

    def __init__(self, head: bytes, fd: int, position: int, length: int):
        self.head, self.fd, self.position, self.length = head, fd, position, length

    @classmethod
    def of(cls, reply: bytes) -> "_FileReply | None":
        """The reply for a fetch answered with a local span; None when the span's file
        is gone or is another file now (a segment removed or rewritten since): the
        caller reads the batches instead."""
        r = decode_fetch_response(reply)
        span = r.local
        if span is None:
            return None
        try:
            fd = os.open(span.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        st = os.fstat(fd)
        if (st.st_ino, st.st_dev) != (span.inode, span.device) or st.st_size < span.position + span.length:
            os.close(fd)
            return None
        head = encode_fetch_head(span.length, r.next_offset, r.earliest, r.latest, r.served_by)
        return cls(head, fd, span.position, span.length)

    def send(self, conn: socket.socket, request_id: int) -> None:
        """The frame: head and fields, then the file's bytes (``socket.sendfile``: the
        connection's timeout holds). A file that ends early (truncated meanwhile)
        leaves a frame that cannot be finished: the connection is closed (OSError),
        its client fails what it had in flight there and asks over gRPC."""
        with os.fdopen(self.fd, "rb") as f:
            conn.sendall(frame_head(request_id, 0, len(self.head) + self.length) + self.head)
            sent = conn.sendfile(f, self.position, self.length)
            if sent < self.length:
                log.warning("produce stream to %s: segment file ended %d bytes early; closing it",
                            _peer(conn), self.length - sent)
                raise OSError("segment file ended early")


def _error(code: grpc.StatusCode, message: str) -> tuple[int, bytes]:
    return code.value[0], message.encode()


def _try_send_error(conn: socket.socket, code: grpc.StatusCode, message: str) -> None:
    try:
        head, body = error_frame(code, message)
        conn.sendall(head + body)
    except OSError:
        pass


def _peer(conn: socket.socket) -> str:
    try:
        host, port = conn.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"
