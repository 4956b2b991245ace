"""Helpers for the tests of a ``secure=True`` cluster: a client as a principal, and a
produce-port connection over TLS with a token in its hello."""
from __future__ import annotations

import socket

from rmq_spark.client import Client, TlsFiles
from storage_service.proto import rmq_pb2
from storage_service.protocol.placement import produce_address
from storage_service.protocol.produce_frames import HELLO, METHOD_FETCH, FrameReader, check_hello, frame_head, hello
from storage_service.protocol.tls import client_context

__all__ = ["ProducePort", "client_as", "read_frame"]


def client_as(cluster, token, endpoints=None, **kw) -> Client:
    return Client(endpoints or cluster.endpoints, tls=TlsFiles(cluster.tls.ca), token=token,
                  timeout=5, attempt_timeout=2, **kw)


def read_frame(s, frames: FrameReader, first: bytes = b""):
    got = next(iter(frames.feed(first)), None) if first else None
    while got is None:
        chunk = s.recv(1 << 16)
        assert chunk, "closed without an answer"
        got = next(iter(frames.feed(chunk)), None)
    return got.code, bytes(got.body)


class ProducePort:
    """A produce-port connection over TLS with a token in its hello."""

    def __init__(self, cluster, address: str, token: str | None):
        host, port = produce_address(address).rsplit(":", 1)
        raw = socket.create_connection((host, int(port)), timeout=10)
        self.s = client_context(TlsFiles(cluster.tls.ca)).wrap_socket(raw, server_hostname=host)
        self.s.sendall(hello(token))
        first = self.s.recv(HELLO.size)
        self.frames = FrameReader(1 << 20)
        self.refused = None
        if first[:4] == b"RMQP":
            check_hello(first)
        else:                                       # an error frame instead of the node's hello
            self.refused = read_frame(self.s, self.frames, first)

    def produce(self, topic: str, rid: int = 1) -> tuple[int, bytes]:
        from rmq_spark.client._messages import to_block
        body = rmq_pb2.ProduceBatchesRequest(batches=[rmq_pb2.ProduceRequest(
            topic=topic, queue=0, records=to_block([b"wire"]), count=1)]).SerializeToString()
        self.s.sendall(frame_head(rid, 1, len(body)) + body)
        return read_frame(self.s, self.frames)

    def fetch(self, topic: str, rid: int = 1) -> tuple[int, bytes]:
        body = rmq_pb2.FetchRequest(topic=topic, queue=0, offset=0).SerializeToString()
        self.s.sendall(frame_head(rid, METHOD_FETCH, len(body)) + body)
        return read_frame(self.s, self.frames)

    def call(self, method: int, request, rid: int = 1) -> tuple[int, bytes]:
        body = request.SerializeToString()
        self.s.sendall(frame_head(rid, method, len(body)) + body)
        return read_frame(self.s, self.frames)

    def close(self) -> None:
        self.s.close()
