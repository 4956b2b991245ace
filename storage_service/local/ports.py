"""Free blocks of consecutive ports on this host, for a local cluster's nodes."""
from __future__ import annotations

import random
import socket
from typing import Sequence

__all__ = ["ephemeral_port_range", "free_port_block"]


def _ports_free(host: str, ports: Sequence[int]) -> bool:
    socks = []
    try:
        for p in ports:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, p))
            socks.append(s)
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux; else its default)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = map(int, f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port_block(size: int, host: str = "127.0.0.1", avoid: Sequence[int] = ()) -> int:
    """A base port such that base..base+size-1 are all free, outside the kernel's
    ephemeral range where it can.

    A node binds its ports some time after they are chosen, while the nodes started
    before it already connect out. A port from the ephemeral range can become the
    source port of one of those connections first, and a raft connection lives as
    long as the cluster: the node could never bind it (seen once as a node "not
    ready after 60 s"). Ports below or above that range are never handed out as
    source ports.
    """
    lo, hi = ephemeral_port_range()
    spans = [(a, b - size) for a, b in ((10000, lo), (hi + 1, 65536)) if b - size > a]
    rng = random.SystemRandom()
    for _ in range(200 if spans else 0):
        a, b = rng.choice(spans)
        base = rng.randrange(a, b)
        block = range(base, base + size)
        if not set(block) & set(avoid) and _ports_free(host, block):
            return base
    for _ in range(200):          # no room outside the ephemeral range: OS-assigned start
        s = socket.socket()
        s.bind((host, 0))
        base = s.getsockname()[1]
        s.close()
        block = range(base, base + size)
        if base + size < 65535 and not set(block) & set(avoid) and _ports_free(host, block):
            return base
    raise RuntimeError(f"could not find {size} free consecutive ports on {host}")
