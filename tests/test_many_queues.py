"""More queues than a node has file descriptors (issue 19, many queues).

Every queue kept three files open on every node for as long as it ran: about
6,600 queues used up the 20,000 descriptors of a node, the segment-sync
thread took the EMFILE for a disk error, and every node stopped at once.
Here the nodes run with a limit of 512 descriptors (``prlimit``) and hold 700
queues (2,100 files to write): they stay up, within the limit, and every
queue's message reads back.
"""
from __future__ import annotations

import os
import shutil

import pytest

from rmq_spark.client import Client
from storage_service.local import LocalCluster

from .conftest import wait_until
from .fixtures.make_datadir import applied_everywhere

pytestmark = pytest.mark.integration

FD_LIMIT = 512
QUEUES = 700


class _LimitedCluster(LocalCluster):
    def node_command(self, i: int) -> list[str]:
        return ["prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}", "--", *super().node_command(i)]


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux's prlimit to cap a node's descriptors")
def test_nodes_with_fewer_descriptors_than_queue_files_keep_serving(tmp_path):
    cluster = _LimitedCluster(nodes=3, groups=2, data_dir=str(tmp_path))
    cluster.start(timeout=90)
    try:
        with Client(cluster.endpoints, timeout=60) as client:
            client.create_topic("many", queues=QUEUES)
            for q in range(QUEUES):
                client.produce("many", [f"m{q}".encode()], queue=q)
            peak = max(_open_fds(p.pid) for p in cluster.procs)
            for q in range(QUEUES):                 # every queue reads back, from its leader
                assert [r.value for r in client.fetch("many", q, 0).records] == [f"m{q}".encode()]
            for q in range(0, QUEUES, 7):           # and from every replica
                for addr in cluster.addresses:
                    res = client.fetch("many", q, 0, from_follower=True, address=addr)
                    assert [r.value for r in res.records] == [f"m{q}".encode()], (q, addr)
            peak = max(peak, *(_open_fds(p.pid) for p in cluster.procs))
        assert all(p.poll() is None for p in cluster.procs), "a node stopped"
        assert peak < FD_LIMIT, peak
        for i in range(3):
            with open(os.path.join(cluster.log_dir, f"node-{i}.log")) as f:
                text = f.read()
            assert "Too many open files" not in text and "CRITICAL" not in text, text[-3000:]
    finally:
        cluster.stop()


def test_queues_past_the_clusters_limit_are_refused_and_nothing_changes(tmp_path):
    from rmq_spark.client import ResourceExhausted

    cluster = LocalCluster(nodes=3, groups=2, data_dir=str(tmp_path), extra_args=["--max-queues", "50"])
    cluster.start(timeout=90)
    try:
        with Client(cluster.endpoints, timeout=30) as client:
            client.create_topic("first", queues=40)
            with pytest.raises(ResourceExhausted, match=r"topic 'second': 20 more queues would make 60 "
                                                        r"in the cluster; the limit is 50 \(rmq-storage --max-queues\)"):
                client.create_topic("second", queues=20)
            with pytest.raises(ResourceExhausted, match="11 more queues would make 51"):
                client.alter_topic("first", queues=51)
            assert [(t["name"], t["queues"]) for t in client.list_topics()] == [("first", 40)]
            client.create_topic("second", queues=10)                   # up to the limit is fine
            client.delete_topic("first")
            client.create_topic("third", queues=40)                    # deleting frees its queues
    finally:
        cluster.stop()


