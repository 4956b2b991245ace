#!/usr/bin/env python
"""Placement simulation: the controller's own planning (``plan_move``,
``plan_rebalance`` in storage_service/cluster/controller.py) on 100 nodes and
10,000 groups, without processes.

A cluster of 90 nodes starts with 10,000 groups of 3 replicas
(``initial_replicas``), each group holding a random amount of data
(log-normal, median 1 GiB). Then: 10 nodes join and a rebalance runs; one
node is decommissioned; one node fails and stays down past the repair time.
After each event the table shows replicas and leaders per node (max / mean)
and the bytes the controller moved (its moves, then a rebalance) against
the least that reaching the same placement must move: for the joins, the
data that ends on the new nodes (a ratio of 1 means nothing moved twice or
between old nodes); for the decommission and the failure, the data the node
held. The controller evens replica counts, then leaders, then data (it
swaps a bigger group's replica on the fullest node with a smaller one's on
the emptiest while that closes a tenth of the mean or more): those swaps
are what it moves beyond the least. Moves complete at
once here; the real controller runs at most 2 at a time::

    .venv/bin/python bench/placement_sim.py [--nodes 90 --join 10 --groups 10000]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from storage_service.protocol.placement import initial_replicas  # noqa: E402
from storage_service.cluster.controller import ClusterView, plan_move, plan_rebalance, plan_swap  # noqa: E402

GiB = 1 << 30


class SimView(ClusterView):
    """The controller's view with the node reports replaced by a leader map, and the
    per-node counts kept up to date as moves are made (the real view recounts)."""

    def __init__(self, nodes: list[str], record: dict[int, list[str]], size: dict[int, int]):
        super().__init__({a: {"state": "active"} for a in nodes}, record, {a: None for a in nodes})
        self.leader = {g: reps[0] for g, reps in record.items()}
        self.size = size
        self._counts()

    def _counts(self) -> None:
        up = [a for a, rec in self.nodes.items() if rec["state"] == "active" and a in self.status]
        self.replicas = dict.fromkeys(up, 0)
        self.leaders = dict.fromkeys(up, 0)
        self.bytes = dict.fromkeys(up, 0)
        for g, reps in self.record.items():
            for a in reps:
                if a in self.replicas:
                    self.replicas[a] += 1
                    self.bytes[a] += self.size[g]
            if self.leader[g] in self.leaders:
                self.leaders[self.leader[g]] += 1

    def usable(self) -> list[str]:
        return sorted(self.replicas)

    def load(self):
        return self.replicas, self.leaders

    def node_bytes(self):
        return self.bytes

    def group_report(self, g: int):
        return self.leader[g], None

    # ---------------------------------------------------------------- moves
    def move(self, g: int, want: list[str]) -> list[str]:
        """Apply a new replica list; the replicas that arrived."""
        was = self.record[g]
        added = [a for a in want if a not in was]
        for a in was:
            if a not in want and a in self.replicas:
                self.replicas[a] -= 1
                self.bytes[a] -= self.size[g]
        for a in added:
            if a in self.replicas:
                self.replicas[a] += 1
                self.bytes[a] += self.size[g]
        self.record[g] = list(want)
        if self.leader[g] not in want or self.leader[g] in self.down:
            self.transfer(g, next(a for a in want if a not in self.down))
        return added

    def transfer(self, g: int, to: str) -> None:
        old = self.leader[g]
        if old in self.leaders:
            self.leaders[old] -= 1
        self.leader[g] = to
        if to in self.leaders:
            self.leaders[to] += 1


def _spread(counts: dict) -> str:
    vals = list(counts.values())
    return f"{max(vals)} / {statistics.mean(vals):.1f} (min {min(vals)})"


def run(nodes: int = 90, join: int = 10, groups: int = 10_000, rf: int = 3, seed: int = 1, say=print) -> list[dict]:
    rng = random.Random(seed)
    names = [f"n{i:03d}" for i in range(nodes + join)]
    size = {g: int(GiB * rng.lognormvariate(0, 1)) for g in range(1, groups + 1)}
    view = SimView(names[:nodes], initial_replicas(names[:nodes], groups, rf), size)
    rows = []

    def row(event: str, moves: int, moved: int, least: int, seconds: float) -> None:
        gib = {a: b / GiB for a, b in view.bytes.items()}
        rows.append(dict(event=event, replicas=_spread(view.replicas), leaders=_spread(view.leaders),
                         bytes=f"{max(gib.values()):,.0f} / {statistics.mean(gib.values()):,.0f} GiB",
                         moves=moves, moved_gib=moved / GiB, least_gib=least / GiB,
                         ratio=moved / least if least else 0.0, seconds=seconds))
        say(f"  {event}: {rows[-1]}")

    def settle(affected: str | None) -> tuple[int, int]:
        """Moves until nothing is left to plan: the groups on ``affected`` first
        (``plan_move``), then a rebalance (``plan_rebalance``)."""
        moves = moved = 0
        todo = sorted(g for g, r in view.record.items() if affected in r)
        while True:
            step = None
            while todo and step is None:
                want = plan_move(view, todo[0], rf)
                if want is None:
                    todo.pop(0)
                else:
                    step = ("replicas", todo[0], want)
            if step is None:
                step = plan_rebalance(view)
            if step is None:
                swap = plan_swap(view, size)
                if swap is None:
                    return moves, moved
                for g, want in swap:
                    added = view.move(g, want)
                    moves += len(added)
                    moved += size[g] * len(added)
                continue
            kind, g, target = step
            if kind == "replicas":
                added = view.move(g, target)
                moves += len(added)
                moved += size[g] * len(added)
            else:
                view.transfer(g, target)

    row("start", 0, 0, 0, 0.0)
    t = time.monotonic()
    for a in names[nodes:]:
        view.nodes[a] = {"state": "active"}
        view.status[a] = None
    view._counts()
    moves, moved = settle(None)
    on_new = sum(size[g] for g, r in view.record.items() for a in r if a in names[nodes:])
    row(f"{join} nodes join, rebalance", moves, moved, on_new, time.monotonic() - t)

    t = time.monotonic()
    gone = names[0]
    held = sum(size[g] for g, r in view.record.items() if gone in r)
    view.nodes[gone]["state"] = "leaving"
    view._counts()
    moves, moved = settle(gone)
    view.nodes[gone]["state"] = "removed"
    del view.status[gone]
    row(f"decommission {gone}, rebalance", moves, moved, held, time.monotonic() - t)

    t = time.monotonic()
    dead = names[1]
    held = sum(size[g] for g, r in view.record.items() if dead in r)
    view.down.add(dead)
    del view.status[dead]
    view._counts()
    moves, moved = settle(dead)
    row(f"{dead} fails (down past repair), rebalance", moves, moved, held, time.monotonic() - t)
    assert all(len(set(r)) == rf and gone not in r and dead not in r for r in view.record.values())
    return rows


def table(rows: list[dict]) -> str:
    head = ["event", "replicas/node max / mean", "leaders/node max / mean", "data/node max / mean", "replica moves",
            "GiB moved", "least for that placement", "ratio", "plan s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r['event']} | {r['replicas']} | {r['leaders']} | {r['bytes']} | {r['moves']:,} | "
                     f"{r['moved_gib']:,.0f} | {r['least_gib']:,.0f} | "
                     f"{r['ratio']:.2f} | {r['seconds']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=90)
    p.add_argument("--join", type=int, default=10)
    p.add_argument("--groups", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    print(f"placement simulation: {a.nodes} nodes + {a.join} joining, {a.groups:,} groups of 3 replicas")
    print(table(run(a.nodes, a.join, a.groups, seed=a.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
