"""Pipelined producers (``Client.producer``): several requests in flight per node, each
queue's batches stored once and in order: across refusals, a leader killed mid-stream and
a batch that fails for good; in-order sequence checks and the commit backlog on the node."""
from __future__ import annotations

import os
import signal
import threading

import grpc
import pytest

from rmq_spark.client import Client, Message, ResourceExhausted, RmqError
from storage_service.local import LocalCluster
from storage_service.proto import rmq_pb2, rmq_pb2_grpc
from storage_service.protocol.records import encode

from .conftest import wait_until
from .wire import leader_of
from .test_recovery import read_all

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pcluster(tmp_path_factory):
    # a small backlog limit: one ProduceBatches request of many batches meets it (and the
    # default 64 MiB segments: the suite's 64 KiB ones would make every batch a new segment)
    c = LocalCluster(nodes=3, groups=4, data_dir=str(tmp_path_factory.mktemp("producer")),
                     extra_args=["--max-commit-backlog", str(256 << 10)])
    c.start(timeout=90)
    yield c
    c.stop()


def _values(q: int, first: int, n: int, per: int) -> list[list[bytes]]:
    return [[f"{q}:{b}:{i}".encode() for i in range(per)] for b in range(first, first + n)]


def _expected(q: int, n: int, per: int) -> list[bytes]:
    return [v for batch in _values(q, 0, n, per) for v in batch]


def test_pipelined_batches_are_stored_once_and_in_order(pcluster):
    with Client(pcluster.endpoints) as c:
        c.create_topic("piped", queues=8)
        with c.producer(max_in_flight=5) as p:
            futures = [(q, b, p.send("piped", q, vals)) for b in range(40) for q in range(8)
                       for vals in [_values(q, b, 1, 20)[0]]]
            p.flush()
            peak = p.peak_in_flight
        for q in range(8):
            offsets = [f.result().base_offset for qq, b, f in futures if qq == q]
            assert offsets == [20 * b for b in range(40)], q       # in the order sent, once each
            assert read_all(c, "piped", q) == _expected(q, 40, 20)
        assert peak > 1, "no node ever had two requests of the producer in flight"


def test_send_block_keeps_the_callers_identity_pipelines_each_run_and_resends_are_duplicates(pcluster):
    """The Spark sink's way (``send_block``): the caller numbers its batches by rows, a new
    micro-batch starts a new run (a jump in sequence), and a retried task sends the same
    batches again: each stored once, in order."""
    def block(b, n=10):
        return encode([f"{b}:{i}".encode() for i in range(n)])

    with Client(pcluster.endpoints) as c:
        c.create_topic("blocks", queues=2)
        runs = [(1 << 32) * run + 10 * b for run in range(3) for b in range(12)]       # 3 micro-batches
        with c.producer(max_in_flight=5) as p:
            first = [p.send_block("blocks", q, block(i), 10, producer_id="task-7", sequence=seq)
                     for i, seq in enumerate(runs) for q in (0, 1)]
            p.flush()
            again = [p.send_block("blocks", 0, block(i), 10, producer_id="task-7", sequence=seq)
                     for i, seq in enumerate(runs)]                                   # a retried task
            p.flush()
            with pytest.raises(RmqError, match="producer id and a sequence"):
                p.send_block("blocks", 0, block(0), 10, producer_id="", sequence=0)
        assert not any(f.result().duplicate for f in first)
        assert all(f.result().duplicate for f in again)
        # the node remembers a producer's last 8 batches per queue: those answer with their offsets
        assert [f.result().base_offset for f in again[-8:]] == [f.result().base_offset for f in first[-16::2]]
        for q in (0, 1):
            assert read_all(c, "blocks", q) == [f"{i}:{j}".encode() for i in range(len(runs)) for j in range(10)]


def _stub(cluster, i: int):
    return rmq_pb2_grpc.MessageLogStub(grpc.insecure_channel(cluster.addresses[i]))


def _batch(topic, q, seq, n, pid="p-in-order", in_order=True):
    block = encode([f"{seq + i}".encode() for i in range(n)])
    return rmq_pb2.ProduceRequest(topic=topic, queue=q, records=block, count=n, producer_id=pid,
                                  sequence=seq, in_order=in_order)


