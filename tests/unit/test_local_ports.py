"""Port blocks for local clusters (storage_service.local.free_port_block)."""
from __future__ import annotations

import socket

import pytest

from storage_service.local import ephemeral_port_range, free_port_block

pytestmark = pytest.mark.unit


def test_blocks_are_free_and_outside_the_ephemeral_range():
    lo, hi = ephemeral_port_range()
    assert 1024 <= lo <= hi <= 65535
    for _ in range(20):
        base = free_port_block(6)
        # an outgoing connection's source port is never one of these
        assert base + 5 < lo or base > hi, (base, lo, hi)
        socks = []
        try:
            for p in range(base, base + 6):     # every port of the block binds, as a node binds
                s = socket.socket()                # (gRPC and create_server: SO_REUSEADDR, so a
                socks.append(s)                    # port in TIME_WAIT after an earlier test is free)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", p))
        finally:
            for s in socks:
                s.close()


def test_a_block_in_use_or_to_avoid_is_not_returned():
    base = free_port_block(4)
    held = socket.socket()
    held.bind(("127.0.0.1", base + 2))
    held.listen()
    try:
        for _ in range(20):
            other = free_port_block(4, avoid=range(base, base + 4))
            assert not set(range(other, other + 4)) & set(range(base, base + 4))
    finally:
        held.close()