def test_twenty_thousand_queues_on_five_nodes_within_the_file_budget(tmp_path):
    """The bounded version of bench/scale.py's 100,000-queue run: 20,000 queues over
    five nodes (10 groups of 3 replicas), one message each, a budget of 1,500 open
    segment files per node; every node stays within it and the messages read back,
    also after a restart of the whole cluster."""
    from rmq_spark.client import Message
    budget, n = 1500, 20_000
    cluster = LocalCluster(nodes=5, groups=10, data_dir=str(tmp_path),
                           extra_args=["--max-open-files", str(budget)])
    cluster.start(timeout=90)
    topics = [(f"big-{i}", 4000) for i in range(n // 4000)]
    try:
        with Client(cluster.endpoints, timeout=120) as client:
            for name, k in topics:
                client.create_topic(name, queues=k)
            pairs = [(name, q) for name, k in topics for q in range(k)]
            for i in range(0, len(pairs), 500):
                client.produce_batches([(name, q, [Message(f"{name}/{q}".encode())]) for name, q in pairs[i:i + 500]])
            fds = [_open_fds(p.pid) for p in cluster.procs]
            assert max(fds) < budget + 300, fds         # segment files + sockets, journals, the JVM-free rest
            st = client.cluster_status()
            per_node = [sum(a in r for r in st["placement"].values()) for a in cluster.addresses]
            assert per_node == [6] * 5, per_node           # 10 groups x 3 replicas over 5 nodes
            sample = pairs[::97]
            for name, q in sample:
                assert [r.value for r in client.fetch(name, q, 0).records] == [f"{name}/{q}".encode()]
        cluster.stop()
        cluster.start(timeout=300)
        with Client(cluster.endpoints, timeout=120) as client:
            for name, q in sample[::5]:
                assert [r.value for r in client.fetch(name, q, 0).records] == [f"{name}/{q}".encode()]
        assert all(p.poll() is None for p in cluster.procs), "a node stopped"
    finally:
        cluster.stop()


def _fill_and_restart(cluster, topic: str, queues: int) -> None:
    """One message to each of ``queues`` queues, a restart of the whole cluster, and a
    wait until every node has opened them all again."""
    with Client(cluster.endpoints, timeout=60) as client:
        client.create_topic(topic, queues=queues)
        for i in range(0, queues, 100):
            client.produce_batches([(topic, q, [f"{topic}{q}".encode()]) for q in range(i, i + 100)])
        # A produce is acked once a majority holds it: the third replica may apply the last
        # entries only after it hears the next commit index. Stopped before that, it gets them
        # from the leader after the restart and opens those queues as it applies them.
        wait_until(lambda: applied_everywhere(client), timeout=60, what="every replica applied every entry")
    cluster.stop()
    cluster.start(timeout=90)
    wait_until(lambda: all(cluster.health(i).queues_open == queues for i in range(3)), timeout=120,
               what="every queue opened")


def _opened_behind(cluster, i: int) -> int:
    """How many queues node ``i``'s background pass opened (its log's last "done" line)."""
    with open(os.path.join(cluster.log_dir, f"node-{i}.log")) as f:
        done = [line for line in f if "opening queues" in line and "done" in line]
    assert done, f"node {i} logged no end of its background opening"
    return int(done[-1].split("(")[1].split()[0])


def test_a_restarted_node_serves_first_and_opens_its_queues_behind(tmp_path):
    """Queues found on disk at start open when used or in the background, not before the
    node serves (statemachine/queue_logs.py): after a restart every queue reads back, Health
    counts them open, and most were opened by the background pass."""
    queues = 2000
    cluster = LocalCluster(nodes=3, groups=2, data_dir=str(tmp_path),
                           extra_args=["--compaction-entries", "5"])      # restarts load a snapshot
    cluster.start(timeout=90)
    try:
        _fill_and_restart(cluster, "lazy", queues)
        health = [cluster.health(i) for i in range(3)]
        assert all(h.queues_total == queues for h in health), health     # every node holds a replica of each
        with Client(cluster.endpoints, timeout=60) as client:
            for q in range(0, queues, 7):
                assert [r.value for r in client.fetch("lazy", q, 0).records] == [f"lazy{q}".encode()]
        for i in range(3):
            assert _opened_behind(cluster, i) >= queues // 2
    finally:
        cluster.stop()


def test_local_gives_up_on_nodes_that_make_no_progress_and_says_who(tmp_path):
    """``LocalCluster.wait_ready`` (``rmq-storage local``) waits for as long as the nodes
    get on (issue 39.5: not a fixed 60 s), and gives up on a node that makes no
    progress: here one node of three, alone, can elect no leader."""
    cluster = LocalCluster(nodes=3, groups=1, data_dir=str(tmp_path))
    said: list[str] = []
    try:
        cluster.start_node(0)
        with pytest.raises(TimeoutError, match=r"nodes \[0\] not ready: no progress for 3.0s"):
            cluster.wait_ready(3.0, nodes=[0], say=said.append)
        assert said and all(line.startswith("waiting for nodes: 0 (") for line in said), said
    finally:
        cluster.stop()


def test_a_graceful_restart_replays_nothing_so_no_queue_is_opened_before_the_node_serves(tmp_path):
    """A node stopped with SIGTERM writes a snapshot of what it applied (``snapshot_at_stop``):
    at restart no journal entry is replayed, so no queue is opened by a replay (issue 39.5:
    a journal of first appends to 100,000 queues took 68 s to replay); the background pass
    opens them all, and every message reads back."""
    queues = 300
    cluster = LocalCluster(nodes=3, groups=2, data_dir=str(tmp_path))      # no snapshot while running
    cluster.start(timeout=90)
    try:
        _fill_and_restart(cluster, "calm", queues)
        assert [_opened_behind(cluster, i) for i in range(3)] == [queues] * 3     # all behind, none by replay
        with Client(cluster.endpoints, timeout=60) as client:
            for q in range(0, queues, 11):
                assert [r.value for r in client.fetch("calm", q, 0).records] == [f"calm{q}".encode()]
    finally:
        cluster.stop()
