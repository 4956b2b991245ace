"""Replicas added and removed one at a time (pysyncobj's dynamic membership under
RaftGroup), the configuration rebuilt from durable state (raft/membership.py):
real raft groups over each node's raft port (raft/mux.py) on loopback."""
from __future__ import annotations

import os
import threading

import pytest
from pysyncobj import FAIL_REASON

from storage_service.local import free_port_block
from storage_service.raft import membership
from storage_service.raft.group import RaftGroup, RaftLoop
from storage_service.statemachine.commands import CreateTopic
from storage_service.statemachine.meta import MetaState
from tests.conftest import wait_until

pytestmark = pytest.mark.integration


class _Node:
    """One process-local "node": a RaftLoop with its hub, and group 1 on it."""

    def __init__(self, address: str, members: list[str], data_dir, members_index: int = 0):
        self.address = address
        self.loop = RaftLoop(0.05, name=f"m-{address}", listen=address)
        self.group = RaftGroup(1, address, members, str(data_dir), MetaState(), loop=self.loop,
                               members_index=members_index)
        self.loop.start()

    def stop(self) -> None:
        self.group.stop()
        self.loop.close()


@pytest.fixture
def net(tmp_path):
    base = free_port_block(5)
    addrs = [f"127.0.0.1:{base + i}" for i in range(5)]
    nodes: dict[str, _Node] = {}

    def start(i: int, members: list[str] | None = None) -> _Node:
        """Node i with group 1: founding ``members``, or (None) a new replica that
        starts from the running group's configuration as of its commit index."""
        index = 0
        if members is None:
            leader = _leader(nodes)
            members, index = leader._loop.call(leader.config_at_commit)
        nodes[addrs[i]] = _Node(addrs[i], members, tmp_path / f"n{i}", index)
        return nodes[addrs[i]]

    def stop(i: int) -> None:
        nodes.pop(addrs[i]).stop()

    yield addrs, nodes, start, stop
    for n in nodes.values():
        n.stop()


def _leader(nodes) -> RaftGroup:
    wait_until(lambda: sum(n.group.is_leader for n in nodes.values()) == 1, timeout=20, what="one leader")
    return next(n.group for n in nodes.values() if n.group.is_leader)


def _call(fn, *args) -> int:
    done, box = threading.Event(), []
    fn(*args, lambda res, err: (box.append(err), done.set()))
    assert done.wait(15), f"{fn.__name__}{args}: no answer"
    return box[0]


def _create(nodes, name: str, on: list[str] | None = None) -> int:
    """Commit a topic through the leader; wait until the replicas ``on`` applied it."""
    leader = _leader(nodes)
    err = _call(leader.submit, CreateTopic({"name": name, "queues": 1}, 0).encode())
    assert err == FAIL_REASON.SUCCESS, err
    idx = leader.raftLastApplied
    for a in on or list(nodes):
        wait_until(lambda a=a: nodes[a].group.raftLastApplied >= idx, timeout=20, what=f"{a} applying {name}")
    return idx


def _topics(node: _Node) -> list[str]:
    return sorted(t["name"] for t in node.group.state.list_topics())


def test_add_a_replica_from_a_snapshot_remove_one_then_restart_everything(net):
    addrs, nodes, start, stop = net
    a, b, c, d = addrs[:4]
    for i in range(3):
        start(i, addrs[:3])
    _create(nodes, "t1")
    leader = _leader(nodes)
    leader.forceLogCompaction()                   # d will need the snapshot
    wait_until(lambda: leader.journal[0][1] > 1, timeout=10, what="the leader's journal compacted")
    _create(nodes, "t2")

    start(3)                                     # d: a new, empty replica
    assert _call(_leader(nodes).add_member, d) == FAIL_REASON.SUCCESS
    _create(nodes, "t3")
    assert os.path.isfile(nodes[d].group.snapshot_path)   # it came as a snapshot
    assert _topics(nodes[d]) == ["t1", "t2", "t3"]
    assert all(n.group.members == [a, b, c, d] for n in nodes.values())

    leader = _leader(nodes)
    gone = next(x for x in (a, b, c) if x != leader.selfNode.address)
    assert _call(leader.remove_member, gone) == FAIL_REASON.SUCCESS
    stop(addrs.index(gone))
    live = [x for x in (a, b, c, d) if x != gone]
    wait_until(lambda: all(nodes[x].group.members == live for x in live), timeout=10,
               what="every replica leaving the removed one out")
    # one more replica down: 2 of the 3 voters left still commit (the removed one does not count)
    other = next(x for x in live if x != leader.selfNode.address and x != d)
    stop(addrs.index(other))
    _create(nodes, "t4")

    # full restart, each from its directory (the list given now is ignored: members file,
    # snapshot and log)
    for x in list(nodes):
        stop(addrs.index(x))
    for x in live:
        start(addrs.index(x), [a, b, c])
    _create(nodes, "t5")
    for x in live:
        assert nodes[x].group.members == live, x
        assert _topics(nodes[x]) == ["t1", "t2", "t3", "t4", "t5"], x


