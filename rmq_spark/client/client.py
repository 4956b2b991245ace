"""A thread-safe synchronous client for the rmq storage service.

It keeps one gRPC channel per node, a route cache (group -> leader address,
learned from not-leader replies and cluster status) and retries retriable
errors with exponential backoff until the call's deadline, so callers ride
through leader elections and node restarts (``_routing``: the one route
cache and backoff, for single RPCs and batched produce alike).

Produce calls to an explicit queue are idempotent by default: each thread
gets its own producer id and a per-queue sequence, so a retry after a lost
reply is applied once by the service.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from typing import Any, Iterable, Sequence

import grpc

from storage_service.proto import rmq_pb2, rmq_pb2_grpc
from storage_service.protocol import framing
from storage_service.protocol.buffers import reuse_big_buffers
from storage_service.protocol.fetch_wire import FetchReply, decode_fetch_response
from storage_service.protocol.localread import host_id, read_span
from storage_service.protocol.placement import GRPC_OPTIONS, group_of, produce_address
from storage_service.protocol.tls import TlsFiles, channel_credentials, client_context, wants_client_certificate

from ._admin import AdminCalls
from ._kv import KvCalls
from ._outcomes import outcomes, result
from ._messages import MessageLike, decode_records, plain_block, to_block, to_pb
from ._produce_sender import ProduceSender
from ._producer import Producer
from ._produce_wire import KV_METHODS, ProduceTransport
from ._routing import RetryClock, Routes
from ._security import SecurityCalls
from ._types import FetchResult, ProduceResult
from .errors import RmqError, TlsRefused, Unavailable, from_rpc_error

__all__ = ["Client", "parse_endpoints"]

log = logging.getLogger(__name__)
ATTEMPT_SLACK_S = 0.1       # a produce call waits this much past its attempt for a shared request
LOCAL_READ_TRIES = 3        # consecutive unreadable short-circuit spans before a client stops
FETCH_SERVICE = rmq_pb2.DESCRIPTOR.services_by_name["MessageLog"].full_name


def parse_endpoints(endpoints: str | Sequence[str]) -> list[str]:
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    out = [e.strip() for e in items if e and e.strip()]
    if not out:
        raise ValueError("endpoints is empty: give host:port[,host:port...] (or set RMQ_ENDPOINTS)")
    for e in out:
        host, _, port = e.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"endpoint {e!r} is not host:port")
        if not 1 <= int(port) <= 65535:
            raise ValueError(f"endpoint {e!r}: port {port} is out of range (1-65535)")
    return out


class Client(AdminCalls, SecurityCalls, KvCalls):
    def __init__(self, endpoints: str | Sequence[str], timeout: float = 30.0,
                 producer_id: str | None = None, attempt_timeout: float = 5.0,
                 produce_port: bool = True, tls: TlsFiles | None = None, token: str | None = None):
        """``produce_port``: ``produce_batches``, ``produce`` to a queue and (without TLS) fetches without a
        wait go over the nodes' produce ports (``storage_service.server.produce_port``;
        ~12% less CPU per message than gRPC in the produce benchmark; a fetch's
        batches sent from their file), falling back to gRPC for a node that does
        not serve one. ``tls``: the cluster's CA (and a client certificate, for
        nodes that require one); every call then goes over TLS, the produce port's too. ``token``: a bearer token
        (``rmq principal create``), sent with every call and in the produce port's hello."""
        self.endpoints = parse_endpoints(endpoints)
        self.tls = tls
        self.token = token
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._credentials = None if tls is None else channel_credentials(tls)
        self._ssl = None if tls is None else client_context(tls)
        self.produce_port = produce_port
        self._transports: dict[str, ProduceTransport] = {}     # node -> its produce port
        self._closed = False
        self.timeout = timeout
        self.attempt_timeout = attempt_timeout   # one node may hang (paused): try the next
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, rmq_pb2_grpc.MessageLogStub] = {}
        self._routes = Routes(self.endpoints)
        self._groups: int | None = None
        # topic -> (queues, data group of each queue) as its config records them
        self._placement: dict[str, tuple[int, tuple[int, ...]]] = {}
        self._lock = threading.Lock()
        self._client_id = producer_id or uuid.uuid4().hex[:16]
        self._local = threading.local()
        self._unreadable_spans = 0      # short-circuit reads whose file could not be read
        self._senders: dict[str, ProduceSender] = {}
        # Produce requests are hundreds of KiB: above glibc's mmap threshold each
        # serialization would fault in fresh pages (0.70 -> 0.09 ms for 800 KiB).
        reuse_big_buffers()

    # ------------------------------------------------------------ plumbing
    def _stub(self, address: str) -> rmq_pb2_grpc.MessageLogStub:
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                ch = self._channels[address] = (
                    grpc.insecure_channel(address, options=GRPC_OPTIONS) if self._credentials is None
                    else grpc.secure_channel(address, self._credentials, options=GRPC_OPTIONS))
                stub = self._stubs[address] = rmq_pb2_grpc.MessageLogStub(ch)
                # Fetch answers are parsed by fetchwire: the batches stay a view of
                # the received message instead of being copied into a FetchResponse.
                stub.Fetch = ch.unary_unary(f"/{FETCH_SERVICE}/Fetch",
                                            request_serializer=rmq_pb2.FetchRequest.SerializeToString,
                                            response_deserializer=decode_fetch_response,
                                            _registered_method=True)
        return stub

    def _transport(self, address: str) -> ProduceTransport:
        """The node's produce-port transport (``produce_port`` only)."""
        with self._lock:
            transport = self._transports.get(address)
        if transport is None:
            grpc_call = functools.partial(self._stub(address).ProduceBatches.future, metadata=self._metadata)
            made = ProduceTransport(produce_address(address), fallback=grpc_call, token=self.token,
                                    ssl_context=self._ssl)
            with self._lock:
                transport = made if self._closed else self._transports.setdefault(address, made)
            if transport is not made or self._closed:    # another thread made one first; or closed
                made.close()
        return transport

    def _sender(self, address: str) -> ProduceSender:
        with self._lock:
            sender = self._senders.get(address)
        if sender is None:
            call = (self._transport(address).future if self.produce_port and not self._closed else
                    functools.partial(self._stub(address).ProduceBatches.future, metadata=self._metadata))
            with self._lock:
                sender = self._senders.setdefault(address, ProduceSender(call))
        return sender

    def _invoke(self, address: str, method: str, request: Any, timeout: float, wire: bool = True) -> Any:
        """One attempt at one node; a failure comes back as the client's exception.

        A fetch that does not wait goes over the node's produce port when it can
        (``ProduceTransport.fetch``): a Spark task reading from another host
        spent most of its node's CPU in gRPC's framing of the bytes. A long poll
        stays on gRPC, which parks it without holding a connection of the port;
        so do a TLS client's fetches: the port's TLS is Python's ``ssl`` over
        memory buffers, and through it (span read and encrypted on the node,
        each record decrypted into the frame buffer) a 1 KiB read ran as fast as
        over gRPC with the same node CPU (``bench/fetch_transport.py``,
        ``bench/README.md``), so gRPC, with no code of ours, keeps them."""
        if (method == "Fetch" and wire and not request.wait_ms and self.produce_port and self._ssl is None
                and not self._closed):
            started = time.monotonic()
            try:
                reply = self._transport(address).fetch(request, timeout)
            except grpc.RpcError as e:               # the node is at a limit
                raise from_rpc_error(e, address) from e
            if reply is not None:
                return reply
            timeout = max(0.01, timeout - (time.monotonic() - started))
        elif method in KV_METHODS and self.produce_port and self._ssl is None and not self._closed:
            # Key-value calls too: gRPC's framing was most of a get's node CPU.
            started = time.monotonic()
            try:
                reply = self._transport(address).kv(method, request, timeout)
            except grpc.RpcError as e:
                raise from_rpc_error(e, address) from e
            if reply is not None:
                return reply
            timeout = max(0.01, timeout - (time.monotonic() - started))
        try:
            return getattr(self._stub(address), method)(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._refused(from_rpc_error(e, address), address) from e

    def _refused(self, err: RmqError, address: str) -> RmqError:
        """``err``, or ``TlsRefused`` when a TLS client without a certificate saw the
        connection closed by a node that requires one (gRPC says "Socket closed")."""
        if (type(err) is Unavailable and self.tls is not None and self.tls.cert is None
                and "Socket closed" in err.message and wants_client_certificate(address, self.tls)):
            return TlsRefused(f"TLS: node {address} requires a client certificate signed by the cluster's "
                              "CA (it runs with --tls-client-cert): give --tls-cert/--tls-key "
                              "(RMQ_TLS_CERT/RMQ_TLS_KEY; tlsCertFile/tlsKeyFile in Spark)", err.code)
        return err

    def call(self, method: str, request: Any, group: int | None = None,
             timeout: float | None = None, address: str | None = None, wire: bool = True) -> Any:
        """Send one RPC with retries (``_routing``); ``group`` routes to that group's
        leader, ``address`` pins the node. A not-leader answer naming the leader is
        retried there at once; other retriable errors try the next node, then back
        off; a non-retriable one is raised. ``wire=False``: a fetch over gRPC only."""
        clock = RetryClock(timeout or self.timeout)
        per_attempt = max(self.attempt_timeout, getattr(request, "wait_ms", 0) / 1000 + self.attempt_timeout)
        last: RmqError | None = None
        while True:
            for addr in [address] if address else self._routes.candidates(group):
                left = clock.left(per_attempt)
                if left <= 0:
                    break
                try:
                    return self._invoke(addr, method, request, left, wire)
                except RmqError as e:
                    err = e
                if not err.retriable:
                    raise err          # the node answered: its route stays
                leader = self._routes.learn(group, err, addr)
                if leader and leader != addr and not address:
                    try:
                        return self._invoke(leader, method, request, max(0.01, clock.left(per_attempt)), wire)
                    except RmqError as e:
                        err = e
                    if not err.retriable:
                        raise err
                    self._routes.learn(group, err, leader)
                last = err
            clock.pause(last or Unavailable(f"{method}: no node answered within the deadline"))

    def groups(self) -> int:
        if self._groups is None:
            self._groups = self.call("ClusterStatus", rmq_pb2.ClusterStatusRequest()).groups
        return self._groups

    def group_of(self, topic: str, queue: int) -> int:
        """The data group of a queue, as the topic's config records it (asked once
        per topic, and again when a queue past the known count is asked for)."""
        placed = self._placement.get(topic)
        if placed is None or queue >= placed[0]:
            self.describe_topic(topic)
            placed = self._placement[topic]
        return group_of(topic, queue, self.groups(), placed[1])

    def _note_placement(self, cfg: dict) -> dict:
        self._placement[cfg["name"]] = (cfg["queues"], tuple(cfg.get("queue_groups") or ()))
        return cfg

    # ------------------------------------------------------------- produce
    def _next_sequence(self, topic: str, queue: int, count: int) -> tuple[str, int]:
        loc = self._local
        if not hasattr(loc, "seqs"):
            loc.seqs = {}
            # Not the thread ident: Python reuses it once a thread ends, and a later
            # thread with the old ident but sequences from 0 would look like a retry.
            loc.pid = f"{self._client_id}-{uuid.uuid4().hex[:12]}"
        seq = loc.seqs.get((topic, queue), 0)
        loc.seqs[(topic, queue)] = seq + count
        return loc.pid, seq

    def produce(self, topic: str, messages: Iterable[MessageLike], queue: int | None = None,
                producer_id: str | None = None, sequence: int | None = None,
                timeout: float | None = None) -> list[ProduceResult]:
        """Append messages. With ``queue`` the call is one batch to that queue,
        idempotent across retries; without, the service spreads by key hash."""
        messages = list(messages)
        if queue is not None:
            if producer_id is None:
                producer_id, sequence = self._next_sequence(topic, queue, len(messages))
            return [self.produce_block(topic, queue, to_block(messages), len(messages),
                                       producer_id, sequence or 0, timeout)]
        req = rmq_pb2.ProduceRequest(topic=topic, queue=-1, messages=[to_pb(m) for m in messages])
        return [result(r) for r in self.call("Produce", req, timeout=timeout).results]

    def produce_block(self, topic: str, queue: int, block: bytes, count: int, producer_id: str,
                      sequence: int, timeout: float | None = None) -> ProduceResult:
        """Append an already encoded records block (``storage_service.protocol.records``)
        of ``count`` messages to ``queue``, as producer ``producer_id`` at ``sequence``.

        The service applies a (producer, queue) sequence once: a retry, in this
        call or a later one with the same identity, comes back ``duplicate``.
        For writers that number their own calls (the Spark sink's exactly-once).
        """
        req = rmq_pb2.ProduceRequest(topic=topic, queue=queue, records=block, count=count,
                                     producer_id=producer_id, sequence=sequence)
        # as a batch of produce_batches: over the produce port, sharing its requests with
        # other threads' batches to the node (a gRPC call cost ~0.8 ms of CPU and, with
        # 50 threads, most of a single-message produce's p99: issue 39.6)
        return self._send_batches([req], RetryClock(timeout or self.timeout))[0]

    def produce_batches(self, batches: Sequence[tuple], timeout: float | None = None) -> list[ProduceResult]:
        """Append several batches, each ``(topic, queue, messages)``, in one call per node.

        Each batch is what ``produce(topic, messages, queue=queue)`` sends (one
        records block, idempotent across retries) and gets one result, in the
        order given. ``(topic, queue, messages, producer_id, sequence)`` gives the
        batch's identity, as ``produce`` takes it: a retry in a later call with
        the same identity is applied once. Batches whose queues the same node leads travel in one RPC
        (as Kafka's producer sends one request per broker with a batch per
        partition), and batches of one raft group share its entries: the way to
        produce to many queues at once with few calls per message. Calls from
        several threads to one node share RPCs too (``ProduceSender``).
        """
        reqs = []
        for topic, queue, messages, *identity in batches:
            messages = list(messages)
            if identity:
                if len(identity) != 2:
                    raise ValueError(f"batch for {topic}/{queue}: give (topic, queue, messages) or "
                                     "(topic, queue, messages, producer_id, sequence)")
                pid, seq = identity
            else:
                pid, seq = self._next_sequence(topic, queue, len(messages))
            reqs.append(rmq_pb2.ProduceRequest(topic=topic, queue=queue, records=plain_block(messages),
                                               count=len(messages), producer_id=pid, sequence=seq))
        return self._send_batches(reqs, RetryClock(timeout or self.timeout))

    def producer(self, max_in_flight: int = 5, timeout: float | None = None) -> Producer:
        """A producer keeping up to ``max_in_flight`` requests in flight per node:
        ``send(topic, queue, messages)`` returns a ``Future`` of the batch's
        ``ProduceResult``; ``flush()`` waits for all; use it as a context manager.
        Each queue's batches are stored once and in the order sent, across retries,
        leader changes and node restarts (``_producer.py``). ``timeout``: how long a
        batch may take, retries included (the client's timeout by default)."""
        return Producer(self, max_in_flight, timeout)

    def _send_batches(self, reqs: list[rmq_pb2.ProduceRequest], clock: RetryClock) -> list[ProduceResult]:
        """Send each round's pending batches, one RPC per node (``ProduceSender``),
        until every batch has its result; a non-retriable outcome is raised."""
        groups = [self.group_of(r.topic, r.queue) for r in reqs]
        results: list = [None] * len(reqs)
        pending = list(range(len(reqs)))
        while pending:
            by_node: dict[str, list[int]] = {}
            for i in pending:
                by_node.setdefault(self._routes.target(groups[i]), []).append(i)
            left = max(0.01, clock.left(self.attempt_timeout))
            # (this attempt's own end: a request shared with other callers may run longer;
            # a little past it, so that alone the transport's deadline error comes first)
            until = time.monotonic() + left + ATTEMPT_SLACK_S
            calls = [(addr, idx, self._sender(addr).send([reqs[i] for i in idx], left))
                     for addr, idx in by_node.items()]
            pending, last, hinted = [], None, False
            for addr, idx, call in calls:
                for i, out in zip(idx, outcomes(call, addr, len(idx), max(0.0, until - time.monotonic()))):
                    if not isinstance(out, RmqError):
                        results[i] = out
                        continue
                    if not out.retriable:
                        raise out
                    hinted |= self._routes.learn(groups[i], out, addr) is not None
                    pending.append(i)
                    last = out
            if pending:
                clock.pause(last, sleep=not hinted)
        return results

    # --------------------------------------------------------------- fetch
    def fetch(self, topic: str, queue: int, offset: int, max_messages: int = 0,
              max_bytes: int = 0, wait_ms: int = 0, from_follower: bool = False,
              address: str | None = None, tags: str = "") -> FetchResult:
        """Records from ``offset`` on. ``tags="TagA || TagB"`` filters on the server;
        then ``records`` may be empty while ``next_offset`` advances."""
        req = rmq_pb2.FetchRequest(topic=topic, queue=queue, offset=offset, max_messages=max_messages,
                                   max_bytes=max_bytes, wait_ms=wait_ms, allow_follower=from_follower,
                                   tags=tags)
        group = None if from_follower else self.group_of(topic, queue)
        resp = self.call("Fetch", req, group=group, address=address,
                         timeout=self.timeout + wait_ms / 1000)
        try:
            recs = decode_records(topic, queue, resp.batches, offset, max_messages or None)
        except framing.CorruptBatch as e:
            resp = self._fetch_checked(req, group, address, wait_ms, e)
            recs = decode_records(topic, queue, resp.batches, offset, max_messages or None)
        capped = max_messages and len(recs) >= max_messages
        nxt = recs[-1].offset + 1 if capped else resp.next_offset
        return FetchResult(recs, nxt, resp.earliest, resp.latest, resp.served_by)

    def fetch_arrow(self, topic: str, queue: int, offset: int, end: int | None = None,
                    max_bytes: int = 0, wait_ms: int = 0, from_follower: bool = False,
                    address: str | None = None, tags: str = "", local: bool = False):
        """Fetch as one Arrow RecordBatch (schema ``arrow.ARROW_SCHEMA``) of offsets in [offset, end).

        Returns ``(batch, next_offset, earliest, latest)``; next_offset is where
        the following fetch starts (it may pass ``end``: the batch is trimmed).
        ``local``: when the serving node is on this host, read its segment file
        directly (``storage_service.protocol.localread``); anything amiss falls back to
        the bytes over the network.
        """
        from .arrow import batches_to_arrow

        # A client that cannot read the nodes' files (another container on the host,
        # permissions) stops asking after a few tries instead of paying two calls a fetch.
        local = local and not tags and self._unreadable_spans < LOCAL_READ_TRIES
        local_host = host_id() if local else ""
        req = rmq_pb2.FetchRequest(topic=topic, queue=queue, offset=offset, max_bytes=max_bytes,
                                   wait_ms=wait_ms, allow_follower=from_follower, tags=tags,
                                   local_host=local_host)
        group = None if from_follower else self.group_of(topic, queue)
        resp = self.call("Fetch", req, group=group, address=address,
                         timeout=self.timeout + wait_ms / 1000)
        if resp.local is not None:
            data = read_span(resp.local)
            self._unreadable_spans = 0 if data is not None else self._unreadable_spans + 1
            try:
                if data is not None:
                    rb = batches_to_arrow(data, topic, queue, offset, end,
                                          expect_next=resp.next_offset)
                    return rb, resp.next_offset, resp.earliest, resp.latest
            except framing.CorruptBatch as e:
                log.info("short-circuit read of %s/%d at %d: %s; fetching it instead",
                         topic, queue, offset, e)
            return self.fetch_arrow(topic, queue, offset, end, max_bytes, wait_ms, from_follower,
                                    address, tags, local=False)
        try:
            rb = batches_to_arrow(resp.batches, topic, queue, offset, end)
        except framing.CorruptBatch as e:
            resp = self._fetch_checked(req, group, address, wait_ms, e)
            rb = batches_to_arrow(resp.batches, topic, queue, offset, end)
        return rb, resp.next_offset, resp.earliest, resp.latest

    def _fetch_checked(self, req, group: int | None, address: str | None, wait_ms: int,
                       error: Exception) -> FetchReply:
        """A fetch again, over gRPC: the produce port sends batches from their file
        unchecked (``sendfile``); over gRPC the node CRC-checks what it reads and
        repairs a corrupt copy from a replica (``Repair``) before answering."""
        log.info("fetch of %s/%d at %d: %s; fetching it again over gRPC, checked by the node",
                 req.topic, req.queue, req.offset, error)
        return self.call("Fetch", req, group=group, address=address,
                         timeout=self.timeout + wait_ms / 1000, wire=False)

    def fetch_raw(self, topic: str, queue: int, offset: int, max_bytes: int = 0,
                  from_follower: bool = False) -> FetchReply:
        req = rmq_pb2.FetchRequest(topic=topic, queue=queue, offset=offset, max_bytes=max_bytes,
                                   allow_follower=from_follower)
        group = None if from_follower else self.group_of(topic, queue)
        return self.call("Fetch", req, group=group)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            transports, self._transports, self._senders = list(self._transports.values()), {}, {}
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()
            self._stubs.clear()
        for t in transports:
            t.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

