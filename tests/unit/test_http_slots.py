"""The HTTP port's connection slots (storage_service/http/server.py) come back from
TLS handshakes that fail, without waiting for the garbage collector: asyncio drops
such a connection's protocol without telling it, in a reference cycle, which only the
collector frees, when it gets to it (under load, later than a slot is wanted back)."""
from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from aiohttp import web

from storage_service.http import server
from storage_service.protocol.tls import TlsFiles, client_context, server_context
from storage_service.security.certs import issue, make_ca

LIMIT = 6
WINDOW = 3.0      # the handshake timeout and the second after it


@pytest.fixture
def site(tmp_path, monkeypatch):
    """(.site, .port, .client_context): a _LimitedSite with TLS on loopback, LIMIT slots, a 2 s handshake timeout, in a
    loop thread of its own; the collector off while it runs."""
    monkeypatch.setattr(server, "MAX_CONNECTIONS", LIMIT)
    monkeypatch.setattr(server, "HANDSHAKE_SECONDS", WINDOW - 1.0)
    ca = make_ca(str(tmp_path))
    leaf = issue(ca, str(tmp_path), "node", "node", hosts=("127.0.0.1",))
    files = TlsFiles(ca.cert, leaf.cert, leaf.key)
    app = web.Application()
    async def ok(request):
        return web.Response(text="ok")
    app.router.add_get("/", ok)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = web.AppRunner(app, access_log=None, handle_signals=False)

    async def start():
        await runner.setup()
        s = server._LimitedSite(runner, "127.0.0.1", 0, ssl_context=server_context(files))
        await s.start()
        return s
    s = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    gc.disable()
    try:
        yield SimpleNamespace(site=s, port=s._server.sockets[0].getsockname()[1],
                              client_context=client_context(TlsFiles(ca.cert)))
    finally:
        gc.enable()
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _plaintext_at_tls(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass


def _get(site) -> bytes:
    with socket.create_connection(("127.0.0.1", site.port), timeout=10) as raw, \
            site.client_context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        out = b""
        while chunk := s.recv(4096):
            out += chunk
        return out


def test_failed_tls_handshakes_give_their_slots_back_with_the_collector_off(site):
    t0 = time.monotonic()
    for _ in range(LIMIT + 4):
        _plaintext_at_tls(site.port)
    held, refused = site.site.open, _get(site).split(b"\r\n")[0]
    if time.monotonic() - t0 < WINDOW:     # (a machine this slow would see the first slots come back)
        assert held == LIMIT               # every slot held by a failed handshake, the collector off
        assert b"429" in refused, refused  # past the limit: refused
    deadline = time.monotonic() + 30
    while site.site.open and time.monotonic() < deadline:
        time.sleep(0.1)
    assert site.site.open == 0
    first = _get(site).split(b"\r\n")[0]
    assert b"200" in first, first
    while site.site.open and time.monotonic() < deadline:     # the served connection's slot comes back too
        time.sleep(0.1)
    assert site.site.open == 0


def test_a_connection_made_keeps_its_slot_past_the_handshake_window(site):
    with socket.create_connection(("127.0.0.1", site.port), timeout=10) as raw, \
            site.client_context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        time.sleep(WINDOW + 1.0)       # past the window: made, so still counted
        assert site.site.open == 1
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200" in s.recv(4096).split(b"\r\n")[0]
