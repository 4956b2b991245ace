"""Thousands of waiting consumers: a long-polling fetch holds no thread of the node.

Before, each node's gRPC pool had 64 threads and a waiting fetch held one:
200 consumers polling with ``wait_ms=5000`` made a single produce wait up to
6 s. Now waiting fetches are parked (``storage_service/server/dispatch.py``).
The figures (produce p50/p99 with 2,000 pollers against none) are in
``bench/many_clients.py``; this test checks what does not depend on the
machine's speed: 2,000 parked fetches on a 3-node cluster, node thread counts
that stay small, producers served throughout, every poll answered, every
poller woken by the message produced to its queue, and the limits refusing
work with RESOURCE_EXHAUSTED (retried by the client) instead of queueing it.
The 2,000 polls sent at once also go past gRPC's own backlog of calls not yet
picked up by the node's loop (1,000, then random drops answered CANCELLED):
the node's server raises it to what its limits admit (``AsyncServer._start``).
"""
from __future__ import annotations

import grpc
import pytest

from rmq_spark.client import Client, Overloaded
from storage_service.local import LocalCluster
from storage_service.proto import rmq_pb2, rmq_pb2_grpc
from storage_service.protocol.placement import GRPC_OPTIONS

from .conftest import wait_until
from .crowd import PollCrowd, Producers, leaders_of

pytestmark = pytest.mark.integration

POLLERS = 2000
QUEUES = 40


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def _parked(client) -> int:
    return sum(n["parked_fetches"] for n in client.cluster_status()["nodes"])


def test_two_thousand_waiting_fetches_hold_no_threads(tmp_path):
    with LocalCluster(nodes=3, groups=3, data_dir=str(tmp_path)) as cluster, \
            Client(cluster.endpoints, timeout=30) as client:
        client.create_topic("quiet", queues=QUEUES)
        client.create_topic("busy", queues=6)
        # Polls wait 12 s: the crowd re-issues 2,000 answered polls from one callback
        # thread, which on a busy machine takes seconds; with a short wait the first
        # re-issued polls time out again before the last are parked, and the moment when
        # all 2,000 are parked at once never comes.
        crowd = PollCrowd(leaders_of(client, "quiet", QUEUES), "quiet", POLLERS, wait_ms=12000).start()
        producers = Producers(client, "busy", 6, n=10).start()
        try:
            # Every poll is parked at once on the nodes, each holding no thread (the pools
            # have 64 each), while the producers are served.
            seen = []

            def all_parked() -> bool:
                seen.append((_parked(client), len(producers.latencies)))
                return seen[-1][0] == POLLERS and seen[-1][1] > 50
            wait_until(all_parked, timeout=90,
                       what=lambda: f"all {POLLERS} polls parked and 50 produces served (last "
                                    f"seen: parked, produces = {seen[-1]})")
            assert all(_threads(cluster.pid(i)) < 64 + 100 for i in range(3))
            wait_until(lambda: len(crowd.latencies) >= POLLERS, timeout=90)   # every poll timed out once
            # The message produced to each quiet queue wakes every poller of that queue.
            for q in range(QUEUES):
                client.produce("quiet", [f"wake-{q}".encode()], queue=q)
            try:
                wait_until(lambda: all(crowd.received[i] == 1 for i in range(POLLERS)), timeout=60)
            except AssertionError:
                woken = sum(1 for i in range(POLLERS) if crowd.received[i] == 1)
                raise AssertionError(f"{woken} of {POLLERS} pollers got their queue's message in 60 s; "
                                     f"{crowd.outstanding} polls outstanding; errors {dict(crowd.errors)} "
                                     f"{crowd.error_details}; leaders now {leaders_of(client, 'quiet', QUEUES)}")
        finally:
            producers.stop()
            crowd.stop()
        assert not crowd.errors, crowd.error_details
        assert not producers.errors, producers.errors[:3]
        assert len(producers.latencies) > 50


def _blocking_fetches(address: str, n: int, wait_ms: int):
    chan = grpc.insecure_channel(address, options=GRPC_OPTIONS)
    stub = rmq_pb2_grpc.MessageLogStub(chan)
    futs = [stub.Fetch.future(rmq_pb2.FetchRequest(topic="t", queue=0, offset=0, wait_ms=wait_ms), timeout=30)
            for _ in range(n)]
    return chan, futs


def test_limits_refuse_with_resource_exhausted(tmp_path):
    with LocalCluster(nodes=1, groups=1, data_dir=str(tmp_path),
                      extra_args=["--max-parked-fetches", "20"]) as cluster, \
            Client(cluster.endpoints, timeout=10) as client:
        client.create_topic("t", queues=1)
        chan, futs = _blocking_fetches(cluster.addresses[0], 30, wait_ms=3000)
        try:
            refused = [f.exception() for f in futs if f.exception() is not None]
            assert len(refused) == 10, [e.details() for e in refused]
            for e in refused:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "limit of 20 waiting fetches" in e.details() and "--max-parked-fetches" in e.details()
                assert cluster.addresses[0] in e.details()
            # A refusal for load is retriable: the client's own fetch waits its turn and succeeds.
            client.produce("t", [b"m"], queue=0)
            assert [r.value for r in client.fetch("t", 0, 0).records] == [b"m"]
        finally:
            chan.close()


def test_overloaded_is_retriable():
    from rmq_spark.client.errors import from_status
    from storage_service.protocol.errors import RETRY_AFTER_METADATA_KEY
    err = from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "node x is at its limit", retry_after="50")
    assert isinstance(err, Overloaded) and err.retriable
    assert RETRY_AFTER_METADATA_KEY == "rmq-retry-after-ms"
    plain = from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue budget")
    assert not plain.retriable
