"""Queue -> data group placement, recorded by the metadata group (issue 19)."""
from __future__ import annotations

import json

import pytest

from storage_service.protocol.placement import assign_groups, group_of, legacy_group
from storage_service.statemachine.commands import AlterTopic, CreateTopic
from storage_service.statemachine.meta import MetaState

pytestmark = pytest.mark.unit


def test_the_hash_placement_put_every_4_queue_topic_in_2_of_4_groups():
    """Why placement is recorded now: CRC is linear, so "topic/0".."topic/3" differ
    only in the last byte and land in the same 2 of 4 groups whatever the name."""
    for name in ("orders", "clicks", "t-1", "payments-eu", "x" * 40):
        assert len({legacy_group(name, q, 4) for q in range(4)}) == 2, name


def test_new_queues_go_to_the_groups_holding_fewest():
    load = {1: 3, 2: 0, 3: 1, 4: 0}
    assert assign_groups(load, 4, 5) == [2, 4, 2, 3, 4]
    assert load == {1: 3, 2: 2, 3: 2, 4: 2}


def _create(m: MetaState, name: str, queues: int, index: int):
    return m.apply(index, CreateTopic({"name": name, "queues": queues}, 0).encode())[1]


def test_topics_are_spread_over_every_group_and_growth_goes_to_the_emptiest():
    m = MetaState(groups=4)
    a = _create(m, "a", 4, 1)
    b = _create(m, "b", 2, 2)
    c = _create(m, "c", 3, 3)
    assert a["queue_groups"] == [1, 2, 3, 4]
    assert b["queue_groups"] == [1, 2] and c["queue_groups"] == [3, 4, 1]
    grown = m.apply(4, AlterTopic("b", {"queues": 5}).encode())[1]
    assert grown["queue_groups"] == [1, 2, 2, 3, 4]              # old queues stay where they are
    counts = {g: 0 for g in range(1, 5)}
    for t in m.topics.values():
        for g in t["queue_groups"]:
            counts[g] += 1
    assert max(counts.values()) - min(counts.values()) <= 1


def test_placement_survives_a_snapshot_and_older_topics_keep_the_hash():
    m = MetaState(groups=4)
    _create(m, "a", 4, 1)
    r = MetaState(groups=4)
    r.restore(m.snapshot(), 1, None)
    assert r.topic("a")["queue_groups"] == [1, 2, 3, 4]
    # A snapshot from before placement was recorded: its topics keep the hash placement,
    # and the next topic is placed around them.
    old = {"topics": {"legacy": {"name": "legacy", "queues": 4, "incarnation": "x"}},
           "offsets": {}, "watermarks": {}}
    r2 = MetaState(groups=4)
    r2.restore(json.dumps(old).encode(), 5, None)
    cfg = r2.topic("legacy")
    assert not cfg.get("queue_groups")
    assert [group_of("legacy", q, 4, cfg.get("queue_groups") or ()) for q in range(4)] == \
        [legacy_group("legacy", q, 4) for q in range(4)]
    new = _create(r2, "new", 2, 6)
    held = {legacy_group("legacy", q, 4) for q in range(4)}
    assert set(new["queue_groups"]) == {1, 2, 3, 4} - held       # the 2 groups legacy left empty
