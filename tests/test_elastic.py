"""An elastic cluster (issue 19): five real node processes, each data group on
three of them, every group of a node over its one raft port."""
from __future__ import annotations

import collections
import json

import pytest

from rmq_spark.client import Client, FailedPrecondition
from tests.conftest import start_cluster, wait_until
from tests.test_cli import rmq

pytestmark = pytest.mark.integration

NODES, GROUPS = 5, 5


@pytest.fixture(scope="module")
def five(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("five"), nodes=NODES, groups=GROUPS,
                      extra_args=("--replication-factor", "3"))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client5(five):
    c = Client(five.endpoints)
    yield c
    c.close()


def _status(client) -> dict:
    return client.cluster_status()


def test_each_group_has_three_replicas_on_distinct_nodes_and_nodes_hold_three_each(five, client5):
    st = _status(client5)
    hosted = collections.Counter()
    replicas: dict[int, set] = collections.defaultdict(set)
    for n in st["nodes"]:
        for g in n["groups"]:
            if g["group"] == 0:
                continue
            hosted[n["address"]] += 1
            replicas[g["group"]].add(n["address"])
            assert sorted(g["replicas"]) == sorted(replicas_of_group(st, g["group"]))
    assert sorted(replicas) == list(range(1, GROUPS + 1))
    assert all(len(r) == 3 for r in replicas.values()), replicas
    assert sorted(hosted.values()) == [3] * NODES          # 5 groups x 3 replicas over 5 nodes


def replicas_of_group(st: dict, g: int) -> list[str]:
    return [n["address"] for n in st["nodes"] if any(x["group"] == g for x in n["groups"])]


def test_the_metadata_group_records_the_placement(five, client5):
    """Every node's metadata replica holds the placement the founding nodes computed."""
    st = _status(client5)
    wait_until(lambda: all(_placement_of(client5, a) for a in five.addresses), timeout=20,
               what="the placement recorded on every node")
    for a in five.addresses:
        recorded = _placement_of(client5, a)
        for g in range(1, GROUPS + 1):
            assert sorted(recorded[g]) == sorted(replicas_of_group(st, g))


def _placement_of(client, address) -> dict[int, list[str]]:
    return client.cluster_status(address)["placement"]


def test_any_node_routes_produce_and_fetch_to_the_groups_it_does_not_hold(five):
    """A client that knows only one node reaches every group (not-leader hints
    name a replica, then the leader) and reads back what it wrote."""
    for a in five.addresses:
        c = Client([a])
        try:
            name = f"routed-{a.rsplit(':', 1)[1]}"
            c.create_topic(name, queues=GROUPS)
            for q in range(GROUPS):
                c.produce(name, [f"{q}-{i}".encode() for i in range(3)], queue=q)
            for q in range(GROUPS):
                assert [r.value for r in c.fetch(name, q, 0).records] == [f"{q}-{i}".encode() for i in range(3)]
            offs = c.offsets(name)
            assert [(o.queue, o.earliest, o.latest) for o in offs] == [(q, 0, 3) for q in range(GROUPS)]
            info = c.describe_topic(name)["queue_info"]
            assert [q["latest"] for q in info] == [3] * GROUPS
            assert all(q["leader"] for q in info)
        finally:
            c.close()


# ------------------------------------------------------------- joins and moves
def moving(st: dict) -> list[int]:
    """Data groups whose voters (as their leader reports them) differ from the record."""
    out = []
    for g, want in st["placement"].items():
        leader = next((gs for n in st["nodes"] for gs in n["groups"]
                       if gs["group"] == g and gs["leader"] == n["address"]), None)
        if leader is None or sorted(leader["replicas"]) != sorted(want):
            out.append(g)
    return out


def settled(client) -> dict:
    """Cluster status once no group is moving and every rebalance asked is done."""
    def done():
        st = client.cluster_status()
        return st if not moving(st) and st["rebalance_done"] >= st["rebalance_asked"] else None
    return wait_until(done, timeout=180, interval=0.5, what="the controller settling")


def per_node(st: dict) -> tuple[dict, dict]:
    replicas = collections.Counter(a for reps in st["placement"].values() for a in reps)
    leaders = collections.Counter(gs["leader"] for n in st["nodes"] for gs in n["groups"]
                                  if gs["group"] != 0 and gs["leader"] == n["address"])
    return replicas, leaders


def _port_taken_once(monkeypatch):
    """The next port block LocalCluster chooses has its raft port (the gRPC port + 1)
    already bound; a socket to close afterwards."""
    import socket

    import storage_service.local.cluster as local_cluster

    real, held = local_cluster.free_port_block, socket.socket()

    def first_taken(size, host="127.0.0.1", avoid=()):
        base = real(size, host, avoid)
        held.bind((host, base + 1))
        held.listen()
        monkeypatch.setattr(local_cluster, "free_port_block", real)
        return base

    monkeypatch.setattr(local_cluster, "free_port_block", first_taken)
    return held


