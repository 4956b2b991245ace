"""A full disk is a shortage, not a failure: refused, handed over, caught up (``log/diskspace.py``).

Real small filesystems: each test mounts a sized tmpfs (root, as on CI).
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from rmq_spark.client import Client, RmqError, ResourceExhausted
from storage_service.local import LocalCluster
from storage_service.log.diskspace import LOOKUP_EVERY, Shortage
from storage_service.log.queue_log import QueueLog
from storage_service.protocol.framing import frame_batch, iter_batches, next_offset

from .node_faults import MiB, Tmpfs, bounded, fatal_stops
from .workload import leader_index
from .unit._helpers import encode_values

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root (CI runs as root)")]


@pytest.fixture
def small_disk(tmp_path):
    disk = Tmpfs(str(tmp_path / "disk"), 8 * MiB)
    yield disk
    disk.unmount()


def _batch(base: int, n: int = 50, size: int = 2000) -> bytes:
    return frame_batch(base, 1000 + base, n, base + 1, encode_values([b"v" * size] * n))


def test_segment_append_on_a_full_filesystem_keeps_files_whole(small_disk):
    """ENOSPC part way through a batch: the write is cut back, Shortage raised, the
    files end where they did; after space is freed appends go on and a reopen
    finds every batch."""
    filler = small_disk.fill(leave=3 * MiB, name="other")   # another writer's file, freed later
    q = QueueLog(os.path.join(small_disk.path, "t~1~0"), segment_bytes=1 * MiB)
    frames = []
    with pytest.raises(Shortage) as err:
        while True:
            f = _batch(q.next_offset)
            q.append(f, next(iter_batches(f)))
            frames.append(f)
    assert "No space left" in str(err.value) and q.path in str(err.value)
    ends = q.next_offset
    assert sum(len(f) for f in frames) == sum(s.size for s in q.segments)
    for seg in q.segments:
        assert os.path.getsize(seg.file("log")) == seg.size
    os.unlink(filler)
    f = _batch(q.next_offset)
    q.append(f, next(iter_batches(f)))
    q.close()
    again = QueueLog(q.path, segment_bytes=1 * MiB)
    assert again.next_offset == ends + 50
    got, off = [], 0
    while off < again.next_offset:
        data = bytes(again.read(off, 64 * MiB))
        got.append(data)
        off = next_offset(data, off)
    assert b"".join(got) == b"".join(frames + [f])


def test_full_node_refuses_produce_and_serves_reads(tmp_path):
    disk = Tmpfs(str(tmp_path / "node-0"), 48 * MiB)
    try:
        with LocalCluster(nodes=1, groups=1, data_dir=str(tmp_path),
                          extra_args=["--min-free-bytes", str(8 * MiB)]) as cluster, \
                Client(cluster.endpoints, timeout=3) as client:
            client.create_topic("t", queues=1)
            client.produce("t", [b"before"], queue=0)
            filler = disk.fill(leave=4 * MiB)
            # The node reuses a free-space lookup for LOOKUP_EVERY s: one made just before the
            # fill (the produce above) could still be the one it answers from. Past that, the
            # next lookup sees the fill, however loaded the machine (clone 4 of 2026-11-27 met it).
            time.sleep(2 * LOOKUP_EVERY)
            with pytest.raises(ResourceExhausted) as err:
                client.produce("t", [b"refused"], queue=0)
            msg = str(err.value)
            assert cluster.addresses[0] in msg and disk.path in msg and "--min-free-bytes" in msg, msg
            assert [r.value for r in client.fetch("t", 0, 0).records] == [b"before"]   # reads go on
            os.unlink(filler)
            client.produce("t", [b"after"], queue=0, timeout=10)
            cluster.kill(0, signal.SIGKILL)
            cluster.start_node(0)
            cluster.wait_ready(60)
            assert [r.value for r in client.fetch("t", 0, 0).records] == [b"before", b"after"]
            assert not fatal_stops(cluster)
    finally:
        disk.unmount()


def test_a_leader_whose_followers_have_no_room_refuses_writes(tmp_path):
    """Two of three replicas below their reserve: the leader, with room itself, refuses
    a write naming them (it could not commit; it used to take it into its journal and
    the client waited for the commit timeout). A refused write is never stored; once
    space is freed writes go on and nothing acknowledged is lost."""
    disks = [Tmpfs(str(tmp_path / f"node-{i}"), 48 * MiB) for i in range(3)]
    try:
        with LocalCluster(nodes=3, groups=1, data_dir=str(tmp_path),
                          extra_args=["--min-free-bytes", str(8 * MiB)]) as cluster, \
                Client(cluster.endpoints, timeout=3) as client:
            client.create_topic("t", queues=1)
            client.produce("t", [b"before"], queue=0, timeout=30)
            lead = leader_index(client, cluster, 1)
            followers = [i for i in range(3) if i != lead]
            fillers = [disks[i].fill(leave=4 * MiB) for i in followers]
            # A free-space lookup is reused for LOOKUP_EVERY s: past that the
            # followers' next lookup sees the fill. They tell the leader with their
            # next heartbeats; a write sent before it heard is taken into its
            # journal, not by theirs (it waits, and times out here).
            time.sleep(2 * LOOKUP_EVERY)
            refused, attempts, deadline = None, 0, time.monotonic() + 60
            while refused is None and time.monotonic() < deadline:
                attempts += 1
                try:
                    client.produce("t", [b"try-%d" % attempts], queue=0)
                    pytest.fail(f"try-{attempts} was acknowledged with two of three replicas full")
                except ResourceExhausted as e:
                    refused = e
                except RmqError:
                    pass                              # taken before the leader heard: unknown
            assert refused is not None, "the leader never refused a write its followers had no room for"
            msg = str(refused)
            assert "no majority" in msg and "--min-free-bytes" in msg, msg
            for i in followers:
                assert cluster.addresses[i] in msg and disks[i].path in msg, msg
            for f in fillers:
                os.unlink(f)
            client.produce("t", [b"after"], queue=0, timeout=30)
            values = [r.value for r in client.fetch("t", 0, 0).records]
            assert values[0] == b"before" and values[-1] == b"after", values
            assert b"try-%d" % attempts not in values, values    # the refused write
            assert not fatal_stops(cluster)
    finally:
        for d in disks:
            d.unmount()


def test_disk_full_scenario_bounded(tmp_path):
    """``make jepsen``'s disk-full scenario, bounded: node 2's disk fills under load."""
    rep = bounded("disk-full", str(tmp_path), seconds=12)
    assert rep.measured["acked_while_full"] > 0


def test_an_entry_whose_apply_meets_a_full_disk_is_applied_again_with_the_same_answers(small_disk):
    """Apply of a two-batch entry: the first batch fits, the second meets ENOSPC.
    The entry is applied again once space is freed (never skipped), and the batch
    written the first time answers its first offsets again, without a second copy."""
    from storage_service.statemachine.commands import Produce, ProduceItem
    from storage_service.statemachine.data import DataState

    st = DataState(os.path.join(small_disk.path, "queues"), fsync=False, segment_bytes=64 * MiB)
    block = encode_values([b"v" * 1000] * 100)
    filler = small_disk.fill(leave=len(block) * 3 // 2, name="other")
    entry = Produce((ProduceItem("t~1~0", "", 0, 1000, 100, block),
                     ProduceItem("t~1~1", "", 0, 1000, 100, block + block + block))).encode()
    with pytest.raises(Shortage):
        st.apply(7, entry)
    assert st.queue("t~1~0").next_offset == 100 and st.queue("t~1~1").next_offset == 0
    os.unlink(filler)
    first, second = st.apply(7, entry)
    assert first == (0, 100, 1000, False) and second[:2] == (0, 100)
    assert st.queue("t~1~0").next_offset == 100 and st.queue("t~1~1").next_offset == 100