def test_an_in_order_batch_past_the_next_sequence_is_refused_and_changes_nothing(pcluster):
    with Client(pcluster.endpoints) as c:
        c.create_topic("order", queues=1)
        stub = _stub(pcluster, leader_of(c, "order", 0))

        def send(*batch_args, **kw):
            return stub.ProduceBatches(rmq_pb2.ProduceBatchesRequest(batches=[_batch("order", 0, *batch_args, **kw)]),
                                       timeout=10).outcomes[0]
        assert send(500, 10, pid="new").code == 0            # an unknown producer starts anywhere
        assert send(0, 10).code == 0
        gap = send(20, 10)
        assert gap.code == grpc.StatusCode.ABORTED.value[0]
        assert "out of order" in gap.message and "sequence 10 comes next" in gap.message, gap.message
        assert send(20, 10, in_order=False).code == 0 and send(30, 5, pid="other", in_order=False).code == 0
        assert send(20, 10).result.duplicate                  # stored by the not-in-order send
        assert send(40, 5).code == grpc.StatusCode.ABORTED.value[0]      # 30 comes next
        again = send(0, 10)
        assert again.code == 0 and again.result.duplicate and again.result.base_offset == 10
        # nothing the refusals carried was stored
        assert [int(v) for v in read_all(c, "order", 0)] == \
            list(range(500, 510)) + list(range(0, 10)) + list(range(20, 30)) + list(range(30, 35))


def test_a_full_commit_backlog_refuses_with_resource_exhausted_naming_the_limit(pcluster):
    with Client(pcluster.endpoints) as c:
        c.create_topic("backlog", queues=1)
        stub = _stub(pcluster, leader_of(c, "backlog", 0))
        value = b"v" * 1024
        batches = [rmq_pb2.ProduceRequest(topic="backlog", queue=0, records=encode([value] * 64),
                                          count=64) for _ in range(200)]      # 64 KiB each, 12.5 MiB in all
        outs = stub.ProduceBatches(rmq_pb2.ProduceBatchesRequest(batches=batches), timeout=60).outcomes
        refused = [o for o in outs if o.code]
        assert refused, "200 batches of 64 KiB to one group never met a 256 KiB backlog"
        for o in refused:
            assert o.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], o.message
            assert "--max-commit-backlog" in o.message and "the limit is 256 KiB per group" in o.message, o.message
            assert o.retry_after_ms > 0
        stored = sum(1 for o in outs if not o.code)
        assert len(read_all(c, "backlog", 0)) == 64 * stored     # the refused ones changed nothing
        # the client's producer backs off and retries: every batch lands, in order
        with c.producer() as p:
            futures = [p.send("backlog", 0, [Message(f"{i}".encode() + value)] * 64) for i in range(100)]
            p.flush()
        assert [f.result().base_offset for f in futures] == [64 * (stored + i) for i in range(100)]


def test_a_backlog_of_many_small_batches_refuses_with_resource_exhausted_naming_the_limit(pcluster):
    """Bytes are not the only limit: 2,000 batches of one small message each (~60 KiB in
    all, far under --max-commit-backlog) would each cost an apply on the node's raft
    thread, so a group takes MAX_BACKLOG_ITEMS of them to commit later and refuses the
    rest. The followers are stopped meanwhile, so nothing drains."""
    from storage_service.server.writes import MAX_BACKLOG_ITEMS
    from .scrape import scrape
    with Client(pcluster.endpoints) as c:
        c.create_topic("many-small", queues=1)
        leader = leader_of(c, "many-small", 0)
        group = c.group_of("many-small", 0)
        followers = [pcluster.pid(i) for i in range(3) if i != leader]
        batches = [rmq_pb2.ProduceRequest(topic="many-small", queue=0, records=encode([b"%d" % i]), count=1)
                   for i in range(2000)]
        refused_so_far = ("rmq_produce_backlog_refused_total", ())
        before = scrape(pcluster, leader).get(refused_so_far, 0)
        for pid in followers:
            os.kill(pid, signal.SIGSTOP)
        try:
            call = _stub(pcluster, leader).ProduceBatches.future(
                rmq_pb2.ProduceBatchesRequest(batches=batches), timeout=120)
            # (the followers stay stopped until the leader has refused one: the backlog was full)
            wait_until(lambda: scrape(pcluster, leader).get(refused_so_far, 0) > before, timeout=60,
                       what="a batch refused by the leader")
        finally:
            for pid in followers:
                os.kill(pid, signal.SIGCONT)
        outs = call.result().outcomes
        assert scrape(pcluster, leader)[("rmq_commit_backlog_batches", (("group", str(group)),))] == 0
        refused = [o for o in outs if o.code]
        assert refused, "2,000 batches to one group with its followers stopped met no limit"
        for o in refused:
            assert o.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], o.message
            assert f"the limit is {MAX_BACKLOG_ITEMS:,} batches per group" in o.message, o.message
            assert o.retry_after_ms > 0
        stored = [b"%d" % i for i, o in enumerate(outs) if not o.code]
        assert read_all(c, "many-small", 0) == stored          # in order; the refused changed nothing


