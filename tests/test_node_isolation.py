"""One writer per data directory, and listeners on the node's own address only.

A second ``rmq-storage local`` (or ``rmq-storage node``, or ``LocalCluster``)
on a data directory in use fails at once naming the holder's pid and changes
nothing; every port a node listens on (gRPC, raft, produce) is bound to the
node's address, never 0.0.0.0.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from rmq_spark.client import Client
from storage_service.local import LocalCluster
from storage_service.log.dirlock import DirectoryInUse, DirectoryLock

from .conftest import start_cluster, wait_until

pytestmark = pytest.mark.integration
BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("isolation"), groups=2)
    with Client(c.endpoints) as client:
        client.create_topic("kept", queues=1)
        client.produce("kept", [b"before"], queue=0)
        # Every replica has applied it (its segment file written): the tests compare the
        # node's files before and after a second writer tried, and a follower applying
        # the message meanwhile read as a change (a busy machine, once).
        for a in c.addresses:
            wait_until(lambda: [r.value for r in client.fetch("kept", 0, 0, from_follower=True,
                                                                address=a).records] == [b"before"],
                       timeout=60, what=f"the message applied on {a}")
    yield c
    c.stop()


def _snapshot(path: str) -> dict[str, tuple[int, int]]:
    """Every file of the node's queues, with its size and mtime (what a second writer would touch)."""
    out = {}
    for root, _, files in os.walk(path):
        if "queues" in root.split(os.sep):
            for f in files:
                st = os.stat(os.path.join(root, f))
                out[os.path.join(root, f)] = (st.st_size, st.st_mtime_ns)
    return out


def test_second_local_cluster_on_a_directory_in_use_fails_naming_the_pid(running):
    before = open(os.path.join(running.data_dir, "cluster.json")).read()
    p = subprocess.run([os.path.join(BIN, "rmq-storage"), "local", "--data-dir", running.data_dir,
                        "--port", "20000"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert f"data directory {running.data_dir} is in use by pid {os.getpid()}" in p.stderr
    assert "endpoints:" not in p.stdout
    assert open(os.path.join(running.data_dir, "cluster.json")).read() == before   # --port changed nothing
    with pytest.raises(DirectoryInUse, match=f"in use by pid {os.getpid()}"):
        LocalCluster(data_dir=running.data_dir)
    with Client(running.endpoints) as c:             # the running cluster is untouched
        assert [r.value for r in c.fetch("kept", 0, 0).records] == [b"before"]


def test_second_node_on_a_node_directory_in_use_fails_naming_the_pid(running):
    node_dir = os.path.join(running.data_dir, "node-1")
    before = _snapshot(node_dir)
    cmd = running.node_command(1)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert f"data directory {node_dir} is in use by pid {running.pid(1)}" in p.stderr
    assert "rmq-storage: " in p.stderr and "Traceback" not in p.stderr
    assert _snapshot(node_dir) == before
    with Client(running.endpoints) as c:
        c.produce("kept", [b"after"], queue=0)
        assert [r.value for r in c.fetch("kept", 0, 0).records] == [b"before", b"after"]


def test_lock_is_released_by_a_killed_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from storage_service.log.dirlock import DirectoryLock; "
        f"DirectoryLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DirectoryInUse, match=f"pid {holder.pid}"):
            DirectoryLock(str(tmp_path)).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with DirectoryLock(str(tmp_path)):                # kill -9 left the file, not the lock
        pass


def _listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on (IPv4 and IPv6)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:           # 0A: LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            if width == 32 and hexaddr.startswith("0000000000000000FFFF0000"):
                hexaddr, width = hexaddr[24:], 8                 # ::ffff:a.b.c.d (gRPC's socket)
            if width == 8:
                addr = ".".join(str(int(hexaddr[i:i + 2], 16)) for i in (6, 4, 2, 0))
            else:
                addr = "::" if int(hexaddr, 16) == 0 else hexaddr
            out.append((addr, int(hexport, 16)))
    return out


def test_every_listener_binds_the_node_address_only(running):
    for i, address in enumerate(running.addresses):
        host, port = address.rsplit(":", 1)
        socks = wait_until(lambda: _listening(running.pid(i)), what=f"node {i}'s listeners")
        ports = sorted(p for _, p in socks)
        # gRPC, the raft port (every group of the node: raft/mux.py), the produce port, HTTP
        # (the cluster port, + 3, only with TLS)
        assert ports == [int(port), int(port) + 1, int(port) + 2, int(port) + 4], socks
        assert {a for a, _ in socks} == {host}, socks
