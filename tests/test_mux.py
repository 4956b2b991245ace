"""One raft port per node (storage_service/raft/mux.py): three "nodes" in this
process, each a RaftLoop with its hub and five raft groups, on real loopback
sockets."""
from __future__ import annotations

import pickle
import socket
import struct
import threading

import pytest

from storage_service.local import free_port_block
from storage_service.raft.group import RaftGroup, RaftLoop
from storage_service.statemachine.commands import CreateTopic
from storage_service.statemachine.meta import MetaState
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

GROUPS = 5


class _Node:
    def __init__(self, address: str, peers: list[str], data_dir, groups=range(GROUPS)):
        self.loop = RaftLoop(0.05, name=f"mux-{address}", listen=address)
        self.groups = {g: RaftGroup(g, address, peers, str(data_dir / f"g{g}"), MetaState(), loop=self.loop)
                       for g in groups}
        self.loop.start()

    def stop(self) -> None:
        for g in self.groups.values():
            g.stop()
        self.loop.close()


@pytest.fixture
def cluster(tmp_path):
    base = free_port_block(3)
    addrs = [f"127.0.0.1:{base + i}" for i in range(3)]
    nodes = [_Node(a, addrs, tmp_path / f"n{i}") for i, a in enumerate(addrs)]
    yield addrs, nodes, tmp_path
    for n in nodes:
        if n is not None:
            n.stop()


def _listening_ports() -> set[int]:
    ports = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(path) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":                       # LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _commit_in_every_group(nodes, tag: int) -> None:
    """One entry through each group's leader, applied on every running replica."""
    for g in range(GROUPS):
        replicas = [n.groups[g] for n in nodes if n is not None]
        wait_until(lambda: sum(r.is_leader for r in replicas) == 1, timeout=20, what=f"a leader of group {g}")
        leader = next(r for r in replicas if r.is_leader)
        done = threading.Event()
        cmd = CreateTopic({"name": f"t{tag}", "queues": 1}, 0).encode()
        leader.submit(cmd, lambda res, err: done.set())
        assert done.wait(10), f"group {g}: no commit"
        idx = leader.raftLastApplied
        wait_until(lambda: all(r.raftLastApplied >= idx for r in replicas), timeout=10,
                   what=f"group {g} applied everywhere")


def test_every_group_of_a_node_shares_its_one_port(cluster):
    addrs, nodes, _ = cluster
    _commit_in_every_group(nodes, 1)
    ports = {int(a.rsplit(":", 1)[1]) for a in addrs}
    listening = _listening_ports()
    assert ports <= listening
    # nothing else of this process listens next to them (pysyncobj would take a port per group)
    assert not ({p + k for p in ports for k in range(1, GROUPS + 1)} - ports) & listening
    for n in nodes:
        assert sorted(n.loop.hub.peers) == sorted(a for a in addrs if a != n.loop.hub.address)
        # one outgoing and one accepted connection per peer, whatever the number of groups
        assert len(n.loop.hub._out) == 2 and len(n.loop.hub._in) == 2


def test_a_restarted_node_reconnects_and_catches_up_in_every_group(cluster):
    addrs, nodes, tmp_path = cluster
    _commit_in_every_group(nodes, 1)
    nodes[2].stop()
    nodes[2] = None
    _commit_in_every_group(nodes, 2)              # two of three still commit
    nodes[2] = _Node(addrs[2], addrs, tmp_path / "n2")
    _commit_in_every_group(nodes, 3)
    for g in range(GROUPS):
        assert sorted(t["name"] for t in nodes[2].groups[g].state.list_topics()) == ["t1", "t2", "t3"], g


def test_a_peer_cut_off_is_seen_down_then_up_again(cluster):
    """Closing the sockets under a hub (as a partition's reset would) makes its
    groups count the peer as gone; the hub reconnects by itself."""
    addrs, nodes, _ = cluster
    _commit_in_every_group(nodes, 1)
    hub = nodes[0].loop.hub
    peer = addrs[1]
    for c in (hub._out.get(peer), hub._in.get(peer)):
        if c is not None:
            c.conn.sock.shutdown(socket.SHUT_RDWR)
    wait_until(lambda: hub.is_up(peer), timeout=10, what="the hub reconnecting")
    _commit_in_every_group(nodes, 2)


