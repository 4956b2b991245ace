"""Journal syncs off the raft thread: nothing counts towards a commit before it is on disk.

A node's RaftLoop syncs journals on a thread of its own. A follower's success
reply waits until the entries it covers are synced; a leader does not count
its own copy of an entry that is not synced yet (``capped_match_index``).
These tests drive a real follower's message handler and record, in order,
every fdatasync and every reply it sends.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
import types

import pytest
from pysyncobj.node import TCPNode

from storage_service.local import free_port_block
from storage_service.log.diskspace import Shortage
from storage_service.statemachine.meta import MetaState
from storage_service.raft.group import RaftGroup, RaftLoop, capped_match_index

pytestmark = pytest.mark.unit

NOOP = b"\x01"


def _append(prev_idx, prev_term, entries, commit=1, term=1):
    return {"type": "append_entries", "term": term, "commit_index": commit,
            "prevLogIdx": prev_idx, "prevLogTerm": prev_term, "entries": entries}


def _entries(first, last, term=1):
    return [(NOOP, i, term) for i in range(first, last + 1)]


@pytest.fixture
def follower(tmp_path, monkeypatch):
    """A group on a RaftLoop whose loop thread does not run (the test is the
    loop; it starts the syncer when it wants one), with every fdatasync and
    reply recorded."""
    base = free_port_block(3)
    me, *others = [f"127.0.0.1:{base + i}" for i in range(3)]
    loop = RaftLoop(tick=0.05, name="test-raft")
    g = RaftGroup(1, me, [me, *others], str(tmp_path), MetaState(), loop=loop)
    events = []
    real_sync = os.fdatasync

    def fdatasync(fd):
        real_sync(fd)
        events.append(("synced", g.journal.last_idx))

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    g.wrap_send(lambda _send: lambda node, msg: events.append(("reply", msg)) or True)
    try:
        yield g, loop, TCPNode(others[0]), events
    finally:
        loop.stop()
        g.stop()


def _wait_durable(g, idx, timeout=5.0):
    deadline = time.monotonic() + timeout
    while g.journal.durable_idx < idx:
        assert time.monotonic() < deadline, f"journal never durable up to {idx}"
        time.sleep(0.005)


def _success_replies(events):
    return [m["next_node_idx"] for kind, m in events if kind == "reply" and m.get("success")]


def test_a_reply_waits_for_the_sync_of_what_it_covers(follower):
    g, loop, leader, events = follower
    loop._syncers[0].start()
    g.on_message(leader, _append(1, 0, _entries(2, 4)))
    assert _success_replies(events) == []          # nothing said before the disk has it
    _wait_durable(g, 4)
    loop._send_ready_acks()
    assert _success_replies(events) == [5]
    first_reply = next(i for i, (kind, m) in enumerate(events) if kind == "reply")
    assert any(kind == "synced" and idx >= 4 for kind, idx in events[:first_reply])


def test_entries_appended_during_a_sync_are_not_claimed(follower, monkeypatch):
    g, loop, leader, events = follower
    handle = g.on_message
    handle(leader, _append(1, 0, _entries(2, 3)))
    # entry 4 arrives while the syncer is inside fdatasync for 2..3
    real_sync = os.fdatasync
    arrived = []

    def slow_sync(fd):
        if not arrived:
            arrived.append(True)
            handle(leader, _append(3, 1, _entries(4, 4)))
        real_sync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_sync)
    g.journal.sync_behind()
    assert arrived and g.journal.durable_idx == 3   # not 4: it was written after the sync began
    loop._send_ready_acks()
    assert _success_replies(events) == [4]          # the reply for 2..3 only
    g.journal.sync_behind()
    loop._send_ready_acks()
    assert _success_replies(events) == [4, 5]


def test_a_reply_for_entries_a_conflict_removed_is_never_sent(follower):
    g, loop, leader, events = follower
    loop._syncers[0].start()
    handle = g.on_message
    handle(leader, _append(1, 0, _entries(2, 4)))            # reply for 4 waits for the sync
    handle(leader, _append(2, 1, [(NOOP, 3, 2)], term=2))    # a new leader: 3..4 conflict
    assert [(e[1], e[2]) for e in g.journal[:]] == [(1, 0), (2, 1), (3, 2)]
    _wait_durable(g, 3)
    loop._send_ready_acks()
    # "I hold up to 4" would name an entry 4 this node no longer has
    assert _success_replies(events) == [4]


def _commits(followers, durable, idx, capped):
    """Would pysyncobj's rule commit idx (leader counted as 1 + followers at idx)?"""
    n = len(followers) + 1
    counted = capped_match_index(dict(enumerate(followers)), durable) if capped else dict(enumerate(followers))
    return 1 + sum(m >= idx for m in counted.values()) > n / 2


