"""How a node's gRPC server runs its handlers: on an asyncio server, waiting fetches parked.

The handlers (``MessageLogService``) are plain blocking functions: they wait
for raft commits, read segments, ask peers. gRPC's thread-pool server gave
each call a pool thread for its whole life, a long-polling ``Fetch``
included: 200 consumers polling with ``wait_ms=5000`` held the pool's 64
threads, and a produce queued behind them for up to 6 s (p99 6,014 ms).
Kafka parks a waiting fetch in its purgatory without a thread; so do we.

* The server is ``grpc.aio`` on one event-loop thread. Each call runs its
  handler in the node's worker pool (``run_in_executor``): the pool holds a
  call only while it computes, reads or waits for a commit.
* A ``Fetch`` at the end of its queue with ``wait_ms`` returns ``Parked``
  instead of waiting: a callback is registered with the queue's group state
  (``DataState.park``), which apply calls when the queue grows (or the
  queue goes away); the call then waits on an asyncio future, holding no
  thread, and runs the fetch once more when woken. A wait that ends with
  nothing new is answered on the loop itself (``Parked.nothing``).
* A node at its limit refuses new work at once with RESOURCE_EXHAUSTED
  naming the limit and ``rmq-retry-after-ms`` metadata (the client backs off
  and retries), instead of queueing it behind the calls in progress:
  ``max_requests`` handlers running or queued for the pool, ``max_parked``
  waiting fetches.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import grpc

from ..proto import rmq_pb2
from ..protocol.errors import RETRY_AFTER_METADATA_KEY, CallFailed  # noqa: F401  (also imported from here)
from ..protocol.placement import GRPC_OPTIONS, cluster_address
from ..protocol.tls import TlsFiles, server_credentials
from ..protocol.errors import ServiceError
from .guard import Undecodable, _decoder

__all__ = ["Parked", "AsyncServer", "CallFailed", "Limits", "SyncContext"]

log = logging.getLogger(__name__)
SERVICE = rmq_pb2.DESCRIPTOR.services_by_name["MessageLog"]
RETRY_AFTER_MS = "50"


@dataclass(frozen=True)
class Limits:
    """What one node takes on at once (``rmq-storage node --max-requests/--max-parked-fetches``)."""
    workers: int = 64              # pool threads running handlers
    max_requests: int = 512        # handlers running or waiting for a pool thread
    max_parked: int = 20_000       # long-polling fetches waiting for data


GRPC_PENDING_HARD_LIMIT = 3000     # gRPC's default grpc.server.max_pending_requests_hard_limit


@dataclass
class Parked:
    """A fetch waiting for data: ``park(wake)`` registers ``wake`` with the queue and
    returns a cancel function, or None when the data is already there. A wait that
    ends with nothing new is answered by ``nothing()`` on the event loop (a few
    attribute reads): 2,000 polls timing out together would otherwise queue 2,000
    reads for the pool ahead of the produces."""
    park: Callable[[Callable[[], None]], Callable[[], None] | None]
    timeout: float
    nothing: Callable[[], bytes]


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


class SyncContext:
    """The part of a servicer context the blocking handlers use (``guard._guard``):
    an abort becomes an exception the async side turns into the call's status."""

    def __init__(self):
        self.trailing: tuple = ()
        self.may_park = True        # a Fetch may answer Parked (once: then it reads what is there)
        self.credentials: tuple = (None, None)   # (authorization metadata, client certificate's CN)
        self.principal = None       # authz.Principal, on a secured node

    def set_trailing_metadata(self, md) -> None:
        self.trailing = tuple(md)

    def abort(self, code: grpc.StatusCode, details: str):
        raise _Abort(code, details)


