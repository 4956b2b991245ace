"""Replicated state machines without the network: DataState (state.py) and MetaState (meta.py)."""
from __future__ import annotations

import json
import os

import pytest

from storage_service.protocol.framing import iter_batches
from storage_service.statemachine.meta import TOPIC_DEFAULTS, MetaState
from storage_service.statemachine.data import CatchUpFailed, apply_position, DataState, parse_queue_dir, queue_dir

from ._helpers import encode_values, iter_values

pytestmark = pytest.mark.unit

Q = queue_dir("orders", "abc123", 0)


def _produce(qdir: str, producer: str, seq: int, ts: int, msgs: list[bytes]) -> tuple:
    return ("produce", [(qdir, producer, seq, ts, len(msgs), encode_values(msgs))])


def _msgs(tag: str, n: int = 3) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


def _records(state: DataState, qdir: str = Q) -> list[tuple[int, int, bytes]]:
    q = state.queue(qdir)
    out, off = [], q.earliest
    while off < q.next_offset:
        for o, ts, m in iter_values(q.read(off, 1 << 20), off):
            out.append((o, ts, bytes(m)))
        off = out[-1][0] + 1
    return out


@pytest.fixture
def state(tmp_path):
    s = DataState(str(tmp_path / "data"), fsync=False)
    yield s
    s.close()


# ------------------------------------------------------------------ DataState
def test_queue_dir_round_trip():
    assert parse_queue_dir(queue_dir("a.b-c", "inc", 7)) == ("a.b-c", "inc", 7)


def test_produce_assigns_contiguous_offsets(state):
    assert state.apply(1, _produce(Q, "", 0, 100, _msgs("a", 3))) == [(0, 3, 100, False)]
    assert state.apply(2, _produce(Q, "", 0, 200, _msgs("b", 2))) == [(3, 2, 200, False)]
    assert [o for o, _, _ in _records(state)] == [0, 1, 2, 3, 4]
    assert [m for _, _, m in _records(state)] == _msgs("a", 3) + _msgs("b", 2)


def test_one_command_may_carry_batches_for_several_queues(state):
    q1 = queue_dir("orders", "abc123", 1)
    cmd = ("produce", [(Q, "", 0, 5, 2, encode_values(_msgs("x", 2))),
                       (q1, "", 0, 5, 1, encode_values(_msgs("y", 1)))])
    assert state.apply(1, cmd) == [(0, 2, 5, False), (0, 1, 5, False)]
    assert [m for _, _, m in _records(state, q1)] == _msgs("y", 1)


def test_group_commit_of_two_batches_for_one_queue_stores_both(state):
    # GroupCommitter coalesces concurrent produce calls into one raft entry,
    # so one command may carry several batches for the same queue.
    cmd = ("produce", [(Q, "", 0, 5, 2, encode_values(_msgs("x", 2))),
                       (Q, "p1", 0, 5, 1, encode_values(_msgs("z", 1)))])
    assert state.apply(1, cmd) == [(0, 2, 5, False), (2, 1, 5, False)]
    assert [m for _, _, m in _records(state)] == _msgs("x", 2) + _msgs("z", 1)


def test_batches_record_their_apply_position(state):
    state.apply(41, _produce(Q, "", 0, 1, _msgs("a")))
    h = next(iter_batches(state.queue(Q).read(0, 1 << 20)))
    assert h.apply_position == apply_position(41, 0)
    assert state.queue(Q).last_position == apply_position(41, 0)


def test_same_producer_and_seq_is_a_duplicate_with_original_offsets(state):
    state.apply(1, _produce(Q, "p1", 0, 100, _msgs("a", 2)))
    first = state.apply(2, _produce(Q, "p1", 1, 200, _msgs("b", 3)))
    again = state.apply(3, _produce(Q, "p1", 1, 300, _msgs("b", 3)))
    assert first == [(2, 3, 200, False)]
    assert again == [(2, 3, 200, True)]
    assert state.queue(Q).next_offset == 5


def test_lower_seq_than_remembered_is_a_duplicate(state):
    for seq in range(20):
        state.apply(seq + 1, _produce(Q, "p1", seq, 100, _msgs("a", 1)))
    (base, count, ts, dup), = state.apply(100, _produce(Q, "p1", 0, 100, _msgs("a", 1)))
    assert dup is True
    assert state.queue(Q).next_offset == 20


