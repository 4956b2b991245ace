"""A node's HTTP port (gRPC port + 4): the JSON API, ``/metrics`` and the status page.

It runs on the gRPC server's event loop (``dispatch.AsyncServer``), and every
API call goes through ``AsyncServer.invoke``: the same handlers, validation,
gate (authentication and ACLs, under the gRPC method's name), limits
(``--max-requests``: 429) and parked long polls as a gRPC call. So the HTTP
API cannot do what gRPC would refuse, and errors are gRPC's, as JSON:

    {"error": {"code": "NOT_FOUND", "http_status": 404, "message": "...", "field": "..."}}

with the HTTP status of the gRPC code (``convert.HTTP_STATUS``); ``field``
when the HTTP layer refused a part of the request before calling. A call a
follower cannot answer (the gRPC error names the leader) is redirected (307,
method and body kept: ``curl -L``) to the same path on the leader's HTTP port.
With TLS the port serves HTTPS with the node's certificate (a client
certificate is asked for, not required); credentials: ``Authorization:
Bearer TOKEN``, or a client certificate, as on gRPC.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
import weakref

import grpc
from aiohttp import web

from ..protocol.errors import LEADER_METADATA_KEY, RETRY_AFTER_METADATA_KEY, CallFailed, ServiceError
from ..protocol.placement import http_address
from ..protocol.tls import common_name
from .convert import HTTP_STATUS, BadRequest

__all__ = ["HttpServer", "MAX_BODY", "MAX_CONNECTIONS"]

log = logging.getLogger(__name__)
MAX_BODY = 64 << 20          # a produce body (base64 makes binary a third bigger)
MAX_CONNECTIONS = 512        # open HTTP connections per node; past it a new one gets 429 and is closed
KEEPALIVE_SECONDS = 15.0     # an idle keep-alive connection is closed after this
HANDSHAKE_SECONDS = 10.0     # HTTPS: a peer that does not finish its handshake is dropped


class HttpServer:
    """Serves the routes ``add_routes(self)`` adds (``api.add_routes``, given by the process's
    wiring, ``storage_service/app.py``) on ``address``; ``stop`` ends it (before the gRPC
    loop stops)."""

    def __init__(self, rpc, node, address: str, add_routes, ssl_context=None):
        self.rpc, self.node, self.address = rpc, node, address
        self.scheme = "https" if ssl_context is not None else "http"
        self.app = web.Application(client_max_size=MAX_BODY, middlewares=[self._answer])
        add_routes(self)
        # shutdown: requests in flight get 1 s (a long poll is answered by the node stopping)
        # keep-alive: an idle connection closes after KEEPALIVE_SECONDS (it holds a slot of
        # MAX_CONNECTIONS)
        self.runner = web.AppRunner(self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0,
                                    keepalive_timeout=KEEPALIVE_SECONDS)
        host, port = address.rsplit(":", 1)
        rpc.call_soon(self._start(host, int(port), ssl_context)).result(30)

    async def _start(self, host: str, port: int, ssl_context) -> None:
        await self.runner.setup()
        site = _LimitedSite(self.runner, host, port, ssl_context=ssl_context, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await self.runner.cleanup()
            raise

    def stop(self) -> None:
        try:
            self.rpc.call_soon(self.runner.cleanup()).result(10)
        except Exception as e:           # the loop is going anyway
            log.warning("HTTP port %s did not stop cleanly: %s", self.address, e)

    # ------------------------------------------------------------ requests
    @staticmethod
    def credentials(request: web.Request) -> tuple[str | None, str | None]:
        cert = request.transport.get_extra_info("peercert") if request.transport else None
        return request.headers.get("Authorization"), common_name(cert)

    async def call(self, request: web.Request, method: str, message):
        """``method`` as gRPC would run it, for this HTTP request's caller: its response."""
        resp, _ = await self.rpc.invoke(method, message, self.credentials(request))
        return resp

    async def in_pool(self, request: web.Request, what: str, fn, *args):
        """``fn(may_describe, *args)`` in the node's pool (within ``--max-requests``), after
        the gate allowed ``what`` (authz.POLICY); ``may_describe(resource type, name)``
        says what the caller may see (always True on a node without ACLs)."""
        gate = self.node.gate
        creds = self.credentials(request)

        def run():
            may = _everything
            if gate is not None:
                p = gate.principal(*creds)
                gate.check_call(what, None, p)
                if gate.config.authorize:
                    may = functools.partial(gate.allowed, p, "describe")   # (rtype, name) -> bool
            return fn(may, *args)
        try:
            return await self.rpc.run_in_pool(run)
        except ServiceError as e:
            raise CallFailed(e.code, e.message, e.trailing_metadata()) from None

    async def offload(self, fn, *args):
        """``fn(*args)`` in the pool: JSON work on big bodies must not stall the loop, which
        serves every gRPC call of the node too."""
        return await self.rpc.run_in_pool(fn, *args)

    @web.middleware
    async def _answer(self, request: web.Request, handler):
        started, code = time.perf_counter(), "OK"
        route = request.match_info.route
        method = route.name or "unknown"
        try:
            return await handler(request)
        except CallFailed as e:
            code = e.code.name
            return self._failed(request, e)
        except BadRequest as e:
            code = "INVALID_ARGUMENT"
            return error_response(grpc.StatusCode.INVALID_ARGUMENT, str(e), status=e.status, field=e.field)
        except web.HTTPException as e:       # no such route, method not allowed, body too big
            if e.status < 400:
                raise
            code = {404: "NOT_FOUND", 405: "UNIMPLEMENTED"}.get(e.status, "INVALID_ARGUMENT")
            if e.status == 413:
                code = "RESOURCE_EXHAUSTED"
                message = f"the body is larger than {MAX_BODY} bytes, the limit of one HTTP request"
            elif e.status == 404:
                message = f"no such path: {request.path} (see the README's HTTP API)"
            elif e.status == 405:
                message = f"{request.method} is not allowed on {request.path}"
            else:
                message = e.text or e.reason
            return error_response(None, message, status=e.status, code_name=code)
        except Exception:
            code = "INTERNAL"
            log.exception("HTTP %s %s failed", request.method, request.path)
            return error_response(grpc.StatusCode.INTERNAL, f"{request.method} {request.path}: internal "
                                                            "error (see node log)")
        finally:
            metrics = self.node.metrics
            if metrics is not None:
                metrics.request(method, "http", code, time.perf_counter() - started)

    def _failed(self, request: web.Request, e: CallFailed) -> web.Response:
        leader = e.trailing.get(LEADER_METADATA_KEY)
        if e.code == grpc.StatusCode.UNAVAILABLE and leader:
            where = f"{self.scheme}://{http_address(leader)}{request.path_qs}"
            resp = error_response(e.code, e.details, status=307, leader=leader, location=where)
            resp.headers["Location"] = where
            return resp
        resp = error_response(e.code, e.details)
        retry_ms = e.trailing.get(RETRY_AFTER_METADATA_KEY)
        if retry_ms:
            resp.headers["Retry-After"] = str(max(1, math.ceil(int(retry_ms) / 1000)))
        return resp