def test_join_rebalance_and_decommission_keep_every_message(tmp_path, monkeypatch):
    # The first founder's raft port is taken before it starts: the new cluster starts
    # again on ports chosen anew (nothing ran on the first ones).
    taken = _port_taken_once(monkeypatch)
    c = start_cluster(tmp_path / "grow", nodes=3, groups=6, extra_args=("--replication-factor", "3"))
    taken.close()
    assert open(f"{c.log_dir}/node-0.log").read().count("each node needs its gRPC port") == 1
    client = Client(c.endpoints)
    try:
        client.create_topic("elastic", queues=6)
        sent = {q: [] for q in range(6)}

        def produce(tag: str, n: int = 20) -> None:
            for q in range(6):
                vals = [f"{tag}-{q}-{i}".encode() for i in range(n)]
                client.produce("elastic", vals, queue=q)
                sent[q] += vals

        produce("before")
        c.add_node()
        # The second joiner finds the block chosen for it taken (something bound its
        # raft port in between, as another test's process can): it starts again on
        # another block, and nothing names the address it never joined with.
        taken = _port_taken_once(monkeypatch)
        c.add_node()
        taken.close()
        log = open(f"{c.log_dir}/node-4.log").read()
        assert log.count("each node needs its gRPC port") == 1, log[-2000:]
        st = client.cluster_status()
        assert {m["address"] for m in st["members"]} == set(c.addresses)
        assert all(m["state"] == "active" for m in st["members"])
        produce("joined")

        out = rmq(c, "cluster", "rebalance", "--wait", timeout=240).stdout
        assert "rebalance: done" in out, out
        st = settled(client)
        # 6 groups x 3 replicas on 3 nodes is 6 per node; on 5 nodes the cluster grows to
        # 10 groups (still 6 per node), and new queues go to the new groups
        assert sorted(st["placement"]) == list(range(1, 11)), st["placement"]
        new = client.create_topic("elastic-new", queues=4)
        assert sorted(new["queue_groups"]) == [7, 8, 9, 10], new["queue_groups"]
        for q in range(4):
            client.produce("elastic-new", [f"n{q}".encode()], queue=q)
            assert [r.value for r in client.fetch("elastic-new", q, 0).records] == [f"n{q}".encode()]
        replicas, leaders = per_node(st)
        assert set(replicas) == set(c.addresses), replicas
        assert max(replicas.values()) - min(replicas.values()) <= 1, replicas
        assert max(leaders.values()) - min(leaders[a] for a in c.addresses) <= 1, leaders
        assert all(len(set(r)) == 3 for r in st["placement"].values())
        produce("balanced")

        gone = c.addresses[0]
        out = rmq(c, "cluster", "decommission", gone, "--wait", "--timeout", "180", timeout=240).stdout
        assert f"decommission {gone}: done" in out, out
        view = json.loads(rmq(c, "cluster", "status", "--json").stdout)
        assert gone not in [n["address"] for n in view["nodes"]]          # out of the cluster
        assert next(m for m in client.cluster_status()["members"] if m["address"] == gone)["state"] == "removed"
        assert all(gone not in g["replicas"] for g in view["groups"] if g["group"] != 0)
        assert all(g["leader"] and not g["moving"] for g in view["groups"]), view["groups"]
        st = settled(client)
        assert all(gone not in r and len(set(r)) == 3 for r in st["placement"].values()), st["placement"]
        c.kill(0)
        produce("after")
        for q in range(6):
            got = [r.value for r in client.fetch("elastic", q, 0, max_messages=10_000).records]
            assert got == sent[q], (q, len(got), len(sent[q]))
    finally:
        client.close()
        c.stop()


def test_admin_calls_refuse_what_the_record_does_not_say(five):
    """Cluster-admin RPCs change nothing the placement record does not ask for: a
    voter added or removed outside it, a join by a node that is not listening."""
    from storage_service.proto import rmq_pb2
    c = Client(five.endpoints)
    try:
        st = c.cluster_status()
        g, reps = next(iter(st["placement"].items()))
        outsider = next(a for a in five.addresses if a not in reps)
        with pytest.raises(Exception, match="does not name"):
            c.call("ChangeReplicas", rmq_pb2.ChangeReplicasRequest(group=g, add=outsider), group=g)
        with pytest.raises(Exception, match="still names"):
            c.call("ChangeReplicas", rmq_pb2.ChangeReplicasRequest(group=g, remove=reps[-1]), group=g)
        with pytest.raises(Exception, match="not in the cluster"):
            c.call("ChangeReplicas", rmq_pb2.ChangeReplicasRequest(group=0, add="127.0.0.1:9"), group=0)
        with pytest.raises(Exception, match="does not answer"):
            c.call("JoinCluster", rmq_pb2.JoinClusterRequest(address="127.0.0.1:9"), group=0)
        after = c.cluster_status()
        assert after["placement"] == st["placement"] and after["members"] == st["members"]
    finally:
        c.close()


