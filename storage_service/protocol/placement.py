"""Stable placement: which raft group owns a queue, and how its nodes are reached."""
from __future__ import annotations

import zlib

__all__ = ["GRPC_OPTIONS", "META_GROUP", "group_of", "produce_address", "raft_address"]

META_GROUP = 0
# gRPC options of every channel and server: big messages (fetches of up to
# 64 MiB), and fast reconnects to a restarted node instead of minutes of backoff.
GRPC_OPTIONS = [("grpc.max_receive_message_length", 128 << 20),
                ("grpc.max_send_message_length", 128 << 20),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000)]


def group_of(topic: str, queue: int, groups: int) -> int:
    """Data group (1..groups) of a queue: a stable hash of (topic, queue)."""
    return 1 + zlib.crc32(f"{topic}/{queue}".encode()) % groups


def raft_address(grpc_address: str, group: int) -> str:
    """Each node listens for group g's raft traffic on its gRPC port + 1 + g."""
    host, port = grpc_address.rsplit(":", 1)
    return f"{host}:{int(port) + 1 + group}"


def produce_address(grpc_address: str, groups: int) -> str:
    """A node's produce port (``storage_service.producewire``): after its raft ports."""
    host, port = grpc_address.rsplit(":", 1)
    return f"{host}:{int(port) + groups + 2}"