def test_a_batch_that_fails_for_good_fails_the_later_ones_and_the_queue_goes_on(pcluster):
    with Client(pcluster.endpoints) as c:
        c.create_topic("fails", queues=1)
        with c.producer() as p:
            first = p.send("fails", 0, [Message(b"a")])
            first.result(timeout=30)                           # the queue knows the producer now
            bad = p.send("fails", 0, [Message(b"x" * (5 << 20))])     # over the 4 MiB message limit
            later = p.send("fails", 0, [Message(b"b")])
            p.flush()
            with pytest.raises(ResourceExhausted, match="the limit is 4194304 bytes"):
                bad.result()
            try:
                later.result()            # sent with it (stored) or failed with it: never out of order
            except RmqError as e:
                assert "an earlier batch" in str(e)
            after = p.send("fails", 0, [Message(b"c")])
            assert after.result(timeout=30).count == 1
        values = read_all(c, "fails", 0)
        assert values in ([b"a", b"c"], [b"a", b"b", b"c"]), values


def test_a_callers_identity_that_failed_for_good_refuses_later_batches(pcluster):
    """send_block: once a batch of a (queue, producer id) failed for good, a later batch
    of that identity is refused, not stored past the gap (the caller's retry, with the
    same ids and sequences, would then take the missing batch for a duplicate)."""
    with Client(pcluster.endpoints) as c:
        c.create_topic("fails-ids", queues=1)
        with c.producer() as p:
            ok = p.send_block("fails-ids", 0, encode([b"a"]), 1, producer_id="task-1", sequence=0)
            ok.result(timeout=30)
            bad = p.send_block("fails-ids", 0, encode([b"x" * (5 << 20)]), 1, producer_id="task-1", sequence=1)
            with pytest.raises(ResourceExhausted):
                bad.result(timeout=30)
            later = p.send_block("fails-ids", 0, encode([b"b"]), 1, producer_id="task-1", sequence=2)
            with pytest.raises(RmqError, match="had a batch fail for good .sequence 1.; later batches"):
                later.result(timeout=30)
            other = p.send_block("fails-ids", 0, encode([b"c"]), 1, producer_id="task-1-retry", sequence=0)
            assert other.result(timeout=30).count == 1
        assert read_all(c, "fails-ids", 0) == [b"a", b"c"]


def test_a_failing_producer_thread_answers_every_batch_and_flush_returns(pcluster):
    """Whatever breaks the producer's own thread, no caller waits forever: every batch not
    answered fails, flush() (and close(), and with it a Spark task) returns, and the
    producer refuses new batches."""
    with Client(pcluster.endpoints) as c:
        c.create_topic("dies", queues=1)
        p = c.producer()

        def boom():
            raise RuntimeError("injected")
        p._dispatch = boom
        f = p.send("dies", 0, [b"a"])
        p.flush(timeout=30)
        with pytest.raises(RmqError, match="producer's thread failed"):
            f.result(timeout=0)
        with pytest.raises(RmqError, match="closed"):
            p.send("dies", 0, [b"b"])
        p.close()


def test_a_leader_killed_mid_stream_loses_and_duplicates_nothing(pcluster):
    with Client(pcluster.endpoints, timeout=60) as c:
        c.create_topic("kill", queues=4)
        victim = leader_of(c, "kill", 0)
        stop, futures = threading.Event(), []
        with c.producer(timeout=60) as p:
            def produce():
                b = 0
                while not stop.is_set() or b < 30:
                    for q in range(4):
                        futures.append((q, p.send("kill", q, _values(q, b, 1, 10)[0])))
                    b += 1
                    if len(futures) > 400:
                        futures[-400][1].result()
                return b
            result = {}
            t = threading.Thread(target=lambda: result.setdefault("n", produce()))
            t.start()
            wait_until(lambda: len(futures) >= 80, what="batches under way")
            pcluster.kill(victim, signal.SIGKILL)
            wait_until(lambda: len(futures) >= 400, timeout=60, what="batches after the kill")
            pcluster.start_node(victim)
            pcluster.wait_ready(90)
            stop.set()
            t.join(timeout=120)
            p.flush()
        n = result["n"]
        for q in range(4):
            assert [f.result().base_offset for qq, f in futures if qq == q] == [10 * b for b in range(n)]
            assert read_all(c, "kill", q) == _expected(q, n, 10), q


def test_a_sent_batch_cannot_be_cancelled_and_flush_from_a_callback_is_refused(pcluster):
    with Client(pcluster.endpoints) as c:
        c.create_topic("cancel", queues=1)
        with c.producer() as p:
            f = p.send("cancel", 0, [Message(b"a")])
            assert not f.cancel()                  # queued: it will be answered, flush never hangs on it
            errors = []

            def flush_here(_):
                try:
                    p.flush(timeout=1)
                except RmqError as e:
                    errors.append(e)
            p.send("cancel", 0, [Message(b"b")]).add_done_callback(flush_here)
            p.flush(timeout=30)
        assert f.result().base_offset == 0
        assert errors and "would wait for itself" in str(errors[0])
        assert read_all(c, "cancel", 0) == [b"a", b"b"]
