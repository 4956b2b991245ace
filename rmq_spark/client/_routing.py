"""Where a call goes and when it is tried again: the one retry policy of the client.

``Routes`` caches each raft group's leader (learned from not-leader answers)
and orders the nodes a call tries; ``Routes.learn`` is the one rule for what
an error says about the route. ``RetryClock`` is the one backoff: 0.02 s
doubling to 1 s, with jitter, until the call's deadline. ``Client.call`` (one
RPC) and ``Client.produce_batches`` (batches coalesced per node) both use
them.
"""
from __future__ import annotations

import random
import time
from typing import Sequence

from .errors import DeadlineExceeded, NotLeader, RmqError, Unavailable

__all__ = ["Routes", "RetryClock"]

FIRST_DELAY = 0.02
MAX_DELAY = 1.0
# A node that timed out or could not be reached is tried last for this long: a
# node cut off from the network costs each call a whole attempt timeout, and a
# round-robin pick would keep choosing it while the rest elect a new leader.
SUSPECT_S = 5.0


class Routes:
    """group -> leader address, and the order in which nodes are tried."""

    def __init__(self, endpoints: Sequence[str]):
        self.endpoints = list(endpoints)
        self._leaders: dict[int, str] = {}
        self._suspect: dict[str, float] = {}       # address -> monotonic time it is trusted again
        # Round-robin start: clients spread their first calls over the nodes.
        self._rr = random.randrange(len(self.endpoints))

    def candidates(self, group: int | None) -> list[str]:
        """Every node, the group's known leader first, the others in rotating order."""
        self._rr += 1
        rot = self._rr % len(self.endpoints)
        order = self.endpoints[rot:] + self.endpoints[:rot]
        if self._suspect:
            now = time.monotonic()
            order.sort(key=lambda a: self._suspect.get(a, 0.0) > now)     # stable: suspects last
        leader = self._leaders.get(group) if group is not None else None
        if leader:
            order = [leader] + [a for a in order if a != leader]
        return order

    def target(self, group: int) -> str:
        """The one node to send the group's next request to."""
        return self._leaders.get(group) or self.candidates(None)[0]

    def learn(self, group: int | None, err: RmqError, address: str) -> str | None:
        """Update the route from ``err``, answered by ``address``; the leader to
        retry at once, if the error named one.

        A not-leader answer with a hint moves the route there. Any other
        retriable error (no hint, node down, timed out) drops a route that
        pointed at ``address``: the next try asks around. A node that did not
        answer (down, timed out) is tried last for ``SUSPECT_S``.
        """
        if isinstance(err, (Unavailable, DeadlineExceeded)) and not isinstance(err, NotLeader):
            self._suspect[address] = time.monotonic() + SUSPECT_S
        if group is None:
            return None
        if isinstance(err, NotLeader) and err.leader:
            self._leaders[group] = err.leader
            return err.leader
        if isinstance(err, NotLeader) or self._leaders.get(group) == address:
            self._leaders.pop(group, None)
        return None


class RetryClock:
    """A call's deadline and its backoff between rounds of tries."""

    def __init__(self, timeout: float):
        self.deadline = time.monotonic() + timeout
        self.delay = FIRST_DELAY

    def left(self, cap: float) -> float:
        """Time for one attempt: what is left of the deadline, at most ``cap``."""
        return min(self.deadline - time.monotonic(), cap)

    def pause(self, last: RmqError, sleep: bool = True) -> None:
        """Before the next round: raise ``last`` if the backoff would pass the deadline;
        else sleep the jittered backoff (unless ``sleep`` is False: a leader hint
        arrived, so the next round goes straight to it) and double it."""
        if time.monotonic() + self.delay >= self.deadline:
            raise last
        if sleep:
            time.sleep(self.delay * (0.5 + random.random()))
            self.delay = min(self.delay * 2, MAX_DELAY)
