"""Whole-cluster restart, node kill/restart and a wiped node catching up from peers."""
from __future__ import annotations

import shutil
import signal

import pytest

from rmq_spark.client import Client

from .conftest import start_cluster, wait_until

pytestmark = pytest.mark.integration


def read_all(client: Client, topic: str, queue: int, address=None) -> list[bytes]:
    out, off = [], 0
    while True:
        res = client.fetch(topic, queue, off, max_bytes=1 << 20, from_follower=address is not None,
                           address=address)
        if not res.records:
            return out
        out += [r.value for r in res.records]
        off = res.next_offset


@pytest.fixture(scope="module")
def rcluster(tmp_path_factory):
    # A small compaction threshold makes leaders snapshot often, so a wiped
    # node must catch up through a snapshot install + segment fetch.
    c = start_cluster(tmp_path_factory.mktemp("recovery"), extra_args=["--compaction-entries", "20"])
    yield c
    c.stop()


def test_whole_cluster_restart_keeps_data(rcluster):
    with Client(rcluster.endpoints) as c:
        c.create_topic("restart", queues=3)
        for q in range(3):
            for i in range(30):
                c.produce("restart", [f"{q}-{i}".encode()], queue=q)
    rcluster.stop()
    rcluster.start(timeout=90)
    with Client(rcluster.endpoints) as c:
        for q in range(3):
            assert read_all(c, "restart", q) == [f"{q}-{i}".encode() for i in range(30)]
        assert c.produce("restart", [b"after"], queue=0)[0].base_offset == 30


def test_killed_node_restarts_and_catches_up(rcluster):
    with Client(rcluster.endpoints) as c:
        c.create_topic("killone", queues=2)
        c.produce("killone", [b"before"] * 5, queue=0)
        rcluster.kill(1, signal.SIGKILL)
        for i in range(50):
            c.produce("killone", [f"m{i}".encode()], queue=0)
        rcluster.start_node(1)
        rcluster.wait_ready(60)
        want = [b"before"] * 5 + [f"m{i}".encode() for i in range(50)]
        wait_until(lambda: read_all(c, "killone", 0, rcluster.addresses[1]) == want,
                   what="restarted node to catch up")


def test_wiped_node_rebuilds_from_peers(rcluster):
    with Client(rcluster.endpoints) as c:
        c.create_topic("wipe", queues=2)
        for i in range(60):
            c.produce("wipe", [f"a{i}".encode() * 50], queue=i % 2)
        rcluster.kill(2, signal.SIGKILL)
        shutil.rmtree(f"{rcluster.data_dir}/node-2")
        for i in range(60, 120):
            c.produce("wipe", [f"a{i}".encode() * 50], queue=i % 2)
        rcluster.start_node(2)
        rcluster.wait_ready(60)
        for q in range(2):
            want = [f"a{i}".encode() * 50 for i in range(q, 120, 2)]
            wait_until(lambda: read_all(c, "wipe", q, rcluster.addresses[2]) == want, timeout=60,
                       what=f"wiped node to rebuild queue {q}")
        # The raft logs were compacted, so the rebuild went through a snapshot.
        st = c.cluster_status()
        assert all(g["raft_log_entries"] < 200 for n in st["nodes"] for g in n["groups"])
        with open(f"{rcluster.data_dir}/node-2.log") as f:
            assert "catching up" in f.read()


def test_wiped_node_rebuilds_a_compacted_queue_with_its_gaps(rcluster):
    from rmq_spark.client import Message

    def keyed(c, address=None):
        out, off = [], 0
        while True:
            res = c.fetch("wipe-compact", 0, off, max_bytes=256 << 10, from_follower=address is not None,
                          address=address)
            out += [(r.offset, r.key, r.value) for r in res.records]
            if res.next_offset >= res.latest:
                return out
            off = res.next_offset

    with Client(rcluster.endpoints) as c:
        c.create_topic("wipe-compact", queues=1, cleanup_policy="compact")
        for round_ in range(15):
            c.produce("wipe-compact", [Message(key=b"k%d" % k, value=b"%d" % round_ * 1024) for k in range(30)],
                      queue=0)
        c.set_watermark("wipe-compact", "compaction", {0: 450},      # as the compaction job, under its lease
                        c.lease("wipe-compact", "compact", "test-job", 60_000)[3])
        for i in range(10):
            c.produce("wipe-compact", [Message(key=b"t%d" % i, value=b"t" * 1024)] * 10, queue=0)
        wait_until(lambda: all(len(keyed(c, a)) < 300 for a in rcluster.addresses), timeout=60,
                   what="every replica to compact")
        want = keyed(c)
        rcluster.kill(2, signal.SIGKILL)
        shutil.rmtree(f"{rcluster.data_dir}/node-2")
        for i in range(30):      # enough raft entries that node 2 must install a snapshot
            c.produce("wipe-compact", [Message(key=b"n%d" % i, value=b"new")], queue=0)
        want += [(550 + i, b"n%d" % i, b"new") for i in range(30)]
        rcluster.start_node(2)
        rcluster.wait_ready(60)
        # The rebuilt replica copies the compacted batches, gaps and all, at the same offsets.
        # (It may then compact its copy further: segment boundaries are its own.)
        latest = {k: (o, v) for o, k, v in want}
        got = wait_until(lambda: (lambda r: r if {k: (o, v) for o, k, v in r} == latest else None)(
            keyed(c, rcluster.addresses[2])), timeout=60, what="wiped node to rebuild the compacted queue")
        assert set(got) <= set(want)
        assert [r for r in got if r[0] >= 450] == [r for r in want if r[0] >= 450]
        assert c.produce("wipe-compact", [Message(key=b"k0", value=b"last")], queue=0)[0].base_offset == 580
