"""A data directory written by an earlier version starts and reads back.

``tests/fixtures/datadir-*.tar.gz`` were written by ``tests/fixtures/make_datadir.py``
at the commit named in their ``expected.json``: raft journals and snapshots
(data and metadata groups), segments, producer-dedupe state, consumer
offsets, watermarks. The nodes get fresh ports (the layout file is rewritten);
nothing else is touched.
"""
from __future__ import annotations

import glob
import json
import os
import tarfile

import pytest

from rmq_spark.client import Client, Message
from storage_service.local import LocalCluster, free_port_block

from .conftest import wait_until
from .fixtures.make_datadir import read_all

pytestmark = pytest.mark.integration
FIXTURES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "fixtures", "datadir-*.tar.gz")))


@pytest.fixture(params=FIXTURES, ids=lambda p: os.path.basename(p))
def old_cluster(request, tmp_path):
    with tarfile.open(request.param) as tar:
        tar.extractall(tmp_path, filter="data")
    expected = json.loads((tmp_path / "expected.json").read_text())
    span = expected["groups"] + 3
    bases: list[int] = []
    for _ in range(expected["nodes"]):
        bases.append(free_port_block(span, avoid=[b + k for b in bases for k in range(span)]))
    (tmp_path / "cluster.json").write_text(json.dumps(
        {"nodes": expected["nodes"], "groups": expected["groups"],
         "addresses": [f"127.0.0.1:{b}" for b in bases]}))
    cluster = LocalCluster(data_dir=str(tmp_path))
    cluster.start(timeout=90)
    yield cluster, expected
    cluster.stop()


def test_old_datadir_reads_back(old_cluster):
    cluster, expected = old_cluster
    with Client(cluster.endpoints) as c:
        topics = {t["name"]: t for t in c.list_topics()}
        assert set(topics) == set(expected["topics"])
        for name, old in expected["topics"].items():
            # every field the old version had, unchanged; fields added since at their defaults
            assert {k: topics[name][k] for k in old} == old
            # (queue_groups empty: an old topic keeps the hash placement its queues were made with)
            assert {k: v for k, v in topics[name].items() if k not in old} == \
                {"compacted_table": "", "queue_groups": []}
        # Every group of every node replayed its journal past its snapshot:
        # the same records, byte for byte, from the leaders ...
        assert read_all(c) == expected["records"]
        assert c.committed_offsets("readers", "plain") == {int(q): o for q, o in
                                                           expected["committed"]["readers/plain"].items()}
        marks = {q["queue"]: q["archived"] for q in c.describe_topic("tiered")["queue_info"]}
        assert marks == {int(q): o for q, o in expected["watermarks"].items()}
        # ... and from every replica.
        for address in cluster.addresses:
            wait_until(lambda: read_all(c, address) == expected["records"], timeout=30,
                       what=f"every record read back from {address}")


def test_old_datadir_keeps_producer_state_and_takes_writes(old_cluster):
    cluster, expected = old_cluster
    with Client(cluster.endpoints) as c:
        # A retry of a batch acknowledged by the old version is recognised as one.
        last = expected["producers"][-1]
        again = c.produce(last["topic"], [b"retry"], queue=last["queue"],
                          producer_id=last["producer_id"], sequence=last["sequence"])
        assert again[0].duplicate and again[0].base_offset == last["base_offset"]
        before = expected["records"]["plain/0"]["count"]
        res = c.produce("plain", [Message(value=b"new", tags="T9")], queue=0)
        assert res[0].base_offset == before and not res[0].duplicate
        assert [r.value for r in c.fetch("plain", 0, before).records] == [b"new"]
        # The deleted topic's leftover queue is dropped by the new version.
        wait_until(lambda: not glob.glob(os.path.join(cluster.data_dir, "node-*", "group-*", "queues",
                                                      "gone~*")), timeout=30, what="deleted topic's queue dropped")