def test_producers_are_deduplicated_independently(state):
    state.apply(1, _produce(Q, "p1", 0, 1, _msgs("a", 1)))
    assert state.apply(2, _produce(Q, "p2", 0, 1, _msgs("b", 1))) == [(1, 1, 1, False)]


def test_producers_are_deduplicated_per_queue(state):
    q1 = queue_dir("orders", "abc123", 1)
    state.apply(1, _produce(Q, "p1", 0, 1, _msgs("a", 1)))
    assert state.apply(2, _produce(q1, "p1", 0, 1, _msgs("a", 1))) == [(0, 1, 1, False)]


def test_empty_producer_id_is_never_deduplicated(state):
    state.apply(1, _produce(Q, "", 0, 1, _msgs("a", 1)))
    assert state.apply(2, _produce(Q, "", 0, 1, _msgs("a", 1))) == [(1, 1, 1, False)]


def test_store_ts_is_non_decreasing_per_queue(state):
    state.apply(1, _produce(Q, "", 0, 500, _msgs("a", 1)))
    assert state.apply(2, _produce(Q, "", 0, 300, _msgs("b", 1))) == [(1, 1, 500, False)]
    assert state.apply(3, _produce(Q, "", 0, 700, _msgs("c", 1))) == [(2, 1, 700, False)]
    assert [ts for _, ts, _ in _records(state)] == [500, 500, 700]


def test_store_ts_stays_non_decreasing_after_reopen(tmp_path):
    s = DataState(str(tmp_path), fsync=False)
    s.apply(1, _produce(Q, "", 0, 500, _msgs("a", 1)))
    s.close()
    s2 = DataState(str(tmp_path), fsync=False)
    assert s2.apply(2, _produce(Q, "", 0, 100, _msgs("b", 1))) == [(1, 1, 500, False)]


def test_reopen_finds_existing_queues(tmp_path):
    s = DataState(str(tmp_path), fsync=False)
    s.apply(1, _produce(Q, "", 0, 5, _msgs("a", 4)))
    s.close()
    s2 = DataState(str(tmp_path), fsync=False)
    assert Q in s2.queues and s2.queues.total() == 1
    assert list(s2.queues) == []                  # known, not opened until used
    assert s2.queue(Q).next_offset == 4
    assert list(s2.queues) == [Q]


def test_a_restart_opens_no_queue_until_used_and_its_snapshot_still_names_them_all(tmp_path):
    s = DataState(str(tmp_path), fsync=True)
    names = [Q.replace("~0", f"~{i}") for i in range(5)]
    for i, name in enumerate(names):
        s.apply(i + 1, _produce(name, "", 0, 5, _msgs(f"q{i}", i + 1)))
    snap = s.snapshot()
    s.close()
    s2 = DataState(str(tmp_path), fsync=True)
    s2.restore(snap, 5, None, own=True)           # the node's own snapshot, loaded at start
    assert list(s2.queues) == [] and s2.queues.total() == 5
    assert json.loads(s2.snapshot()) == json.loads(snap)        # taken with every queue still closed
    assert s2.queue(names[3]).next_offset == 4 and list(s2.queues) == [names[3]]
    assert s2.queues.open_some(2) == 2 and len(list(s2.queues)) == 3
    assert json.loads(s2.snapshot()) == json.loads(snap)


def test_a_snapshot_not_written_here_checks_closed_queues_and_drops_those_it_does_not_name(tmp_path):
    """A received snapshot left in the snapshot file (the node restarted before its catch-up
    finished) is not this replica's own: queues behind it are fetched, not trusted."""
    s = DataState(str(tmp_path), fsync=True)
    s.apply(1, _produce(Q, "", 0, 5, _msgs("a", 4)))
    gone = Q.replace("~0", "~1")
    s.apply(2, _produce(gone, "", 0, 5, _msgs("b", 1)))
    snap = json.loads(s.snapshot())
    snap["queues"][Q][1] = 6                       # the leader's manifest: two more than here
    del snap["queues"][gone]                       # and a queue dropped on the leader
    s.close()
    s2 = DataState(str(tmp_path), fsync=True)
    fetched = []
    s2.fetch_range = lambda name, start, end: fetched.append((name, start, end)) or []
    with pytest.raises(CatchUpFailed):
        s2.restore(json.dumps(snap).encode(), 9, None, own=False)
    assert fetched == [(Q, 4, 6)]
    del snap["queues"][Q]
    s2.restore(json.dumps(snap).encode(), 9, None, own=False)
    assert gone not in s2.queues and not os.path.exists(os.path.join(str(tmp_path), gone))


