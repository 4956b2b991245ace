"""The raft port over TLS (storage_service/raft/tls_wire.py): three "nodes" in this
process share raft groups over TLS connections; peers without a node certificate of
the cluster (plaintext, another CA, a client certificate) are refused before a frame
is read."""
from __future__ import annotations

import pickle
import socket
import ssl
import struct

import pytest

from storage_service.local import free_port_block
from storage_service.protocol.tls import TlsFiles, client_context
from storage_service.raft.group import RaftGroup, RaftLoop
from storage_service.raft.tls_wire import RaftTls
from storage_service.security.certs import ensure_local, issue, make_ca
from storage_service.statemachine.meta import MetaState
from tests.conftest import wait_until
from tests.test_mux import _commit_in_every_group

pytestmark = pytest.mark.integration

GROUPS = 5


class _Node:
    def __init__(self, address, peers, data_dir, tls):
        self.loop = RaftLoop(0.05, name=f"tls-{address}", listen=address, tls=tls)
        self.groups = {g: RaftGroup(g, address, peers, str(data_dir / f"g{g}"), MetaState(), loop=self.loop)
                       for g in range(GROUPS)}
        self.loop.start()

    def stop(self):
        for g in self.groups.values():
            g.stop()
        self.loop.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    ca, node, admin = ensure_local(str(d), ("127.0.0.1",))
    other = d / "other"
    other.mkdir()
    foreign_ca = make_ca(str(other))
    foreign = issue(foreign_ca, str(other), "node", "node", ("127.0.0.1",))
    return {"ca": ca, "node": node, "admin": admin, "foreign_ca": foreign_ca, "foreign": foreign}


@pytest.fixture(scope="module")
def cluster(certs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("raft-tls")
    base = free_port_block(3)
    addrs = [f"127.0.0.1:{base + i}" for i in range(3)]
    tls = RaftTls(TlsFiles(certs["ca"].cert, certs["node"].cert, certs["node"].key))
    nodes = [_Node(a, addrs, tmp / f"n{i}", tls) for i, a in enumerate(addrs)]
    yield addrs, nodes
    for n in nodes:
        n.stop()


def test_groups_elect_and_commit_over_tls(cluster):
    addrs, nodes = cluster
    _commit_in_every_group(nodes, 1)
    # every hub connection is TLS with a node certificate on the other end
    for n in nodes:
        hub = n.loop.hub
        conns = list(hub._out.values()) + list(hub._in.values())
        assert conns and all(c.conn._buffers is not None and not c.conn._shaking for c in conns)
        assert {c.conn.peer_name for c in conns} == {"node"}


def _frame(message) -> bytes:
    data = pickle.dumps(message)
    return struct.pack("<I", len(data)) + data


def _closed_by_node(sock: socket.socket, timeout: float = 10.0) -> bool:
    """Whether the node closes ``sock`` (EOF or reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionError, ssl.SSLError):
        return True
    except socket.timeout:
        return False


def _hub_peers(node) -> set:
    return set(node.loop.call(lambda: set(node.loop.hub._in)))


def test_plaintext_peer_refused(cluster):
    addrs, nodes = cluster
    host, port = addrs[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(_frame(("hub", "127.0.0.1:1")) + _frame((0, {"type": "request_vote"})))
        assert _closed_by_node(s)
    assert "127.0.0.1:1" not in _hub_peers(nodes[0])


@pytest.mark.parametrize("who", ["foreign", "admin", "none"])
def test_peer_without_a_node_certificate_refused(cluster, certs, who):
    """Another CA's node certificate, the cluster's client (admin) certificate, and no
    certificate at all: the handshake or the node check fails and no frame is read."""
    addrs, nodes = cluster
    if who == "foreign":
        files = TlsFiles(certs["ca"].cert, certs["foreign"].cert, certs["foreign"].key)
    elif who == "admin":
        files = TlsFiles(certs["ca"].cert, certs["admin"].cert, certs["admin"].key)
    else:
        files = TlsFiles(certs["ca"].cert)
    ctx = client_context(files)
    host, port = addrs[0].rsplit(":", 1)
    fake = f"127.0.0.1:{2 + ['foreign', 'admin', 'none'].index(who)}"
    raw = socket.create_connection((host, int(port)), timeout=5)
    try:
        s = ctx.wrap_socket(raw, server_hostname=host)
    except (ssl.SSLError, ConnectionError):
        raw.close()
        return                                   # refused in the handshake itself
    with s:
        try:
            s.sendall(_frame(("hub", fake)) + _frame((0, {"type": "request_vote"})))
        except (ssl.SSLError, ConnectionError):
            pass
        assert _closed_by_node(s)
    assert fake not in _hub_peers(nodes[0])


def test_node_refuses_a_peer_of_another_ca(cluster, certs, tmp_path):
    """The other direction: a node never counts a peer that shows another CA's
    certificate, even one that names a node."""
    addrs, nodes = cluster
    base = free_port_block(1)
    rogue_addr = f"127.0.0.1:{base}"
    rogue = _Node(rogue_addr, [addrs[0], rogue_addr], tmp_path / "rogue",
                  RaftTls(TlsFiles(certs["foreign_ca"].cert, certs["foreign"].cert, certs["foreign"].key)))
    try:
        # the rogue keeps connecting to node 0 (it lists it as a peer); node 0 never takes it
        wait_until(lambda: rogue.loop.call(lambda: rogue.loop.hub._last_try.get(addrs[0])) is not None,
                   timeout=10, what="the rogue tried node 0")
        import time
        time.sleep(2)
        assert rogue_addr not in _hub_peers(nodes[0])
        assert not rogue.loop.call(lambda: rogue.loop.hub.is_up(addrs[0]))
        _commit_in_every_group(nodes, 2)         # the cluster is unaffected
    finally:
        rogue.stop()
