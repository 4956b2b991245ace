"""Replicas across racks: what the placement controller keeps (``controller.py``).

A data group's replicas are on distinct racks when the cluster has at least
as many racks as the group has replicas; with fewer racks, no rack holds more
than ``ceil(replicas / racks)`` of them (as evenly as the racks allow). Kafka's
``broker.rack`` and CockroachDB's localities place replicas the same way.

A node's rack is what it was started with (``rmq-storage node --rack NAME``),
recorded by the metadata group (``SetRack``). Nodes without one share the rack
"", so a cluster that names no racks has no rack rule at all. Only racks with
a usable node count (active and answering): while every node of a rack is
down, its groups are spread over the others, and once it is back the
controller moves replicas to it again.

Everything here is pure: the record's node dicts and lists of addresses in,
decisions out.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Iterable, Mapping, Sequence

__all__ = ["Racks", "cap"]


def cap(replicas: int, racks: int) -> int:
    """The most replicas of one group that one rack may hold."""
    return math.ceil(replicas / max(1, racks))


class Racks:
    """The racks of a cluster's nodes (``nodes``: address -> record with "rack")
    and the nodes new replicas may go to (``usable``)."""

    def __init__(self, nodes: Mapping[str, dict], usable: Iterable[str]):
        self.nodes = nodes
        self.usable = list(usable)
        self.count = len({self.of(a) for a in self.usable})

    def of(self, address: str) -> str:
        return (self.nodes.get(address) or {}).get("rack", "") or ""

    def per_rack(self, replicas: Iterable[str]) -> Counter:
        return Counter(self.of(a) for a in replicas)

    def worst(self, replicas: Sequence[str]) -> int:
        """The most replicas of the group that one rack holds."""
        return max(self.per_rack(replicas).values(), default=0)

    def spread_ok(self, replicas: Sequence[str]) -> bool:
        return self.worst(replicas) <= cap(len(replicas), self.count)

    def keeps(self, before: Sequence[str], after: Sequence[str]) -> bool:
        """Whether a move from ``before`` to ``after`` leaves the group within the rule,
        or at least no worse than it was."""
        return self.worst(after) <= max(cap(len(after), self.count), self.worst(before))

    def choose(self, candidates: Iterable[str], staying: Sequence[str],
               key: Callable[[str], tuple]) -> str | None:
        """The candidate to join ``staying``: in the rack holding fewest of them, then by ``key``."""
        held = self.per_rack(staying)
        free = list(candidates)
        return min(free, key=lambda a: (held[self.of(a)], *key(a))) if free else None

    def pick(self, count: int, key: Callable[[str], tuple]) -> list[str]:
        """``count`` usable nodes for a new group, spread over the racks, by ``key``."""
        out: list[str] = []
        while len(out) < min(count, len(self.usable)):
            out.append(self.choose([a for a in self.usable if a not in out], out, key))
        return out

    def fix(self, replicas: Sequence[str], key: Callable[[str], tuple]) -> list[str] | None:
        """The group's replicas with one moved out of a rack over the rule into the rack
        holding fewest of them (by ``key`` among its nodes), or None if none is over or
        no usable node can take it. The first replica (the preferred leader) moves last."""
        limit = cap(len(replicas), self.count)
        held = self.per_rack(replicas)
        over = [a for a in replicas if held[self.of(a)] > limit]
        if not over:
            return None
        free = [a for a in self.usable if a not in replicas and held[self.of(a)] < limit]
        target = self.choose(free, [a for a in replicas if a != over[-1]], key)
        if target is None:
            return None
        return [target if a == over[-1] else a for a in replicas]

    def after_leaving(self, leaving: str, replicas: int) -> str | None:
        """Why taking ``leaving`` out would break the rack rule for groups of
        ``replicas`` (its rack's last node, and fewer racks than replicas left), or None."""
        stay = [a for a in self.usable if a != leaving]
        left = len({self.of(a) for a in stay})
        if left >= self.count or left >= replicas:
            return None
        return (f"it is the last usable node of rack {self.of(leaving)!r}: {left} rack(s) would be left for "
                f"groups of {replicas} replicas, which could then not be on distinct racks")