def test_a_snapshot_from_a_leader_checks_every_queue(tmp_path):
    s = DataState(str(tmp_path / "a"), fsync=False)
    s.apply(1, _produce(Q, "", 0, 5, _msgs("a", 4)))
    snap = json.loads(s.snapshot())
    snap["queues"][Q][1] = 6                       # the leader holds two more than this replica
    s.close()
    s2 = DataState(str(tmp_path / "a"), fsync=False)
    fetched = []
    s2.fetch_range = lambda name, start, end: fetched.append((name, start, end)) or []
    with pytest.raises(CatchUpFailed):
        s2.restore(json.dumps(snap).encode(), 9, "127.0.0.1:1")
    assert fetched == [(Q, 4, 6)]


def test_replay_of_applied_raft_index_after_reopen_adds_no_data(tmp_path):
    s = DataState(str(tmp_path), fsync=False)
    cmds = [_produce(Q, "p1", i, 100 + i, _msgs(f"m{i}", 2)) for i in range(3)]
    for i, c in enumerate(cmds, start=1):
        s.apply(i, c)
    before = _records(s)
    s.close()
    s2 = DataState(str(tmp_path), fsync=False)
    for i, c in enumerate(cmds, start=1):
        s2.apply(i, c)
    assert _records(s2) == before
    assert s2.apply(4, _produce(Q, "p1", 3, 200, _msgs("new", 1))) == [(6, 1, 200, False)]


def test_replay_rebuilds_dedupe_so_a_retry_is_still_a_duplicate(tmp_path):
    s = DataState(str(tmp_path), fsync=False)
    s.apply(1, _produce(Q, "p1", 0, 100, _msgs("a", 2)))
    s.close()
    s2 = DataState(str(tmp_path), fsync=False)
    s2.apply(1, _produce(Q, "p1", 0, 100, _msgs("a", 2)))     # journal replay
    (_, _, _, dup), = s2.apply(2, _produce(Q, "p1", 0, 100, _msgs("a", 2)))   # client retry
    assert dup is True
    assert s2.queue(Q).next_offset == 2


def test_retry_after_replay_returns_the_original_offsets(tmp_path):
    s = DataState(str(tmp_path), fsync=False)
    s.apply(1, _produce(Q, "p1", 0, 100, _msgs("a", 2)))
    s.apply(2, _produce(Q, "p1", 1, 200, _msgs("b", 3)))
    s.close()
    s2 = DataState(str(tmp_path), fsync=False)
    s2.apply(1, _produce(Q, "p1", 0, 100, _msgs("a", 2)))     # journal replay
    s2.apply(2, _produce(Q, "p1", 1, 200, _msgs("b", 3)))
    assert s2.apply(3, _produce(Q, "p1", 1, 200, _msgs("b", 3))) == [(2, 3, 200, True)]


def test_truncate_command_moves_earliest(tmp_path):
    s = DataState(str(tmp_path), fsync=False, segment_bytes=150)
    for i in range(6):
        s.apply(i + 1, _produce(Q, "", 0, 1, _msgs(f"m{i}", 4)))
    cut = s.queue(Q).segments[2].base
    assert s.apply(7, ("truncate", Q, cut)) == 2
    assert s.queue(Q).earliest == cut
    assert _records(s)[0][0] == cut


def test_truncate_of_unknown_queue_is_a_no_op(state):
    assert state.apply(1, ("truncate", "nope~x~0", 10)) == 0
    assert state.queue("nope~x~0") is None