class AsyncServer:
    """A node's gRPC server on its own event-loop thread; ``stop`` ends both."""

    def __init__(self, servicer, address: str, limits: Limits = Limits(), node_name: str = "",
                 tls: TlsFiles | None = None, tls_client_cert: bool = False, gate=None, metrics=None):
        """``gate``: a secured node's ``authz.Gate``, which every call passes before its
        handler runs (in the pool: a denial may wait for the metadata group);
        ``metrics``: the node's ``NodeMetrics`` (None: nothing counted)."""
        self.servicer, self.limits, self.name = servicer, limits, node_name or address
        self.metrics = metrics
        self.calls: dict = {}       # method -> its handler (gated), for invoke
        self.tls, self.tls_client_cert = tls, tls_client_cert
        self.gate = gate
        self.pool = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="grpc")
        self.running = 0            # touched on the loop thread only
        self.parked = 0
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-aio", daemon=True)
        self._thread.start()
        self.server = self._call(self._start(address))

    def _call(self, coro, timeout: float | None = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self, address: str):
        # Calls gRPC has taken off the wire but the loop has not picked up yet wait in
        # its core, which past 1,000 of them drops some at random (soft limit) and past
        # 3,000 all (hard limit), answering CANCELLED, not a status a client retries:
        # 2,000 polls re-sent at once by a crowd of consumers, while the loop thread
        # waits for the GIL, lost dozens so. Our own limits refuse with
        # RESOURCE_EXHAUSTED (``_run``, ``_wait``); the core holds up to as many calls
        # as those admit, and never fewer than its own hard limit (small limits of ours
        # must not make it drop sooner), so a burst they would take is not dropped first.
        pending = max(GRPC_PENDING_HARD_LIMIT, self.limits.max_requests + self.limits.max_parked)
        server = grpc.aio.server(options=GRPC_OPTIONS + [
            ("grpc.server.max_pending_requests", pending),
            ("grpc.server.max_pending_requests_hard_limit", pending)])
        handlers = {}
        for m in SERVICE.methods:
            request = getattr(rmq_pb2, m.input_type.name)
            response = getattr(rmq_pb2, m.output_type.name)
            handlers[m.name] = grpc.unary_unary_rpc_method_handler(
                self._handler(m.name, getattr(self.servicer, m.name)), request_deserializer=_decoder(request),
                # Fetch returns its response already encoded (fetch_wire); gRPC sends those bytes.
                response_serializer=bytes if m.name == "Fetch" else response.SerializeToString)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
        host, port = address.rsplit(":", 1)
        if self.tls is None:
            server.add_insecure_port(f"{host}:{port}")
        else:
            server.add_secure_port(f"{host}:{port}", server_credentials(self.tls, self.tls_client_cert))
            server.add_secure_port(cluster_address(address), server_credentials(self.tls, True))
        await server.start()
        return server

    def _gated(self, method: str, fn):
        """``fn`` behind the gate: the caller is authenticated and the call checked, in
        the pool (a denial may wait for the metadata group), once per call (not again
        when a parked fetch runs a second time)."""
        gate = self.gate

        def checked(request, ctx):
            if ctx.principal is None:
                try:
                    ctx.principal = gate.principal(*ctx.credentials)
                    if not isinstance(request, Undecodable):      # (answered INVALID_ARGUMENT)
                        gate.check_call(method, request, ctx.principal)
                except ServiceError as e:
                    raise _Abort(e.code, e.message) from None
            return fn(request, ctx)
        return checked

    def _handler(self, method: str, fn):
        gate = self.gate
        if gate is not None:
            fn = self._gated(method, fn)
        self.calls[method] = fn
        metrics = self.metrics

        async def handle(request, context):
            ctx = SyncContext()
            if gate is not None:
                ctx.credentials = _credentials(context)
            started, code = time.perf_counter(), "OK"
            try:
                return await self._complete(fn, request, ctx)
            except _Abort as e:
                code = e.code.name
                if ctx.trailing:
                    context.set_trailing_metadata(ctx.trailing)
                await context.abort(e.code, e.details)
            finally:
                if metrics is not None:
                    metrics.request(method, "grpc", code, time.perf_counter() - started)
        return handle

    async def _complete(self, fn, request, ctx: SyncContext):
        """Run a handler to its answer (a parked fetch waits on the loop); ``_Abort`` on failure."""
        result = await self._run(fn, request, ctx)
        if isinstance(result, Parked):
            if not await self._wait(result, ctx):
                return result.nothing()
            ctx.may_park = False
            result = await self._run(fn, request, ctx, again=True)
        return result

    async def invoke(self, method: str, request, credentials: tuple = (None, None)) -> tuple:
        """Call ``method`` as a gRPC call would be (same gate, limits, parking), for
        the HTTP port: (the response, the call's context); raises ``CallFailed``."""
        ctx = SyncContext()
        ctx.credentials = credentials
        try:
            return await self._complete(self.calls[method], request, ctx), ctx
        except _Abort as e:
            raise CallFailed(e.code, e.details, ctx.trailing) from None

    async def run_in_pool(self, fn, *args):
        """``fn(*args)`` in the worker pool, counted against ``--max-requests`` as a
        call is (the HTTP port's own work: /metrics, the status page, JSON); raises
        ``CallFailed`` RESOURCE_EXHAUSTED past the limit."""
        ctx = SyncContext()
        try:
            return await self._run(lambda _request, _ctx: fn(*args), None, ctx)
        except _Abort as e:
            raise CallFailed(e.code, e.details, ctx.trailing) from None

    def call_soon(self, coro):
        """Run ``coro`` on the server's loop (from another thread): its concurrent future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def _run(self, fn, request, ctx: SyncContext, again: bool = False):
        if self.running >= self.limits.max_requests and not again:
            ctx.trailing = ((RETRY_AFTER_METADATA_KEY, RETRY_AFTER_MS),)
            raise _Abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"node {self.name} is at its limit of {self.limits.max_requests} requests in "
                         f"progress (--max-requests); retry shortly")
        self.running += 1
        try:
            return await self.loop.run_in_executor(self.pool, fn, request, ctx)
        finally:
            self.running -= 1

    async def _wait(self, parked: Parked, ctx: SyncContext) -> bool:
        """Wait for the data; False when the wait ended with nothing new."""
        if self.parked >= self.limits.max_parked:
            ctx.trailing = ((RETRY_AFTER_METADATA_KEY, RETRY_AFTER_MS),)
            raise _Abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"node {self.name} is at its limit of {self.limits.max_parked} waiting fetches "
                         f"(--max-parked-fetches): fetch with a shorter wait_ms, or from another replica")
        # One future and one timer (not asyncio.wait_for's coroutine, second
        # future and callback): a crowd of waiting fetches is that many more
        # objects for the garbage collector to walk (bench/RESULTS.md).
        loop = self.loop
        woken = loop.create_future()

        def wake() -> None:             # called by apply on a raft thread
            loop.call_soon_threadsafe(_settle, woken, True)

        try:
            cancel = parked.park(wake)
        except Exception:               # not hosted here any more, ...: the fetch runs again and says so
            return True
        if cancel is None:              # the data came meanwhile
            return True
        self.parked += 1
        timer = loop.call_later(parked.timeout, _settle, woken, False)
        try:
            return await woken
        finally:
            timer.cancel()
            self.parked -= 1
            cancel()

    def stop(self, grace: float = 1.0) -> None:
        try:
            self._call(self.server.stop(grace), timeout=grace + 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
            self.pool.shutdown(wait=False, cancel_futures=True)


def _credentials(context) -> tuple[str | None, str | None]:
    """(the call's authorization metadata, its verified client certificate's common name)."""
    token = next((v for k, v in context.invocation_metadata() or () if k == "authorization"), None)
    names = context.auth_context().get("x509_common_name")
    return token, names[0].decode() if names else None


def _settle(fut: asyncio.Future, woken: bool) -> None:
    if not fut.done():
        fut.set_result(woken)
