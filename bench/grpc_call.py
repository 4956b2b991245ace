#!/usr/bin/env python
"""What one Python gRPC call costs, by request size: the fixed part of every RPC.

A server process answers every unary call with two bytes (the request is not
parsed: identity deserializer, like a produce server's best case); ``--threads``
client threads call it back to back for ``--seconds`` per size. Prints calls/s
and CPU ms per call of the server process and of the client process::

    .venv/bin/python bench/grpc_call.py
    .venv/bin/python bench/grpc_call.py --sizes 1,300,1200 --threads 8
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent import futures

import grpc

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from storage_service.protocol.buffers import reuse_big_buffers  # noqa: E402
from storage_service.local import free_port_block  # noqa: E402

OPTS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def _ident(b):
    return b


def _serve(port: int) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(8), options=OPTS)
    handler = grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"ok", request_deserializer=_ident,
                                                  response_serializer=_ident)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", {"Call": handler}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1,100,300,1200", help="request sizes in KiB (default 1,100,300,1200)")
    p.add_argument("--threads", type=int, default=4, help="client threads (default 4)")
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per size (default 4)")
    a = p.parse_args(argv)
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes {a.sizes!r}: give KiB as integers separated by commas, e.g. 1,300")
    if a.threads <= 0 or a.seconds <= 0 or any(s <= 0 for s in sizes):
        p.error("--sizes, --threads and --seconds must be positive")
    reuse_big_buffers()          # as the client and the nodes do
    port = free_port_block(1)
    pid = os.fork()
    if pid == 0:
        _serve(port)
        os._exit(0)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTS)
        grpc.channel_ready_future(channel).result(timeout=30)
        call = channel.unary_unary("/bench.Echo/Call", request_serializer=_ident, response_deserializer=_ident)
        print(f"gRPC unary call, {a.threads} client threads, {a.seconds:g} s per size\n")
        print(f"{'request':>9} {'calls/s':>8} {'server ms/call':>15} {'client ms/call':>15}")
        for kib in sizes:
            payload, done, stop = os.urandom(kib << 10), [0], threading.Event()

            def caller():
                while not stop.is_set():
                    call(payload)
                    done[0] += 1

            workers = [threading.Thread(target=caller, daemon=True) for _ in range(a.threads)]
            for w in workers:
                w.start()
            time.sleep(1.0)                     # warm-up
            n0, s0, c0, t0 = done[0], _cpu(pid), _cpu(os.getpid()), time.monotonic()
            time.sleep(a.seconds)
            n1, s1, c1, t1 = done[0], _cpu(pid), _cpu(os.getpid()), time.monotonic()
            stop.set()
            for w in workers:
                w.join()
            k = max(1, n1 - n0)
            print(f"{kib:>6} KiB {k / (t1 - t0):>8.0f} {1e3 * (s1 - s0) / k:>15.3f} {1e3 * (c1 - c0) / k:>15.3f}",
                  flush=True)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