def test_a_snapshot_records_the_configuration_at_its_own_index(net, tmp_path):
    addrs, nodes, start, _ = net
    a, b, c, d = addrs[:4]
    for i in range(3):
        start(i, addrs[:3])
    start(3)
    assert _call(_leader(nodes).add_member, d) == FAIL_REASON.SUCCESS
    _create(nodes, "t1")
    for n in nodes.values():
        n.group.forceLogCompaction()
    for n in nodes.values():
        path = n.group.snapshot_path
        wait_until(lambda p=path: os.path.isfile(p) and membership.snapshot_config(p)[0] is not None, timeout=10,
                   what="a snapshot with a configuration")
        members, idx = membership.snapshot_config(path)
        assert members == {a, b, c, d} and idx >= 1


def test_membership_changes_one_at_a_time(net):
    addrs, nodes, start, _ = net
    a, b, c, d, e = addrs
    for i in range(3):
        start(i, addrs[:3])
    _create(nodes, "t1")
    start(3)
    start(4)
    leader = _leader(nodes)
    results: list[int] = []
    both = threading.Event()

    def cb(res, err):
        results.append(err)
        if len(results) == 2:
            both.set()

    # submitted together: the second is refused until the first is applied
    leader.add_member(d, cb)
    leader.add_member(e, cb)
    assert both.wait(15)
    assert sorted(results) == sorted([FAIL_REASON.SUCCESS, FAIL_REASON.REQUEST_DENIED]), results


def test_replay_and_rewind_are_inverse():
    from storage_service.raft._pysyncobj import command_bytes, membership_command as cmd

    log = [cmd("add", "d:1"), command_bytes(1, b"x"), cmd("rem", "a:1"), cmd("add", "e:1")]
    base = {"a:1", "b:1", "c:1"}
    assert membership.replay(base, log) == {"b:1", "c:1", "d:1", "e:1"}
    assert membership.rewind(membership.replay(base, log), log) == base
    assert membership.replay(base, log[:1]) == {"a:1", "b:1", "c:1", "d:1"}



def test_a_replica_added_later_starts_from_the_configuration_at_the_commit_index(net):
    """No snapshot: a new replica replays the log on top of the configuration it was
    given (as of the group's commit index), so it agrees with the group on who votes
    even after earlier changes (it would count a removed founder otherwise)."""
    addrs, nodes, start, stop = net
    a, b, c, d, e = addrs
    for i in range(3):
        start(i, addrs[:3])
    _create(nodes, "t1")
    start(3)
    assert _call(_leader(nodes).add_member, d) == FAIL_REASON.SUCCESS
    leader = _leader(nodes)
    gone = next(x for x in (a, b, c) if x != leader.selfNode.address)
    assert _call(leader.remove_member, gone) == FAIL_REASON.SUCCESS
    stop(addrs.index(gone))
    start(4)
    assert _call(_leader(nodes).add_member, e) == FAIL_REASON.SUCCESS
    _create(nodes, "t2")
    want = sorted(x for x in addrs if x != gone)
    wait_until(lambda: all(n.group.members == want for n in nodes.values()), timeout=10,
               what="every replica agreeing on the voters")
    assert not os.path.isfile(nodes[e].group.snapshot_path)     # it replayed the log
    stop(addrs.index(e))
    start(4, [a])                    # restarted: its members file, not this list, says who votes
    assert nodes[e].group.members == want


def test_leadership_moves_to_a_chosen_voter(net):
    addrs, nodes, start, _ = net
    for i in range(3):
        start(i, addrs[:3])
    _create(nodes, "t1")
    leader = _leader(nodes)
    to = next(a for a in addrs[:3] if a != leader.selfNode.address)
    assert leader.transfer_to(to, timeout=5)
    assert _leader(nodes).selfNode.address == to
    _create(nodes, "t2")


def test_leadership_moves_to_a_replica_added_after_a_leader_change(net):
    addrs, nodes, start, stop = net
    a, b, c, d, e = addrs
    for i in range(3):
        start(i, addrs[:3])
    _create(nodes, "t1")
    leader = _leader(nodes)
    other = next(x for x in (a, b, c) if x != leader.selfNode.address)
    assert leader.transfer_to(other, timeout=5)
    _create(nodes, "t2")
    start(3)
    assert _call(_leader(nodes).add_member, d) == FAIL_REASON.SUCCESS
    leader = _leader(nodes)
    gone = next(x for x in (a, b, c) if x != leader.selfNode.address)
    assert _call(leader.remove_member, gone) == FAIL_REASON.SUCCESS
    stop(addrs.index(gone))
    _create(nodes, "t3")
    assert _leader(nodes).transfer_to(d, timeout=5)
    _create(nodes, "t4")