def test_drop_command_removes_queue_and_dedupe(state):
    state.apply(1, _produce(Q, "p1", 0, 1, _msgs("a", 1)))
    path = state.queue(Q).path
    assert state.apply(2, ("drop", Q)) == 1
    assert state.queue(Q) is None and not os.path.exists(path)
    assert state.apply(3, ("drop", Q)) == 0
    assert state.apply(4, _produce(Q, "p1", 0, 1, _msgs("a", 1))) == [(0, 1, 1, False)]


def test_unknown_command_returns_an_error(state):
    assert state.apply(1, ("explode",))[0] == "error"


def test_snapshot_is_a_manifest_without_payload_bytes(state):
    secret = b"PAYLOAD-" + b"z" * 64
    state.apply(1, _produce(Q, "p1", 0, 1, [secret] * 50))
    snap = state.snapshot()
    assert b"PAYLOAD" not in snap
    assert len(snap) < 500
    manifest = json.loads(snap)
    assert manifest["queues"] == {Q: [0, 50]}
    assert manifest["producers"] == {Q: {"p1": [[0, 0, 50, 1]]}}


def _source(tmp_path, segment_bytes: int = 150) -> DataState:
    src = DataState(str(tmp_path / "src"), fsync=False, segment_bytes=segment_bytes)
    q1 = queue_dir("orders", "abc123", 1)
    for i in range(12):
        src.apply(i + 1, _produce(Q, "p1", i, 100 + i, _msgs(f"m{i}", 4)))
        src.apply(100 + i, _produce(q1, "", 0, 100 + i, _msgs(f"n{i}", 1)))
    return src


def _restore_into(dst: DataState, src: DataState, snap: bytes, index: int) -> list:
    calls = []

    def fetch_range(name: str, start: int, end: int) -> bytes:
        calls.append((name, start, end))
        return src.queue(name).read(start, 256)

    dst.fetch_range = fetch_range
    dst.restore(snap, index, None)
    return calls


def test_restore_into_empty_state_fills_it_identically(tmp_path):
    src = _source(tmp_path)
    dst = DataState(str(tmp_path / "dst"), fsync=False, segment_bytes=150)
    calls = _restore_into(dst, src, src.snapshot(), 200)
    assert calls, "restore must fetch the missing ranges from the peer"
    assert dst.manifest() == src.manifest()
    for name in src.queues:
        assert _records(dst, name) == _records(src, name)


def test_restore_brings_the_dedupe_table(tmp_path):
    src = _source(tmp_path)
    dst = DataState(str(tmp_path / "dst"), fsync=False, segment_bytes=150)
    _restore_into(dst, src, src.snapshot(), 200)
    assert dst.apply(201, _produce(Q, "p1", 11, 111, _msgs("m11", 4))) == [(44, 4, 111, True)]


def test_restore_after_segment_truncate_starts_at_earliest(tmp_path):
    src = _source(tmp_path)
    cut = src.queue(Q).segments[2].base
    src.apply(300, ("truncate", Q, cut))
    dst = DataState(str(tmp_path / "dst"), fsync=False, segment_bytes=150)
    _restore_into(dst, src, src.snapshot(), 300)
    assert dst.queue(Q).earliest == cut
    assert _records(dst) == _records(src)


def test_restore_after_truncate_inside_a_batch(tmp_path):
    src = _source(tmp_path)
    src.apply(300, ("truncate", Q, src.queue(Q).segments[1].base + 2))
    dst = DataState(str(tmp_path / "dst"), fsync=False, segment_bytes=150)
    _restore_into(dst, src, src.snapshot(), 300)
    assert dst.manifest()["queues"] == src.manifest()["queues"]
    assert _records(dst) == _records(src)


def test_restore_without_a_peer_fails_loudly(tmp_path):
    src = _source(tmp_path)
    dst = DataState(str(tmp_path / "dst"), fsync=False)
    with pytest.raises(RuntimeError, match="no peer"):
        dst.restore(src.snapshot(), 200, None)


def test_restore_drops_queues_absent_from_the_snapshot(tmp_path):
    src = _source(tmp_path)
    dst = DataState(str(tmp_path / "dst"), fsync=False, segment_bytes=150)
    stale = queue_dir("gone", "old", 0)
    dst.apply(5, _produce(stale, "", 0, 1, _msgs("x", 1)))
    _restore_into(dst, src, src.snapshot(), 200)
    assert dst.queue(stale) is None