@pytest.mark.parametrize("n_followers", [1, 2, 4])
def test_the_leader_commits_only_what_a_majority_has_on_disk(n_followers):
    # Every combination of follower positions, leader durability and index:
    # with the cap, a commit happens exactly when a majority of durable copies exists.
    for followers in itertools.product(range(5), repeat=n_followers):
        for durable, idx in itertools.product(range(5), range(1, 5)):
            durable_copies = sum(m >= idx for m in followers) + (durable >= idx)
            majority = durable_copies > (n_followers + 1) / 2
            assert _commits(followers, durable, idx, capped=True) == majority, (followers, durable, idx)


def test_without_the_cap_an_unsynced_leader_copy_would_count():
    # 3 nodes: one follower has entry 4 on disk, the leader only in its page cache.
    assert _commits([4, 0], durable=3, idx=4, capped=False)
    assert not _commits([4, 0], durable=3, idx=4, capped=True)


def test_a_reply_waiting_for_its_sync_is_dropped_when_a_new_term_begins(follower):
    g, loop, leader, events = follower
    handle = g.on_message
    handle(leader, _append(1, 0, _entries(2, 4)))            # term 1, reply waits for the sync
    handle(leader, _append(4, 1, [], term=2))                # a heartbeat of term 2 (same entries)
    g.journal.sync_behind()
    loop._send_ready_acks()
    # the term-1 reply is gone; the term-2 one covers the same entries and says so
    assert [(m["next_node_idx"], m["term"]) for kind, m in events
            if kind == "reply" and m.get("success")] == [(5, 2)]


def test_a_leader_ignores_a_success_reply_of_another_term(follower):
    from storage_service.raft._pysyncobj import LEADER
    g, loop, peer, events = follower
    g.force_role(LEADER, 3)
    match = g.match_index
    match[peer], g.next_index[peer] = 0, 1
    reply = {"type": "next_node_idx", "next_node_idx": 5, "reset": False, "success": True}
    g.on_message(peer, dict(reply, term=2))   # earned under an older leader
    assert match[peer] == 0
    g.on_message(peer, dict(reply, term=3))
    assert match[peer] == 4


class _Proposing:
    """A group committer with an entry to propose in this tick."""
    def will_propose(self) -> bool:
        return True


def test_a_commit_index_goes_with_the_next_append_or_alone_after_commit_notice(follower):
    """After an apply the leader does not send an append just for the commit index when
    an entry or a heartbeat follows within ``commit_notice``; when none does, it asks
    for one (and the loop ticks the group then)."""
    from storage_service.raft._pysyncobj import FOLLOWER, LEADER
    g, loop, peer, events = follower
    g.force_role(LEADER, 1)
    applied, nothing = (lambda: True), (lambda: False)     # pysyncobj's apply: entries applied or not
    t0 = time.monotonic()
    assert g.on_apply_entries(applied) is False
    due = g.commit_notice_due
    assert due is not None and t0 + g.timing.commit_notice <= due <= time.monotonic() + g.timing.commit_notice
    assert g.on_apply_entries(applied) is False and g.commit_notice_due == due   # the first apply's wait holds
    g.tick_wanted, g.engine_poller().active, g._last_tick = False, False, due
    assert not g.tick_due(due - 0.001, period=10.0) and g.tick_due(due, period=10.0)
    g.commit_notice_due = time.monotonic() - 0.001           # the wait is over, nothing was sent
    assert g.on_apply_entries(nothing) is True and g.commit_notice_due is None
    assert g.on_apply_entries(nothing) is False and g.commit_notice_due is None

    assert g.on_apply_entries(applied) is False and g.commit_notice_due is not None
    g.on_send_appends(lambda: None)                          # a heartbeat or an entry carried it
    assert g.commit_notice_due is None

    g.set_committer(_Proposing())                            # an entry goes out in this very tick
    assert g.on_apply_entries(applied) is False and g.commit_notice_due is None

    g.force_role(FOLLOWER, 1)
    g.commit_notice_due = time.monotonic() + 1
    assert g.on_apply_entries(applied) is True and g.commit_notice_due is None    # (pysyncobj ignores it)

    def short():
        raise Shortage("no space left")
    g.commit_notice_due = time.monotonic() - 1       # set while leading; the apply is put off
    assert g.on_apply_entries(short) is False and g.commit_notice_due is None
    g.force_role(LEADER, 1)
    g.commit_notice_due = time.monotonic() - 1
    assert g.on_apply_entries(short) is True and g.commit_notice_due is None     # still told


