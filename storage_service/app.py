"""The composition root of a storage node's process: the node's servers wired together.

``serve(node)`` builds the gRPC server (``server/dispatch.AsyncServer`` running the
servicer, ``server/service.py``), the produce port (``server/produce_port.py``) with
Fetch and the key-value calls on it, and the HTTP port (``http/``: JSON API,
/metrics, status page), each refused or left off with a warning when its port is
another node's or cannot be bound. It sits above ``server/`` and ``http/`` so that
neither imports the other's wiring (issue 42: no import cycle, no import upward).
"""
from __future__ import annotations

import logging
import time

import grpc

from .proto import rmq_pb2
from .protocol.placement import http_address, produce_address, raft_address
from .protocol.tls import server_context
from .server.dispatch import AsyncServer, CallFailed, Limits
from .server.kv import kv_put_submit, kv_read
from .server.node import StorageNode
from .server.produce_port import ProduceWireServer
from .server.service import MAX_WAIT_MS, MessageLogService

__all__ = ["Servers", "serve"]

log = logging.getLogger(__name__)


class Servers:
    """A node's gRPC server, its produce port (``producewire``) and HTTP port, stopped together."""

    def __init__(self, grpc_server: AsyncServer, produce: ProduceWireServer | None, http=None):
        self.grpc = grpc_server
        self.produce = produce
        self.http = http

    def stop(self, grace: float = 1.0) -> None:
        t0 = time.monotonic()
        if self.produce is not None:
            self.produce.stop()
        t1 = time.monotonic()
        if self.http is not None:
            self.http.stop()
        t2 = time.monotonic()
        self.grpc.stop(grace=grace)
        log.info("stopping: servers closed in %.1f s (produce port %.1f, HTTP %.1f, gRPC %.1f)",
                 time.monotonic() - t0, t1 - t0, t2 - t1, time.monotonic() - t2)


def _produce_server(servicer, address: str, taken: set[str] = frozenset(),
                    ssl_context=None, gate=None, metrics=None, fetch=None,
                    unary: dict | None = None, deferred: dict | None = None) -> ProduceWireServer | None:
    """The produce port, or None (with a warning) when it is one of the cluster's
    other ports (``taken``: a cluster laid out by an older version with
    ``--port``, where it is the next node's gRPC port) or cannot be bound:
    clients then produce to this node over gRPC."""
    if address in taken:
        log.warning("produce port %s not served (another node's gRPC or raft port in this "
                    "cluster's layout): clients produce over gRPC", address)
        return None
    host, port = address.rsplit(":", 1)
    try:
        return ProduceWireServer(servicer.produce_batches, host, int(port), ssl_context=ssl_context, gate=gate,
                                 metrics=metrics, fetch=fetch, submit=servicer.submit_batches,
                                 finish=servicer.finish_batches, unary=unary,
                                 deferred=deferred)
    except OSError as e:
        log.warning("produce port %s not served (%s): clients produce over gRPC", address, e)
        return None


def _fetch_call(server: AsyncServer):
    """``Fetch`` for the produce port: run as a gRPC call is (``AsyncServer.invoke``:
    gate, limits, parking), waited for on the connection's thread."""
    def fetch(request: rmq_pb2.FetchRequest, credentials: tuple) -> bytes:
        call = server.call_soon(server.invoke("Fetch", request, credentials))
        try:                         # (bounded: a loop stopped meanwhile never answers)
            response, _ = call.result(MAX_WAIT_MS / 1000 + 60)
        except TimeoutError:
            call.cancel()
            raise CallFailed(grpc.StatusCode.UNAVAILABLE, "Fetch: the node is stopping") from None
        return response
    return fetch


def _http_server(server: AsyncServer, node: StorageNode, taken: set[str], ssl_context):
    """The HTTP port (gRPC port + 4), or None: off (``--no-http``), one of the cluster's
    other ports (a cluster laid out with 4 ports a node), or not bindable (warned)."""
    from .http.api import add_routes
    from .http.server import HttpServer
    from .metrics.state import StateCollector
    from .metrics.threads import ThreadCpu

    c = node.config
    if node.metrics is not None:
        node.metrics.register(StateCollector(node, c.metrics_max_queue_series, server))
        node.metrics.register(ThreadCpu())
    if not c.http:
        return None
    address = http_address(c.address)
    if address in taken:
        log.warning("HTTP port %s not served: it is another node's port in this cluster's layout "
                    "(laid out with 4 ports a node); metrics and the status page are off here", address)
        return None
    try:
        http = HttpServer(server, node, address, add_routes, ssl_context)
    except OSError as e:
        log.warning("HTTP port %s not served (%s): metrics, the JSON API and the status page are off "
                    "on this node", address, e)
        return None
    node.http_address = address
    return http


def serve(node: StorageNode, limits: Limits | None = None) -> Servers:
    c = node.config
    limits = limits or Limits(max_requests=c.max_requests, max_parked=c.max_parked_fetches)
    server = AsyncServer(MessageLogService(node), c.address, limits, tls=c.tls,
                         tls_client_cert=c.tls_client_cert, gate=node.gate, metrics=node.metrics)
    taken = set(c.addresses) | {raft_address(a) for a in c.addresses}
    ctx = None if c.tls is None else server_context(c.tls, c.tls_client_cert)
    produce = _produce_server(server.servicer, produce_address(c.address), taken, ctx,
                              gate=node.gate, metrics=node.metrics, fetch=_fetch_call(server),
                              unary={"KvRead": lambda r: kv_read(node, r)},
                              deferred={"KvPut": lambda r: kv_put_submit(node, r)})
    taken |= {produce_address(a) for a in c.addresses}
    http = _http_server(server, node, taken, ctx)
    node.ports_up = True
    return Servers(server, produce, http)
