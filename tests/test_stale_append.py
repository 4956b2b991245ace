"""The stale-append hole in pysyncobj 0.3.17, reproduced, and our guard.

A follower that receives an old, shorter append_entries (the leader re-sent an
old range after a delayed "reset" reply) truncates everything after its
prevLogIdx - including entries it already acknowledged. The leader counted
that acknowledgement towards a commit; if it dies before re-sending, a
majority no longer holds a committed entry. These tests drive a real
follower's message handler with the exact message sequence and record what
it acknowledges on its transport.
"""
from __future__ import annotations

import pytest
from pysyncobj import SyncObjConf
from pysyncobj.node import TCPNode

from storage_service.local import free_port_block
from storage_service.statemachine.meta import MetaState
from storage_service.raft._pysyncobj import Engine
from storage_service.raft.group import RaftGroup

pytestmark = pytest.mark.unit

NOOP = b"\x01"


def _entries(first: int, last: int, term: int = 1):
    return [(NOOP, i, term) for i in range(first, last + 1)]


def _append(prev_idx, prev_term, entries, commit, term=1):
    return {"type": "append_entries", "term": term, "commit_index": commit,
            "prevLogIdx": prev_idx, "prevLogTerm": prev_term, "entries": entries}


def _scenario(follower, leader: TCPNode):
    """Leader sends 2..4 (acked), then a stale copy of an older message carrying only 2."""
    acks = []
    follower.wrap_send(lambda _send: lambda node, msg: acks.append(msg) or True)
    handle = follower.on_message
    handle(leader, _append(1, 0, _entries(2, 4), commit=1))
    handle(leader, _append(1, 0, _entries(2, 2), commit=1))     # the stale message
    log = follower.raft_log
    return [m["next_node_idx"] - 1 for m in acks if m.get("success")], log[-1][1]


def _addresses():
    base = free_port_block(3)
    return [f"127.0.0.1:{base + i}" for i in range(3)]


def test_vanilla_pysyncobj_drops_acknowledged_entries():
    me, *others = _addresses()
    f = Engine(me, others, SyncObjConf(autoTick=False))   # pysyncobj's behaviour: no hook changed
    try:
        acked, log_end = _scenario(f, TCPNode(others[0]))
        assert max(acked) == 4          # it told the leader it holds 4 ...
        assert log_end == 2             # ... and then silently dropped 3 and 4
    finally:
        f.destroy_engine()


def test_raft_group_keeps_acknowledged_entries(tmp_path):
    me, *others = _addresses()
    g = RaftGroup(0, me, [me, *others], str(tmp_path), MetaState())
    g._running = False                   # drive the handler from this thread only
    g._thread.join()
    try:
        acked, log_end = _scenario(g, TCPNode(others[0]))
        assert max(acked) == 4
        assert log_end == 4              # nothing acknowledged was dropped
        assert g.stale_appends == 1
        assert acked[-1] == 2            # the stale message is acknowledged for what it covers
    finally:
        g.stop()


def test_raft_group_still_truncates_a_real_conflict(tmp_path):
    me, *others = _addresses()
    g = RaftGroup(0, me, [me, *others], str(tmp_path), MetaState())
    g._running = False
    g._thread.join()
    try:
        leader = TCPNode(others[0])
        g.wrap_send(lambda _send: lambda node, msg: True)
        handle = g.on_message
        handle(leader, _append(1, 0, _entries(2, 4, term=1), commit=1))
        # a new leader at term 2 never had 3..4 from term 1: they conflict
        handle(leader, _append(2, 1, [(NOOP, 3, 2)], commit=1, term=2))
        log = g.raft_log
        assert [(e[1], e[2]) for e in log[:]] == [(1, 0), (2, 1), (3, 2)]
        # and the journal on disk agrees after a reopen
        g.journal.sync()
        from storage_service.raft.journal import DurableJournal
        reopened = DurableJournal(str(tmp_path / "raft"))
        assert [(e[1], e[2]) for e in reopened[:]] == [(1, 0), (2, 1), (3, 2)]
    finally:
        g.stop()


def test_stale_snapshot_does_not_clear_acknowledged_entries(tmp_path):
    """A re-sent old snapshot must not wipe a journal that already holds it."""
    me, *others = _addresses()
    g = RaftGroup(0, me, [me, *others], str(tmp_path / "f"), MetaState())
    g._running = False
    g._thread.join()
    try:
        leader = TCPNode(others[0])
        acks = []
        g.wrap_send(lambda _send: lambda node, msg: acks.append(msg) or True)
        handle = g.on_message
        handle(leader, _append(1, 0, _entries(2, 6), commit=1))
        # the leader's snapshot covers up to entry 4 (term 1): build its file
        snap = tmp_path / "leader-snapshot"
        g._write_snapshot(str(snap), ((NOOP, 4, 1), (NOOP, 3, 1), set()))
        data = snap.read_bytes()
        base = {"type": "append_entries", "term": 1, "commit_index": 6}
        handle(leader, dict(base, serialized=(data, True, False)))
        handle(leader, dict(base, serialized=(b"", False, True)))
        assert g.journal[-1][1] == 6          # entries 5 and 6 (acknowledged) are still there
        assert g.snapshot_skips == 1
        assert acks[-1]["next_node_idx"] == 5 and acks[-1]["reset"]
        assert g.raftCommitIndex <= 4         # nothing past the snapshot is committed unverified
    finally:
        g.stop()


def _unverified_commit(follower, leader: TCPNode) -> int:
    """The follower holds 2..4 of term 1 from an old leader (only 1 committed). The
    term-3 leader, whose log was compacted past them, sends what pysyncobj sends
    while its snapshot is not ready: no prevLogIdx, ``serialized`` None."""
    follower.wrap_send(lambda _send: lambda node, msg: True)
    handle = follower.on_message
    handle(leader, _append(1, 0, _entries(2, 4), commit=1))
    handle(leader, {"type": "append_entries", "term": 3, "commit_index": 500, "serialized": None})
    return follower.raftCommitIndex


def test_vanilla_pysyncobj_commits_entries_it_never_matched():
    me, *others = _addresses()
    f = Engine(me, others, SyncObjConf(autoTick=False))   # pysyncobj's behaviour: no hook changed
    try:
        assert _unverified_commit(f, TCPNode(others[0])) == 4
    finally:
        f.destroy_engine()


def test_raft_group_commits_only_what_matches_the_leader(tmp_path):
    """Found by the partition harness (``move``): a cut-off leader's last entry,
    never committed, was applied after the heal, and its queue diverged."""
    me, *others = _addresses()
    g = RaftGroup(0, me, [me, *others], str(tmp_path), MetaState())
    g._running = False
    g._thread.join()
    try:
        assert _unverified_commit(g, TCPNode(others[0])) == 1
        assert g.raftCurrentTerm == 3                     # the rest of the message is taken
    finally:
        g.stop()
