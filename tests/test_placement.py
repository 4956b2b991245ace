"""Queue placement recorded by the metadata group (issue 19), on a real cluster."""
from __future__ import annotations

import pytest

from rmq_spark.client import Client

pytestmark = pytest.mark.integration


def test_a_topics_queues_are_placed_on_every_group_and_clients_route_by_it(client, cluster):
    """Placement is recorded per queue (issue 19): a topic of as many queues as groups
    gets one queue per group (the hash put 4-queue topics in 2 of 4 groups)."""
    name = "placed-evenly"
    created = client.create_topic(name, queues=cluster.groups)
    assert sorted(created["queue_groups"]) == list(range(1, cluster.groups + 1))
    info = client.describe_topic(name)["queue_info"]
    assert [q["group"] for q in info] == created["queue_groups"]
    fresh = Client(cluster.endpoints)                  # a client that never saw the topic
    try:
        assert [fresh.group_of(name, q) for q in range(cluster.groups)] == created["queue_groups"]
        for q in range(cluster.groups):
            fresh.produce(name, [f"v{q}".encode()], queue=q)
            assert [r.value for r in fresh.fetch(name, q, 0).records] == [f"v{q}".encode()]
        grown = fresh.alter_topic(name, queues=cluster.groups + 2)
        assert grown["queue_groups"][:cluster.groups] == created["queue_groups"]
        fresh.produce(name, [b"new"], queue=cluster.groups + 1)
        assert [r.value for r in client.fetch(name, cluster.groups + 1, 0).records] == [b"new"]
    finally:
        fresh.close()
