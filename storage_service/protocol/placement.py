"""Stable placement: which raft group owns a queue, and how its nodes are reached."""
from __future__ import annotations

import zlib
from typing import Sequence

__all__ = ["GRPC_OPTIONS", "META_GROUP", "assign_groups", "group_of", "grpc_address", "initial_replicas",
           "http_address", "legacy_group", "produce_address", "raft_address"]

META_GROUP = 0
# gRPC options of every channel and server: big messages (fetches of up to
# 64 MiB), and fast reconnects to a restarted node instead of minutes of backoff.
GRPC_OPTIONS = [("grpc.max_receive_message_length", 128 << 20),
                ("grpc.max_send_message_length", 128 << 20),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000)]


def group_of(topic: str, queue: int, groups: int, assigned: Sequence[int] = ()) -> int:
    """Data group (1..groups) of a queue: the one the metadata group recorded for
    it (``assigned``: the topic's ``queue_groups``), else, for a topic created
    before placement was recorded, ``legacy_group``."""
    if 0 <= queue < len(assigned):
        return assigned[queue]
    return legacy_group(topic, queue, groups)


def legacy_group(topic: str, queue: int, groups: int) -> int:
    """The placement of topics created before it was recorded: a CRC of
    "topic/queue". CRC is linear, so the last byte decides the low bits: the
    queues of a 4-queue topic landed in 2 of 4 groups whatever the topic's name."""
    return 1 + zlib.crc32(f"{topic}/{queue}".encode()) % groups


def assign_groups(load: dict[int, int], groups: int, count: int) -> list[int]:
    """Groups for ``count`` new queues: each to the data group holding the fewest
    queues (``load``: group -> queues, updated here), ties to the lowest number.
    Deterministic, so every metadata replica records the same."""
    out = []
    for _ in range(count):
        g = min(range(1, groups + 1), key=lambda k: (load.get(k, 0), k))
        load[g] = load.get(g, 0) + 1
        out.append(g)
    return out


def initial_replicas(nodes: Sequence[str], groups: int, rf: int) -> dict[int, list[str]]:
    """Each data group's replicas at a cluster's first start: ``rf`` distinct nodes,
    group g starting at node g-1 and taking the next ones round the list. Every
    founding node computes the same (the metadata group then records it), each
    node gets ``groups * rf / len(nodes)`` replicas give or take one, and the
    first replica of each group (its preferred leader) goes round the nodes."""
    n = len(nodes)
    rf = max(1, min(rf, n))
    return {g: [nodes[(g - 1 + k) % n] for k in range(rf)] for g in range(1, groups + 1)}


def grpc_address(raft_addr: str) -> str:
    """The gRPC address of the node whose raft port is ``raft_addr``."""
    host, port = raft_addr.rsplit(":", 1)
    return f"{host}:{int(port) - 1}"


def raft_address(grpc_address: str) -> str:
    """A node's raft port, shared by all its raft groups (``raft/mux.py``): gRPC port + 1."""
    host, port = grpc_address.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


def cluster_address(grpc_address: str) -> str:
    """A TLS node's cluster port (``server/dispatch.py``): gRPC port + 3, the same
    service for its peers, where a caller must show a certificate (mTLS): nodes call
    each other there, so a node knows a peer by its certificate even when clients
    come with tokens and no certificate (Python's gRPC cannot ask for a certificate
    without requiring one). Bound only with TLS."""
    host, port = grpc_address.rsplit(":", 1)
    return f"{host}:{int(port) + 3}"


def produce_address(grpc_address: str) -> str:
    """A node's produce port (``server/produce_port.py``): gRPC port + 2.

    A node's three ports do not depend on how many groups it hosts (until
    wave 2 every group had a raft port of its own and this came after them)."""
    host, port = grpc_address.rsplit(":", 1)
    return f"{host}:{int(port) + 2}"


def http_address(grpc_address: str) -> str:
    """A node's HTTP port (``storage_service/http``: JSON API, /metrics, status page): gRPC port + 4."""
    host, port = grpc_address.rsplit(":", 1)
    return f"{host}:{int(port) + 4}"
