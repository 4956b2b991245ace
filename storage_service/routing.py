"""Stable placement: which raft group owns a queue, and where its raft port is."""
from __future__ import annotations

import zlib

__all__ = ["META_GROUP", "group_of", "raft_address"]

META_GROUP = 0


def group_of(topic: str, queue: int, groups: int) -> int:
    """Data group (1..groups) of a queue: a stable hash of (topic, queue)."""
    return 1 + zlib.crc32(f"{topic}/{queue}".encode()) % groups


def raft_address(grpc_address: str, group: int) -> str:
    """Each node listens for group g's raft traffic on its gRPC port + 1 + g."""
    host, port = grpc_address.rsplit(":", 1)
    return f"{host}:{int(port) + 1 + group}"
