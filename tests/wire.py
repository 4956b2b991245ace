"""Helpers for the tests of a node's produce port (raw frames over a socket)."""
from __future__ import annotations

import concurrent.futures
import socket

from storage_service.proto import rmq_pb2
from storage_service.protocol.placement import produce_address
from storage_service.protocol.produce_frames import FRAME, HELLO, METHOD_PRODUCE_BATCHES, hello
from storage_service.protocol.records import encode
from storage_service.server.produce_port import recv_exact

__all__ = ["Recorder", "batch", "call", "closed", "connect", "leader_of", "port_of", "unused_port"]


def port_of(cluster, node: int = 0) -> tuple[str, int]:
    host, port = produce_address(cluster.addresses[node]).rsplit(":", 1)
    return host, int(port)


def leader_of(client, topic: str, queue: int) -> int:
    """Index of the node leading the queue's group."""
    g = client.group_of(topic, queue)
    for n in client.cluster_status()["nodes"]:
        for st in n["groups"]:
            if st["group"] == g and st["leader"]:
                return client.endpoints.index(st["leader"])
    raise AssertionError(f"group {g} has no leader")


def connect(cluster, node: int = 0) -> socket.socket:
    s = socket.create_connection(port_of(cluster, node), timeout=10)
    s.sendall(hello())
    assert HELLO.unpack(recv_exact(s, HELLO.size))[0] == b"RMQP"
    return s


def call(s: socket.socket, body: bytes, method: int = METHOD_PRODUCE_BATCHES, rid: int = 7):
    s.sendall(FRAME.pack(len(body), rid, method) + body)
    length, got_rid, code = FRAME.unpack(recv_exact(s, FRAME.size))
    return got_rid, code, bytes(recv_exact(s, length))


def batch(topic: str, queue: int, values: list[bytes], **kw) -> rmq_pb2.ProduceRequest:
    return rmq_pb2.ProduceRequest(topic=topic, queue=queue, records=encode(values), count=len(values), **kw)


def closed(s: socket.socket) -> bool:
    s.settimeout(10)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True



def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Recorder:
    """Stands in for gRPC's ProduceBatches.future: records that it was asked."""

    def __init__(self):
        self.calls = []
        self.timeouts = []

    def __call__(self, request, timeout=None):
        self.calls.append(len(request.batches))
        self.timeouts.append(timeout)
        fut = concurrent.futures.Future()
        fut.set_result(rmq_pb2.ProduceBatchesResponse())
        return fut