def test_restore_keeps_queues_written_after_the_snapshot(tmp_path):
    src = _source(tmp_path)
    dst = DataState(str(tmp_path / "dst"), fsync=False, segment_bytes=150)
    newer = queue_dir("fresh", "new", 0)
    dst.apply(500, _produce(newer, "", 0, 1, _msgs("x", 1)))
    _restore_into(dst, src, src.snapshot(), 200)
    assert dst.queue(newer).next_offset == 1


# ------------------------------------------------------------------ MetaState
def _create(m: MetaState, name: str, raft_index: int = 1, **cfg) -> tuple:
    return m.apply(raft_index, ("create_topic", {"name": name, **cfg}, 1234))


def test_create_topic_fills_defaults_and_incarnation():
    m = MetaState()
    status, cfg = _create(m, "orders", queues=8)
    assert status == "ok"
    assert cfg["queues"] == 8 and cfg["created_ms"] == 1234
    assert {k: cfg[k] for k in TOPIC_DEFAULTS if k != "queues"} == \
        {k: v for k, v in TOPIC_DEFAULTS.items() if k != "queues"}
    assert len(cfg["incarnation"]) == 12
    assert m.topic("orders") == cfg


def test_duplicate_create_is_already_exists_and_changes_nothing():
    m = MetaState()
    _, first = _create(m, "orders", raft_index=1)
    res = _create(m, "orders", raft_index=2, queues=99)
    assert res[:2] == ("error", "ALREADY_EXISTS") and "orders" in res[2]
    assert m.topic("orders") == first


def test_alter_grows_queues_and_refuses_to_shrink_at_apply():
    m = MetaState()
    _, cfg = _create(m, "orders", queues=4)
    res = m.apply(2, ("alter_topic", "orders", {"queues": 4}))
    assert res[:2] == ("error", "INVALID_ARGUMENT") and "has 4 queues" in res[2]
    assert m.apply(3, ("alter_topic", "orders", {"queues": 2, "retention_ms": 5}))[0] == "error"
    assert m.topic("orders") == cfg                   # nothing changed, not even retention
    status, grown = m.apply(4, ("alter_topic", "orders", {"queues": 6}))
    assert status == "ok" and grown["queues"] == 6 and grown["incarnation"] == cfg["incarnation"]


def test_incarnation_is_deterministic_per_raft_index():
    a, b = MetaState(), MetaState()
    assert _create(a, "t", raft_index=7)[1]["incarnation"] == _create(b, "t", raft_index=7)[1]["incarnation"]
    c = MetaState()
    assert _create(c, "t", raft_index=8)[1]["incarnation"] != _create(MetaState(), "t", 7)[1]["incarnation"]


def test_recreated_topic_gets_a_new_incarnation():
    m = MetaState()
    old = _create(m, "t", raft_index=1)[1]["incarnation"]
    m.apply(2, ("delete_topic", "t"))
    assert _create(m, "t", raft_index=3)[1]["incarnation"] != old


def test_topic_query_returns_a_copy():
    m = MetaState()
    _create(m, "t")
    m.topic("t")["queues"] = 999
    assert m.topic("t")["queues"] == TOPIC_DEFAULTS["queues"]


def test_alter_topic_updates_config():
    m = MetaState()
    _create(m, "t")
    status, cfg = m.apply(2, ("alter_topic", "t", {"retention_ms": 5}))
    assert status == "ok" and cfg["retention_ms"] == 5
    assert m.topic("t")["retention_ms"] == 5


def test_alter_unknown_topic_is_not_found():
    assert MetaState().apply(1, ("alter_topic", "nope", {}))[:2] == ("error", "NOT_FOUND")


def test_delete_topic_removes_config_offsets_and_watermarks():
    m = MetaState()
    inc = _create(m, "t")[1]["incarnation"]
    m.apply(2, ("commit_offsets", "g", "t", {0: 5}))
    m.apply(3, ("set_watermark", "t", "archive", {0: 5}))
    assert m.apply(4, ("delete_topic", "t"))[0] == "ok"
    assert m.topic("t") is None
    assert (m.committed("g", "t"), m.watermark("t", "archive"), m.groups_for("t")) == ({}, {}, [])
    assert m.is_deleted(inc)


