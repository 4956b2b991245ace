"""An elastic cluster (issue 19): five real node processes, each data group on
three of them, every group of a node over its one raft port."""
from __future__ import annotations

import collections

import pytest

from rmq_spark.client import Client
from tests.conftest import start_cluster, wait_until

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