def test_a_held_reply_sends_its_lease_stamp_alone_only_when_the_sync_is_slow(follower):
    """A reply waiting for its sync carries the leader's lease stamp back once durable;
    a lease_ack goes ahead alone only if the wait passes LEASE_ACK_AFTER (a slow disk),
    once per held reply: no message (and leader tick) an entry on a quick disk."""
    from storage_service.raft.loop import LEASE_ACK_AFTER

    g, loop, leader, events = follower
    g.on_message(leader, dict(_append(1, 0, _entries(2, 4)), lt=123.0))     # held: the syncer is off
    lease_acks = lambda: [m for kind, m in events if kind == "reply" and m.get("type") == "lease_ack"]  # noqa: E731
    loop._send_ready_acks()
    assert _success_replies(events) == [] and lease_acks() == []
    later = time.monotonic() + LEASE_ACK_AFTER + 0.001
    loop._send_ready_acks(now=later)
    assert [(m["term"], m["lt"]) for m in lease_acks()] == [(1, 123.0)]
    loop._send_ready_acks(now=later + 1)
    assert len(lease_acks()) == 1                       # once per held reply
    g.journal.sync_behind()
    loop._send_ready_acks()
    replies = [m for kind, m in events if kind == "reply" and m.get("success")]
    assert [(m["next_node_idx"], m["lt"]) for m in replies] == [(5, 123.0)]


def test_with_two_sync_threads_a_slow_sync_holds_up_no_other_group(tmp_path, monkeypatch):
    """``--journal-sync-threads 2``: while one group's fdatasync hangs (a slow disk, a
    big write-back), another group of the node syncs and becomes durable; the hung
    group's own later entries wait for its sync to end rather than run a second
    fdatasync of the same journal beside it, and are durable once it ends."""
    base = free_port_block(6)
    me, *others = [f"127.0.0.1:{base + i}" for i in range(3)]
    me_b, *others_b = [f"127.0.0.1:{base + i}" for i in range(3, 6)]   # no shared raft port here
    loop = RaftLoop(tick=0.05, name="test-raft", sync_threads=2)
    a = RaftGroup(1, me, [me, *others], str(tmp_path), MetaState(), loop=loop)
    b = RaftGroup(2, me_b, [me_b, *others_b], str(tmp_path), MetaState(), loop=loop)
    for g in (a, b):
        g.wrap_send(lambda _send: lambda node, msg: True)
    inside, release = threading.Event(), threading.Event()
    in_a, most_in_a = [0], [0]
    lock = threading.Lock()
    real_sync = os.fdatasync

    def fdatasync(fd):
        if fd != a.journal._fd:
            return real_sync(fd)
        with lock:
            in_a[0] += 1
            most_in_a[0] = max(most_in_a[0], in_a[0])
        try:
            inside.set()
            assert release.wait(10)
            real_sync(fd)
        finally:
            with lock:
                in_a[0] -= 1

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    leader = TCPNode(others[0])
    try:
        for t in loop._syncers:
            t.start()
        a.on_message(leader, _append(1, 0, _entries(2, 4)))
        assert inside.wait(5), "group 1's sync never started"
        a.on_message(leader, _append(4, 1, _entries(5, 6)))     # asks for group 1's sync again
        b.on_message(TCPNode(others_b[0]), _append(1, 0, _entries(2, 4)))
        _wait_durable(b, 4)                                     # the second thread synced group 2
        assert a.journal.durable_idx < 4                        # group 1 still inside its sync
        release.set()
        _wait_durable(a, 6)
        assert most_in_a[0] == 1                                # never two syncs of one journal at once
    finally:
        release.set()
        loop.stop()
        a.stop()
        b.stop()


def test_sync_threads_must_be_at_least_one():
    with pytest.raises(ValueError, match="sync_threads 0: at least 1"):
        RaftLoop(tick=0.05, name="test-raft", sync_threads=0)


def test_a_sync_that_raises_something_else_stops_the_node(monkeypatch):
    """A journal sync that fails with an error other than OSError also goes to ``fatal``
    (the node stops, replicas take over): a syncer thread ended by it would leave every
    later reply and commit of its node waiting, with nothing in the log."""
    from storage_service.raft import loop as loop_module

    stopped = []
    monkeypatch.setattr(loop_module, "fatal", stopped.append)

    def sync_behind():
        raise RuntimeError("something unforeseen")

    group = types.SimpleNamespace(group_id=7, journal=types.SimpleNamespace(sync_behind=sync_behind))
    RaftLoop(tick=0.05, name="test-raft")._sync(group)
    assert stopped == ["group 7: journal sync raised RuntimeError: something unforeseen"]