def test_a_connection_without_a_hello_is_closed(cluster):
    addrs, nodes, _ = cluster
    host, port = addrs[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        body = pickle.dumps((1, {"type": "append_entries"}))
        s.sendall(struct.pack("<I", len(body)) + body)
        s.settimeout(5)
        assert s.recv(1) == b""                   # closed, nothing delivered
    _commit_in_every_group(nodes, 1)


def test_frames_for_a_group_this_node_does_not_host_are_dropped(tmp_path):
    """Node b hosts group 7, whose peers name a; a has no group 7: b's messages are
    counted and dropped there, and a's own group keeps working."""
    base = free_port_block(2)
    a, b = f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"
    na = _Node(a, [a, b], tmp_path / "a", groups=[0])
    nb = _Node(b, [a, b], tmp_path / "b", groups=[0, 7])
    try:
        wait_until(lambda: na.loop.hub.dropped > 0, timeout=15, what="group 7's frames reaching a")
        wait_until(lambda: na.groups[0].is_leader or nb.groups[0].is_leader, timeout=15,
                   what="a leader of group 0")
        assert not nb.groups[7].is_leader          # no majority for it: a never answers
    finally:
        na.stop()
        nb.stop()


def test_a_group_opened_while_its_peers_are_connected_counts_them(cluster):
    """A replica added to a running group: the hub already talks to its peers, so
    no connect event comes; the group must still see them (else it never elects
    and, as a leader, never sends)."""
    addrs, nodes, tmp_path = cluster
    _commit_in_every_group(nodes, 1)
    late = {}
    for i, n in enumerate(nodes):
        late[i] = n.loop.call(lambda n=n, i=i: RaftGroup(GROUPS, n.loop.hub.address, addrs,
                                                          str(tmp_path / f"late{i}"), MetaState(), loop=n.loop))
        n.loop.call(lambda n=n, g=late[i]: n.loop.add(g))
    try:
        wait_until(lambda: all(g.connected_to_anyone() for g in late.values()), timeout=5,
                   what="the late groups counting their peers connected")
        wait_until(lambda: sum(g.is_leader for g in late.values()) == 1, timeout=20, what="a leader of the late group")
    finally:
        for i, n in enumerate(nodes):
            n.loop.call(late[i].close)


def test_a_failed_accept_pauses_the_raft_port_instead_of_closing_it(tmp_path):
    """pysyncobj closed its listening socket for good on any failed accept (EMFILE: a
    node short of file descriptors for a moment lost its raft port until restarted).
    The hub's server pauses accepting and the next ticks take connections again."""
    import errno
    import time

    from storage_service.raft.tls_wire import HubServer

    base = free_port_block(2)
    addrs = [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
    nodes = [_Node(a, addrs, tmp_path / f"n{i}", groups=[0]) for i, a in enumerate(addrs)]
    try:
        wait_until(lambda: nodes[0].loop.call(lambda: nodes[0].loop.hub.is_up(addrs[1])), timeout=20,
                   what="the nodes connected")
        server = nodes[0].loop.hub._server
        real = server.listening

        class Failing:              # accept() fails as with no file descriptor left
            def accept(self):
                raise OSError(errno.EMFILE, "Too many open files")

            def __getattr__(self, name):
                return getattr(real, name)

        def fail_next_accepts():
            server.listening = Failing()
        nodes[0].loop.call(fail_next_accepts)
        # node 1 reconnects: its accept fails on node 0, which pauses accepting
        nodes[1].loop.call(lambda: [c.conn.disconnect() for c in list(nodes[1].loop.hub._out.values())])
        wait_until(lambda: server._paused_until is not None, timeout=10, what="a failed accept")
        nodes[0].loop.call(lambda: setattr(server, "listening", real))
        time.sleep(HubServer.PAUSE_S * 2)
        assert server.bound          # still bound, listening
        wait_until(lambda: nodes[0].loop.call(lambda: addrs[1] in nodes[0].loop.hub._in), timeout=20,
                   what="node 0 accepted node 1 again")
    finally:
        for n in nodes:
            n.stop()