def test_delete_unknown_topic_is_not_found():
    assert MetaState().apply(1, ("delete_topic", "nope"))[:2] == ("error", "NOT_FOUND")


def test_commit_offsets_merges_per_queue():
    m = MetaState()
    _create(m, "t")
    assert m.apply(2, ("commit_offsets", "g", "t", {0: 5, 1: 7})) == ("ok", None)
    m.apply(3, ("commit_offsets", "g", "t", {1: 3}))
    assert m.committed("g", "t") == {0: 5, 1: 3}
    assert m.groups_for("t") == ["g"]


def test_commit_offsets_for_unknown_topic_is_not_found():
    assert MetaState().apply(1, ("commit_offsets", "g", "nope", {0: 1}))[:2] == ("error", "NOT_FOUND")


def test_set_watermark_only_moves_forward():
    m = MetaState()
    _create(m, "t")
    m.apply(2, ("set_watermark", "t", "archive", {0: 10, 1: 4}))
    m.apply(3, ("set_watermark", "t", "archive", {0: 3, 1: 9}))
    assert m.watermark("t", "archive") == {0: 10, 1: 9}
    assert m.watermark("t", "compaction") == {}


def test_set_watermark_for_unknown_topic_is_not_found():
    assert MetaState().apply(1, ("set_watermark", "nope", "archive", {0: 1}))[:2] == ("error", "NOT_FOUND")


def test_unknown_meta_command_is_an_error_not_an_exception():
    assert MetaState().apply(1, ("explode", 1))[:2] == ("error", "INVALID_ARGUMENT")


def test_meta_snapshot_restore_round_trip():
    m = MetaState()
    _create(m, "t", queues=2)
    inc = _create(m, "gone", raft_index=2)[1]["incarnation"]
    m.apply(3, ("delete_topic", "gone"))
    m.apply(4, ("commit_offsets", "g", "t", {0: 5}))
    m.apply(5, ("set_watermark", "t", "archive", {1: 8}))
    m2 = MetaState()
    m2.restore(m.snapshot(), 5, None)
    assert m2.snapshot() == m.snapshot()
    assert (m2.topic("t"), m2.committed("g", "t"), m2.watermark("t", "archive")) == \
        (m.topic("t"), {0: 5}, {1: 8})
    assert m2.is_deleted(inc)


def _lease(m: MetaState, owner: str, ttl: int, now: int, topic: str = "t", kind: str = "tier"):
    """Each call is the next raft entry (from index 10): a new holder's token is that index."""
    m.test_index = getattr(m, "test_index", 9) + 1
    return m.apply(m.test_index, ("lease", topic, kind, owner, ttl, now))


def test_lease_is_exclusive_until_it_lapses():
    m = MetaState()
    _create(m, "t")
    assert _lease(m, "A", 1000, now=0) == ("ok", (True, "A", 1000, 10))     # token: the granting entry
    assert _lease(m, "B", 1000, now=500) == ("ok", (False, "A", 1000, 10))  # A's runs
    assert _lease(m, "A", 1000, now=600) == ("ok", (True, "A", 1600, 10))   # renewed by A: same token
    assert _lease(m, "B", 1000, now=1599) == ("ok", (False, "A", 1600, 10))
    assert _lease(m, "B", 1000, now=1600) == ("ok", (True, "B", 2600, 14))  # lapsed: B takes it, new token
    assert _lease(m, "A", 1000, now=1700) == ("ok", (False, "B", 2600, 14)) # A lost it


def test_lease_release_only_by_its_holder_and_kinds_are_separate():
    m = MetaState()
    _create(m, "t")
    _lease(m, "A", 1000, now=0)
    assert _lease(m, "B", 0, now=10) == ("ok", (False, "A", 1000, 10))       # not B's to release
    assert _lease(m, "A", 1000, now=10, kind="other") == ("ok", (True, "A", 1010, 12))
    assert _lease(m, "A", 0, now=20) == ("ok", (True, "", 0, 0))
    assert _lease(m, "A", 1000, now=25) == ("ok", (True, "A", 1025, 10))     # A again: its token
    assert _lease(m, "A", 0, now=26) == ("ok", (True, "", 0, 0))
    assert _lease(m, "B", 1000, now=30) == ("ok", (True, "B", 1030, 16))     # free at once, new token
    assert _lease(m, "A", 1000, now=30, topic="nope")[:2] == ("error", "NOT_FOUND")