def test_cluster_commands_refuse_bad_input(five):
    bad = rmq(five, "cluster", "decommission", "10.9.9.9:1", check=False)
    assert bad.returncode != 0 and "is not in the cluster" in bad.stderr, bad.stderr
    # five nodes, groups of three: decommissioning three would leave two
    c = Client(five.endpoints)
    try:
        with pytest.raises(Exception, match="add a node first"):
            for a in five.addresses[:3]:
                c.cluster_command("decommission", a)
        st = c.cluster_status()
        assert [m["state"] for m in st["members"]].count("leaving") == 2
    finally:
        c.close()


def test_a_node_down_past_repair_after_has_its_replicas_recreated_and_rejoins_cleanly(tmp_path):
    c = start_cluster(tmp_path / "repair", nodes=4, groups=4,
                      extra_args=("--replication-factor", "3", "--repair-after", "3"))
    client = Client(c.endpoints)
    try:
        client.create_topic("repaired", queues=4)
        for q in range(4):
            client.produce("repaired", [f"{q}-{i}".encode() for i in range(50)], queue=q)
        st = client.cluster_status()
        dead = c.addresses[1]
        held = [g for g, reps in st["placement"].items() if dead in reps]
        assert held, st["placement"]
        c.kill(1)
        st = wait_until(lambda: (s := client.cluster_status()) and not moving(s)
                        and all(dead not in r for r in s["placement"].values()) and s,
                        timeout=120, interval=0.5, what=f"{dead}'s replicas re-created elsewhere")
        assert all(len(set(r)) == 3 for r in st["placement"].values()), st["placement"]
        for q in range(4):
            client.produce("repaired", [f"{q}-late".encode()], queue=q)
            got = [r.value for r in client.fetch("repaired", q, 0, max_messages=1000).records]
            assert got == [f"{q}-{i}".encode() for i in range(50)] + [f"{q}-late".encode()]
        # it comes back: it drops the replicas it no longer holds and serves again
        c.start_node(1)
        c.wait_ready(60, nodes=[1])
        wait_until(lambda: not [g for n in client.cluster_status()["nodes"] if n["address"] == dead
                                for g in n["groups"] if g["group"] != 0],
                   timeout=60, interval=0.5, what=f"{dead} dropping the replicas moved away")
        assert rmq(c, "cluster", "rebalance", "--wait", timeout=240).returncode == 0
        st = settled(client)
        replicas, _ = per_node(st)
        assert replicas[dead] >= 2, replicas              # 12 replicas over 4 nodes: 3 each
        for q in range(4):
            assert len(client.fetch("repaired", q, 0, max_messages=1000).records) == 51
    finally:
        client.close()
        c.stop()


def test_a_decommissioned_metadata_leader_hands_the_group_on_while_still_running(tmp_path):
    """The node leading the metadata group is decommissioned and left running (it "can
    be stopped", not must). Its handlers refuse everything once it is removed, its own
    hand-off of the leadership too: the group kept a leader that answered nothing and
    every admin call spun for 30 s. Now the controller hands it on straight to raft."""
    from rmq_spark.cli._status import cluster_view
    c = start_cluster(tmp_path / "meta-leader", nodes=4, groups=4, extra_args=("--replication-factor", "3"))
    client = Client(c.endpoints, timeout=60)
    try:
        lead = cluster_view(client.cluster_status())["groups"][0]["leader"]
        out = rmq(c, "cluster", "decommission", lead, "--wait", "--timeout", "180", timeout=240).stdout
        assert f"decommission {lead}: done" in out, out
        wait_until(lambda: cluster_view(client.cluster_status())["groups"][0]["leader"] not in ("", lead),
                   timeout=60, interval=0.5, what="another node leading the metadata group")
        other = next(a for a in c.addresses if a != lead)
        with Client([lead] + [a for a in c.addresses if a != lead], timeout=20) as first_the_removed:
            with pytest.raises(FailedPrecondition, match="would leave 2 active node"):
                first_the_removed.cluster_command("decommission", other)
        assert c.procs[c.addresses.index(lead)].poll() is None          # it was never stopped
    finally:
        client.close()
        c.stop()
