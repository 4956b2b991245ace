import os
import socket
import subprocess
import sys

import pytest

from storage_service.local import LocalCluster, free_port_block
from storage_service.local.cluster import PORTS_PER_NODE

pytestmark = pytest.mark.integration


def test_produce_fetch_roundtrip(client, topic):
    res = client.produce(topic, [b"a", b"b", b"c"], queue=2)
    assert [(r.queue, r.base_offset, r.count) for r in res] == [(2, 0, 3)]
    got = client.fetch(topic, 2, 0)
    assert [r.value for r in got.records] == [b"a", b"b", b"c"]
    assert [r.offset for r in got.records] == [0, 1, 2]
    assert got.next_offset == 3



def _processes_with(text: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def test_a_cluster_that_cannot_start_leaves_no_node_running(tmp_path):
    """A node whose raft port is taken exits naming it: start() fails naming the node
    and stops the nodes it started (a ``with`` block never reaches __exit__)."""
    base = free_port_block(15)
    taken = socket.socket()
    taken.bind(("127.0.0.1", base + PORTS_PER_NODE + 1))   # node 1's raft port (gRPC, raft, produce, cluster, HTTP)
    taken.listen()
    data_dir = str(tmp_path / "cluster")
    cluster = LocalCluster(nodes=3, groups=4, data_dir=data_dir, port=base)
    try:
        with pytest.raises(RuntimeError, match=r"node 1 exited with 2"):
            cluster.start(timeout=8)
    finally:
        taken.close()
    with open(os.path.join(data_dir, "node-1.log")) as f:
        assert f"raft port 127.0.0.1:{base + PORTS_PER_NODE + 1}" in f.read()
    assert cluster.procs == [None, None, None]
    assert _processes_with(data_dir) == []


def test_a_node_whose_grpc_port_is_taken_exits_2_naming_it(tmp_path):
    """gRPC's own bind failure (its port taken) is a clear exit 2, not a traceback."""
    base = free_port_block(4)
    taken = socket.socket()
    taken.bind(("127.0.0.1", base))
    taken.listen()
    try:
        out = subprocess.run([sys.executable, "-m", "storage_service.cli", "node", "--id", "0",
                              "--nodes", f"127.0.0.1:{base}", "--replication-factor", "1",
                              "--data-dir", str(tmp_path / "n")], capture_output=True, text=True, timeout=60)
    finally:
        taken.close()
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"127.0.0.1:{base}" in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