class _LimitedSite(web.TCPSite):
    """aiohttp's TCP site, at most ``MAX_CONNECTIONS`` connections open: a connection
    past it is answered 429 RESOURCE_EXHAUSTED naming the limit and closed (each one
    holds a descriptor the node's segments and raft connections need too)."""

    open = 0                     # connections accepted and not yet lost (TLS handshakes included)

    async def start(self) -> None:
        await web.BaseSite.start(self)
        handler = self._runner.server
        loop = asyncio.get_running_loop()
        tls = self._ssl_context is not None

        def connection():
            # counted here, at accept: aiohttp registers a connection only once its
            # transport is made (after a TLS handshake; a burst of accepts comes first)
            if self.open >= MAX_CONNECTIONS:
                return _Refused()
            self.open += 1
            counted = _Counted(handler(), self)
            if tls:      # (weakly: the collector may free it, and its slot, sooner)
                loop.call_later(HANDSHAKE_SECONDS + 1.0, _unmade, weakref.ref(counted))
            return counted
        self._server = await loop.create_server(
            connection, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address,
            ssl_handshake_timeout=HANDSHAKE_SECONDS if self._ssl_context is not None else None)


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, which gives its slot back when lost, or
    when its TLS handshake never completed: asyncio never tells the protocol of a
    connection whose handshake failed, it only lets go of it. The handshake ends by
    ``HANDSHAKE_SECONDS`` (asyncio's timeout), so a connection not made a second
    after that gives its slot back (``unmade``), or sooner, when the garbage
    collector frees the protocol (the failed handshake leaves it in a reference
    cycle, which only the collector frees, when it gets to it)."""
    __slots__ = ("inner", "site", "_slot", "_made", "__weakref__")

    def __init__(self, inner, site: _LimitedSite):
        self.inner, self.site = inner, site
        self._slot = slot = [True]         # held
        self._made = False
        weakref.finalize(self, _release, site, slot)

    def unmade(self) -> None:
        if not self._made:
            _release(self.site, self._slot)

    def connection_made(self, transport) -> None:
        self._made = True
        if not self._slot[0]:              # (made after all: counted again)
            self._slot[0] = True
            self.site.open += 1
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc) -> None:
        _release(self.site, self._slot)
        self.inner.connection_lost(exc)


def _unmade(ref: weakref.ref) -> None:
    counted = ref()
    if counted is not None:
        counted.unmade()


def _release(site: _LimitedSite, slot: list) -> None:
    if slot[0]:
        slot[0] = False
        site.open -= 1


class _Refused(asyncio.Protocol):
    BODY = json.dumps({"error": {"code": "RESOURCE_EXHAUSTED", "http_status": 429, "message":
                                 f"this node has {MAX_CONNECTIONS} HTTP connections open, its limit: "
                                 "retry shortly, or reuse a connection"}}).encode()

    def connection_made(self, transport) -> None:
        transport.write(b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                        b"Retry-After: 1\r\nConnection: close\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(self.BODY), self.BODY))
        transport.close()


def error_response(code: grpc.StatusCode | None, message: str, status: int | None = None,
                   code_name: str | None = None, **extra) -> web.Response:
    status = status or HTTP_STATUS.get(code, 500)
    body = {"code": code_name or code.name, "http_status": status, "message": message}
    body.update({k: v for k, v in extra.items() if v is not None})
    return json_response({"error": body}, status=status)


def json_response(data, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, content_type="application/json")


async def json_body(request: web.Request) -> bytes:
    """The request's body, which must be sent as JSON (``parse_json`` reads it, in the pool).

    ``Content-Type: application/json`` is required: a browser sends a cross-site POST
    of another type without asking the server first (no CORS preflight), so any web
    page could otherwise write to a node its reader can reach."""
    if request.content_type != "application/json":
        raise BadRequest("Content-Type", f"{request.content_type or 'none'} given: send the body as "
                                         "application/json (curl: -H 'Content-Type: application/json')",
                         status=415)
    raw = await request.read()
    if not raw:
        raise BadRequest("body", "empty: give a JSON document")
    return raw


def parse_json(raw: bytes):
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest("body", f"not JSON: {e}") from None


def _everything(rtype: str, name: str) -> bool:
    return True
