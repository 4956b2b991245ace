"""The cluster's time on one node (``RaftHub.cluster_time_ms``) from its peers' clock readings.

A reading (a peer's wall clock, sent as the hub's keep-alive) arrives late by the
time it spent on the way and waiting in this node's sockets, never early. Store
timestamps and retention follow the cluster's time, so the hub takes, of each
peer's last readings, the least delayed one: a raft loop held up for a while no
longer puts that peer's clock behind by as long.
"""
from __future__ import annotations

import types

import pytest
from pysyncobj.poller import PollPoller

from storage_service.local import free_port_block
from storage_service.raft import mux
from storage_service.raft.mux import CLOCK_READINGS, RaftHub, _Conn

pytestmark = pytest.mark.unit

HOUR_MS = 3_600_000


class _Clock:
    """This node's clocks, moved by the test alone: wall = monotonic + WALL_AT_ZERO."""
    WALL_AT_ZERO_MS = 1_800_000_000_000

    def __init__(self):
        self.mono = 100.0

    def wall_ms(self) -> float:
        return self.mono * 1000 + self.WALL_AT_ZERO_MS


@pytest.fixture
def hub(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(mux, "monotonic_time", lambda: clock.mono)
    monkeypatch.setattr(mux, "time", types.SimpleNamespace(time=lambda: clock.wall_ms() / 1000))
    h = RaftHub(f"127.0.0.1:{free_port_block(1)}", PollPoller())
    h.clock = clock
    try:
        yield h
    finally:
        h.close()


def _peer(name: str) -> _Conn:
    c = _Conn(None, name, outgoing=False)
    c.ready = True
    return c


def _read(hub: RaftHub, c: _Conn, late_ms: float, clock_off_ms: float = 0.0) -> None:
    """A reading of ``c``'s clock (``clock_off_ms`` from ours) that waited ``late_ms``;
    then 0.5 s pass."""
    hub._received(c, ("clock", hub.clock.wall_ms() + clock_off_ms - late_ms))
    hub.clock.mono += 0.5


def _off_ms(hub: RaftHub) -> float:
    return hub.cluster_time_ms() - hub.clock.wall_ms()


def test_a_late_reading_does_not_put_a_peers_clock_behind(hub):
    a, b = _peer("a:1"), _peer("b:1")
    for late in (1, 40, 60):                   # the newest readings waited 40-60 ms
        _read(hub, a, late)
        _read(hub, b, late)
    assert _off_ms(hub) == -1                  # the least delayed reading, not the newest (-60)


def test_a_peer_clock_stepped_back_shows_once_its_readings_say_so(hub):
    a = _peer("a:1")                           # two clocks: the earlier wins
    _read(hub, a, 0)
    assert _off_ms(hub) == 0
    for _ in range(CLOCK_READINGS - 1):
        _read(hub, a, 0, clock_off_ms=-HOUR_MS)
    assert _off_ms(hub) == 0                   # one good reading left among the last ones
    _read(hub, a, 0, clock_off_ms=-HOUR_MS)
    assert _off_ms(hub) == -HOUR_MS            # all of them an hour back: so is the earlier clock


def test_readings_older_than_clock_fresh_s_are_not_used(hub):
    a, b = _peer("a:1"), _peer("b:1")
    _read(hub, a, 0, clock_off_ms=-HOUR_MS)
    _read(hub, b, 0, clock_off_ms=-HOUR_MS)
    assert _off_ms(hub) == -HOUR_MS            # two of three clocks an hour back
    hub.clock.mono += mux.CLOCK_FRESH_S
    assert _off_ms(hub) == 0                   # nothing heard for CLOCK_FRESH_S: ours alone


def test_one_clock_a_day_ahead_is_outvoted(hub):
    a, b = _peer("a:1"), _peer("b:1")
    _read(hub, a, 2, clock_off_ms=86_400_000)
    _read(hub, b, 2)
    assert _off_ms(hub) == 0                   # the median of ours, b's (2 ms late) and a's
