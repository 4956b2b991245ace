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
import json
import logging
import math
import time

import grpc
from aiohttp import web

from ..protocol.errors import LEADER_METADATA_KEY, RETRY_AFTER_METADATA_KEY
from ..protocol.placement import http_address
from ..protocol.tls import common_name
from ..server.dispatch import CallFailed
from ..server.errors import ServiceError
from .convert import HTTP_STATUS, BadRequest

__all__ = ["HttpServer", "MAX_BODY", "MAX_CONNECTIONS"]

log = logging.getLogger(__name__)
MAX_BODY = 64 << 20          # a produce body (base64 makes binary a third bigger)
MAX_CONNECTIONS = 512        # open HTTP connections per node; past it a new one gets 429 and is closed


class HttpServer:
    """Serves ``api.routes`` on ``address``; ``stop`` ends it (before the gRPC loop stops)."""

    def __init__(self, rpc, node, address: str, ssl_context=None):
        from . import api                # (api imports this module's helpers)
        self.rpc, self.node, self.address = rpc, node, address
        self.scheme = "https" if ssl_context is not None else "http"
        self.app = web.Application(client_max_size=MAX_BODY, middlewares=[self._answer])
        api.add_routes(self)
        # shutdown: requests in flight get 1 s (a long poll is answered by the node stopping)
        self.runner = web.AppRunner(self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
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
        """``fn(*args)`` in the node's pool, after the gate allowed ``what`` (authz.POLICY)."""
        gate = self.node.gate
        creds = self.credentials(request)

        def run():
            if gate is not None:
                gate.check_call(what, None, gate.principal(*creds))
            return fn(*args)
        try:
            return await asyncio.get_running_loop().run_in_executor(self.rpc.pool, run)
        except ServiceError as e:
            raise CallFailed(e.code, e.message, e.trailing_metadata()) from None

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
            return error_response(grpc.StatusCode.INVALID_ARGUMENT, str(e), field=e.field)
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

    async def start(self) -> None:
        await web.BaseSite.start(self)
        handler = self._runner.server

        def connection():
            if len(handler.connections) >= MAX_CONNECTIONS:
                return _Refused()
            return handler()
        self._server = await asyncio.get_running_loop().create_server(
            connection, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address)


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


async def json_body(request: web.Request):
    """The request's body as JSON; BadRequest naming what is wrong."""
    raw = await request.read()
    if not raw:
        raise BadRequest("body", "empty: give a JSON document")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest("body", f"not JSON: {e}") from None
