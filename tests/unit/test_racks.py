"""Replicas across racks (storage_service/cluster/racks.py, the controller's planning):
property tests over random clusters, racks, joins, failures and decommissions."""
from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage_service.proto import rmq_pb2
from storage_service.protocol.placement import initial_replicas
from storage_service.cluster.controller import ClusterView, plan_growth, plan_move, plan_rebalance
from storage_service.cluster.racks import Racks, cap

pytestmark = pytest.mark.unit


def _view(racks: dict[str, str], record: dict, states=None, down=()) -> ClusterView:
    """Every node but ``down`` answers; each group led by its first replica."""
    status = {}
    for a in racks:
        if a in down:
            continue
        s = rmq_pb2.NodeStatus(address=a)
        for g, reps in record.items():
            if a in reps:
                s.groups.add(group=g, leader=reps[0], replicas=reps)
        status[a] = s
    recs = {a: {"state": (states or {}).get(a, "active"), "rack": r} for a, r in racks.items()}
    return ClusterView(recs, {g: list(r) for g, r in record.items()}, status, set(down))


def _settle(view: ClusterView, rf: int) -> ClusterView:
    """Apply the controller's replica moves (repairs, rack fixes, rebalance) until it stops."""
    for _ in range(5_000):
        step = next((("replicas", g, w) for g in sorted(view.record)
                     if (w := plan_move(view, g, rf)) is not None), None)
        if step is None:
            step = plan_rebalance(view)
            if step is not None and step[0] == "leader":
                step = None          # leaderships do not change where replicas are
        if step is None:
            return view
        _, g, want = step
        view = _view({a: r["rack"] for a, r in view.nodes.items()}, {**view.record, g: want},
                     states={a: r["state"] for a, r in view.nodes.items()}, down=view.down)
    raise AssertionError("planning never settled")


def _feasible(view: ClusterView, replicas: int) -> bool:
    """Whether the usable nodes' racks can hold ``replicas`` within the rule at all."""
    racks = view.racks()
    sizes = collections.Counter(racks.of(a) for a in racks.usable)
    limit = cap(replicas, racks.count)
    return sum(min(n, limit) for n in sizes.values()) >= replicas


def _check(view: ClusterView, rf: int) -> None:
    racks = view.racks()
    for g, reps in view.record.items():
        assert len(set(reps)) == len(reps) == min(rf, len(racks.usable)), (g, reps)
        assert all(a in racks.usable for a in reps), (g, reps)
        if _feasible(view, len(reps)):
            assert racks.spread_ok(reps), (g, reps, {a: racks.of(a) for a in reps})
        if racks.count >= len(reps):
            assert len({racks.of(a) for a in reps}) == len(reps), (g, reps)     # distinct racks


clusters = st.tuples(st.integers(3, 9), st.integers(1, 5), st.integers(1, 3), st.integers(1, 12),
                     st.randoms(use_true_random=False))


@settings(max_examples=150, deadline=None)
@given(clusters)
def test_any_cluster_settles_with_replicas_spread_over_racks(c):
    n, nracks, rf, groups, rnd = c
    nodes = {f"n{i}": f"r{rnd.randrange(nracks)}" for i in range(n)}
    view = _settle(_view(nodes, initial_replicas(list(nodes), groups, rf)), rf)
    _check(view, rf)


@settings(max_examples=150, deadline=None)
@given(clusters, st.lists(st.sampled_from(["join", "down", "leave", "back"]), min_size=1, max_size=6))
def test_joins_failures_and_decommissions_keep_the_spread(c, events):
    n, nracks, rf, groups, rnd = c
    racks = {f"n{i}": f"r{rnd.randrange(nracks)}" for i in range(n)}
    states, down = {}, set()
    view = _settle(_view(racks, initial_replicas(list(racks), groups, rf)), rf)
    for event in events:
        active = [a for a in racks if states.get(a, "active") == "active" and a not in down]
        if event == "join":
            racks[f"n{len(racks)}"] = f"r{rnd.randrange(nracks + 1)}"       # maybe a new rack
        elif event == "down" and len(active) > rf:
            down.add(rnd.choice(active))
        elif event == "back" and down:
            down.discard(rnd.choice(sorted(down)))
        elif event == "leave" and len(active) > rf:
            leaving = rnd.choice(active)
            if Racks(view.nodes, view.usable()).after_leaving(leaving, rf) is None:
                states[leaving] = "leaving"        # what `rmq cluster decommission` allows
        view = _settle(_view(racks, view.record, states, down), rf)
        _check(view, rf)


def test_a_rack_with_every_node_down_spreads_its_groups_over_the_others_then_gets_them_back():
    racks = {"a1": "ra", "a2": "ra", "b1": "rb", "b2": "rb", "c1": "rc", "c2": "rc"}
    view = _settle(_view(racks, initial_replicas(list(racks), 6, 3)), 3)
    _check(view, 3)
    down = _settle(_view(racks, view.record, down={"c1", "c2"}), 3)
    for reps in down.record.values():          # two racks left: at most 2 of 3 in either
        assert not {"c1", "c2"} & set(reps)
        assert max(collections.Counter(racks[a] for a in reps).values()) == 2
    back = _settle(_view(racks, down.record), 3)
    for reps in back.record.values():
        assert sorted(racks[a] for a in reps) == ["ra", "rb", "rc"]


def test_a_decommission_that_would_break_the_spread_is_named():
    racks = Racks({"a1": {"rack": "ra"}, "b1": {"rack": "rb"}, "c1": {"rack": "rc"}, "c2": {"rack": "rc"}},
                  ["a1", "b1", "c1", "c2"])
    assert racks.after_leaving("c2", 3) is None               # rc keeps c1
    why = racks.after_leaving("a1", 3)
    assert why is not None and "'ra'" in why and "2 rack(s)" in why
    assert racks.after_leaving("a1", 2) is None               # 2 racks still hold groups of 2


def test_no_racks_named_means_no_rack_rule():
    nodes = {f"n{i}": "" for i in range(5)}
    view = _settle(_view(nodes, initial_replicas(list(nodes), 10, 3)), 3)
    assert view.racks().count == 1 and all(view.racks().spread_ok(r) for r in view.record.values())
    assert view.record == initial_replicas(list(nodes), 10, 3)      # nothing moved


def test_new_groups_are_spread_over_racks():
    racks = {"a1": "ra", "a2": "ra", "a3": "ra", "b1": "rb", "c1": "rc"}
    record = {1: ["a1", "b1", "c1"]}
    g, reps = plan_growth(_view(racks, record), density=3.0, rf=3)
    assert sorted(racks[a] for a in reps) == ["ra", "rb", "rc"]