def test_leases_survive_a_snapshot_and_go_with_their_topic():
    m = MetaState()
    _create(m, "t")
    _lease(m, "A", 1000, now=0)
    r = MetaState()
    r.restore(m.snapshot(), 9, None)
    assert _lease(r, "B", 1000, now=10) == ("ok", (False, "A", 1000, 10))    # the token survives too
    r.apply(10, ("delete_topic", "t"))
    _create(r, "t", raft_index=11)
    r.test_index = 11
    assert _lease(r, "B", 1000, now=20) == ("ok", (True, "B", 1020, 12))


# ------------------------------------------------ what the background passes are told
def _counted(s: DataState) -> int:
    return sum(q.size_bytes for q in s.queues.values())


def test_the_byte_count_follows_appends_rolls_truncates_restores_and_drops(tmp_path):
    """``DataState.sizes`` (what a node's status reports, read in O(1)) equals the sum of
    the open queues' segment bytes after each kind of change (tally.ByteCount)."""
    src = _source(tmp_path)                                 # appends over rolled segments
    assert len(src.queue(Q).segments) > 2 and src.sizes.total == _counted(src) > 0
    src.apply(300, ("truncate", Q, src.queue(Q).segments[2].base))
    assert src.sizes.total == _counted(src)
    dst = DataState(str(tmp_path / "dst"), fsync=False, segment_bytes=150)
    stale = queue_dir("gone", "old", 0)
    dst.apply(5, _produce(stale, "", 0, 1, _msgs("x", 1)))
    dst.apply(6, _produce(Q, "", 0, 1, _msgs("y", 1)))      # before the source's earliest: reset on restore
    _restore_into(dst, src, src.snapshot(), 300)            # resets, fetches, drops ``stale``
    assert dst.queue(stale) is None
    assert dst.sizes.total == _counted(dst) == _counted(src)
    dst.apply(301, ("drop", Q))
    assert dst.sizes.total == _counted(dst)
    dst.close()
    again = DataState(str(tmp_path / "dst"), fsync=False, segment_bytes=150)   # reopened: counted as opened
    assert again.sizes.total == 0
    for name in again.queues.closed_names():
        again.queue(name)
    assert again.sizes.total == _counted(again) == _counted(src) - src.queue(Q).size_bytes
    again.close()


def test_a_compaction_swap_changes_the_byte_count(tmp_path):
    from storage_service.log.compaction import CompactionPolicy, compact_queue
    from storage_service.protocol import records
    s = DataState(str(tmp_path), fsync=False, segment_bytes=300)
    for i in range(12):
        block = records.encode([b"v%d" % i], [b"k%d" % (i % 2)])
        s.apply(i + 1, ("produce", [(Q, "", 0, 1, 1, block)]))
    before = s.sizes.total
    res = compact_queue(s.queue(Q), CompactionPolicy(s.queue(Q).next_offset, 10**12, 0, 0),
                        s.queue(Q).next_offset)
    assert res.records_dropped > 0
    assert s.sizes.total == _counted(s) < before


def test_the_background_sync_visits_only_the_queues_written_since_it_last_ran(tmp_path):
    s = DataState(str(tmp_path), fsync=True)
    names = [queue_dir("t", "i", q) for q in range(5)]
    for i, name in enumerate(names):
        s.apply(i + 1, _produce(name, "", 0, 1, _msgs("a", 1)))
    assert len(s.unsynced) == 5 and all(s.queue(n)._dirty for n in names)
    s.sync_behind()
    assert len(s.unsynced) == 0 and not any(s.queue(n)._dirty for n in names)
    s.apply(10, _produce(names[3], "", 0, 1, _msgs("b", 1)))
    assert s.unsynced.take() == [s.queue(names[3])]
    s.close()
