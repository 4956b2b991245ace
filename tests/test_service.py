"""Produce, fetch, offsets, long-poll, consumer offsets and errors on a real 3-node cluster."""
from __future__ import annotations

import re
import threading
import time

import grpc
import pytest

from rmq_spark.client import (Client, InvalidArgument, Message, NotFound, OutOfRange,
                              ResourceExhausted)
from rmq_spark.client._messages import to_pb as client_to_pb
from storage_service.proto import rmq_pb2, rmq_pb2_grpc

from .conftest import wait_until

pytestmark = pytest.mark.integration


def test_produce_spreads_over_groups_and_reads_back(client, topic):
    for q in range(4):
        client.produce(topic, [f"q{q}-{i}".encode() for i in range(10)], queue=q)
    groups = {client.group_of(topic, q) for q in range(4)}
    assert len(groups) > 1, "test topic should span several raft groups"
    for q in range(4):
        got = client.fetch(topic, q, 0)
        assert [r.value for r in got.records] == [f"q{q}-{i}".encode() for i in range(10)]
        assert [r.offset for r in got.records] == list(range(10))


def test_all_message_fields_round_trip(client, topic):
    m = Message(value=b"\x00\xffbin", key=b"k", tags="TagA", properties={"a": "1", "b": "2"},
                born_timestamp=1234)
    [res] = client.produce(topic, [m], queue=1)
    [r] = client.fetch(topic, 1, res.base_offset).records
    assert (r.key, r.value, r.tags, r.properties, r.born_timestamp) == (b"k", b"\x00\xffbin", "TagA",
                                                                          {"a": "1", "b": "2"}, 1234)
    assert r.store_timestamp == res.store_timestamp and r.msg_id


def test_service_chooses_queue_by_key_hash(client, topic):
    res = client.produce(topic, [Message(value=b"1", key=b"user-7"), Message(value=b"2", key=b"user-7")])
    assert len(res) == 1 and res[0].count == 2
    again = client.produce(topic, [Message(value=b"3", key=b"user-7")])
    assert again[0].queue == res[0].queue


def test_store_timestamps_non_decreasing_and_timestamp_seek(client, topic):
    stamps = []
    for i in range(5):
        stamps.append(client.produce(topic, [f"m{i}".encode()], queue=0)[0].store_timestamp)
        time.sleep(0.01)
    assert stamps == sorted(stamps)
    assert client.offset_for_timestamp(topic, 0, stamps[2]) <= 2
    assert client.offset_for_timestamp(topic, 0, stamps[-1] + 1) == 5
    assert client.offset_for_timestamp(topic, 0, 0) == 0


def test_long_poll_returns_when_data_arrives(client, topic):
    timer = threading.Timer(0.3, lambda: client.produce(topic, [b"late"], queue=3))
    timer.start()
    t0 = time.monotonic()
    got = client.fetch(topic, 3, 0, wait_ms=30_000)
    timer.join()
    assert [r.value for r in got.records] == [b"late"]
    # woke on the produce, not at the 30 s deadline (a wide margin, not a timing target)
    assert time.monotonic() - t0 < 15


def test_long_poll_times_out_empty(client, topic):
    got = client.fetch(topic, 2, 0, wait_ms=200)
    assert got.records == [] and got.next_offset == 0


def test_offsets_and_consumer_group_offsets(client, topic):
    client.produce(topic, [b"x"] * 7, queue=1)
    offs = {o.queue: (o.earliest, o.latest) for o in client.offsets(topic)}
    assert offs == {0: (0, 0), 1: (0, 7), 2: (0, 0), 3: (0, 0)}
    client.commit_offsets("g1", topic, {1: 5})
    assert client.committed_offsets("g1", topic) == {1: 5}
    # Any node answers this from its metadata replica, which may trail the leader briefly.
    wait_until(lambda: "g1" in client.consumer_groups(topic), timeout=5, what="g1 listed")


def test_idempotent_retry_is_applied_once(client, topic):
    first = client.produce(topic, [b"a", b"b"], queue=0, producer_id="p1", sequence=100)
    retry = client.produce(topic, [b"a", b"b"], queue=0, producer_id="p1", sequence=100)
    assert retry[0].duplicate and retry[0].base_offset == first[0].base_offset
    older = client.produce(topic, [b"z"], queue=0, producer_id="p1", sequence=50)
    assert older[0].duplicate
    assert client.offsets(topic)[0].latest == 2


def test_follower_read_and_not_leader_redirect(cluster, client, topic):
    client.produce(topic, [b"r1", b"r2"], queue=2)
    g = client.group_of(topic, 2)
    leader = client.cluster_status()["nodes"][0]["groups"][g]["leader"]
    followers = [a for a in cluster.addresses if a != leader]
    # a follower serves committed data when asked (it may lag by a tick)
    got = wait_until(lambda: client.fetch(topic, 2, 0, from_follower=True, address=followers[0]).records,
                     what="follower to apply")
    assert [r.value for r in got] == [b"r1", b"r2"]
    # a follower refuses to take a write and names the leader
    with grpc.insecure_channel(followers[1]) as ch:
        with pytest.raises(grpc.RpcError) as exc:
            rmq_pb2_grpc.MessageLogStub(ch).Produce(rmq_pb2.ProduceRequest(
                topic=topic, queue=2, messages=[rmq_pb2.Message(value=b"x")]), timeout=5)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ("rmq-leader", leader) in exc.value.trailing_metadata()


@pytest.mark.parametrize("call, error, text", [
    (lambda c, t: c.produce("bad name!", [b"x"], queue=0), InvalidArgument, "topic name"),
    (lambda c, t: c.produce("no-such-topic", [b"x"], queue=0), NotFound, "does not exist"),
    (lambda c, t: c.produce(t, [], queue=0), InvalidArgument, "at least one message"),
    (lambda c, t: c.produce(t, [b"x"], queue=9), InvalidArgument, "valid queues are 0..3"),
    (lambda c, t: c.produce(t, [b"x" * (5 << 20)], queue=0), ResourceExhausted, "limit"),
    (lambda c, t: c.fetch(t, 0, -1), InvalidArgument, "negative"),
    (lambda c, t: c.fetch(t, 0, 99), OutOfRange, "earliest=0 latest=0"),
    (lambda c, t: c.create_topic(t), Exception, "already exists"),
    (lambda c, t: c.create_topic("x" * 128), InvalidArgument, "1-127"),
    (lambda c, t: c.create_topic("ok-name", queues=0), InvalidArgument, "queues=0"),
    (lambda c, t: c.create_topic("ok-name2", cleanup_policy="shred"), InvalidArgument, "cleanup_policy"),
    (lambda c, t: c.create_topic("ok-name3", tier="delta:rel/archive"), InvalidArgument,
     "must be absolute"),
    (lambda c, t: c.alter_topic(t, tier="parquet:archive"), InvalidArgument, "must be absolute"),
    (lambda c, t: c.alter_topic(t, tier="delta:s3a://"), InvalidArgument, "with a bucket"),
    (lambda c, t: c.alter_topic(t, tier="delta:s3a://AK:SeCrEt@bkt/a"), InvalidArgument,
     "'delta:s3a://***@bkt/a'"),
    (lambda c, t: c.alter_topic(t, tier="delta:ftp://host/a"), InvalidArgument, "must be absolute"),
    (lambda c, t: c.commit_offsets("g", t, {7: 1}), InvalidArgument, "queue 7"),
])
def test_bad_input_is_rejected_and_changes_nothing(client, topic, call, error, text):
    before = client.offsets(topic)
    with pytest.raises(error) as exc:
        call(client, topic)
    assert text in str(exc.value)
    assert client.offsets(topic) == before
    assert {t["name"] for t in client.list_topics()} >= {topic}
    assert not {"ok-name", "ok-name3"} & {t["name"] for t in client.list_topics()}
    assert client.describe_topic(topic)["tier"] == ""


def test_out_of_range_error_carries_bounds(client, topic):
    client.produce(topic, [b"1", b"2"], queue=0)
    with pytest.raises(OutOfRange) as exc:
        client.fetch(topic, 0, 5)
    assert (exc.value.earliest, exc.value.latest) == (0, 2)


def test_delete_topic(client):
    client.create_topic("to-delete", queues=2)
    client.produce("to-delete", [b"x"], queue=0)
    client.delete_topic("to-delete")
    with pytest.raises(NotFound):
        client.fetch("to-delete", 0, 0)
    client.create_topic("to-delete", queues=2)          # re-create: a new, empty topic
    assert [o.latest for o in client.offsets("to-delete")] == [0, 0]


def test_retention_by_bytes_advances_earliest(client):
    client.create_topic("ret-bytes", queues=1, retention_bytes=256 << 10)
    for _ in range(40):
        client.produce("ret-bytes", [b"v" * 1024] * 20, queue=0)      # 800 KiB in 64 KiB segments
    # Retention runs every 0.5 s, possibly mid-way through the produce loop:
    # wait for a pass after the last produce to bring the size down.
    d = wait_until(lambda: (lambda q: q if q["size_bytes"] <= (256 << 10) + (128 << 10) else None)(
        client.describe_topic("ret-bytes")["queue_info"][0]), what="retention to delete segments")
    assert d["size_bytes"] >= 256 << 10            # as in Kafka, at least retention_bytes stay
    o = client.offsets("ret-bytes")[0]
    assert o.latest == 800 and o.earliest == d["earliest"] > 0
    got = client.fetch("ret-bytes", 0, o.earliest)
    assert got.records[0].offset == o.earliest
    with pytest.raises(OutOfRange):
        client.fetch("ret-bytes", 0, 0)


def test_retention_by_time(client):
    client.create_topic("ret-time", queues=1, retention_ms=1000)
    for _ in range(10):
        client.produce("ret-time", [b"v" * 1024] * 20, queue=0)
    time.sleep(1.2)
    client.produce("ret-time", [b"new"], queue=0)
    wait_until(lambda: client.offsets("ret-time")[0].earliest > 0, what="time retention")
    assert client.offsets("ret-time")[0].latest == 201


def test_cluster_status_names_pids_and_leaders(cluster, client):
    st = client.cluster_status()
    assert st["groups"] == 3
    assert sorted(n["pid"] for n in st["nodes"]) == sorted(cluster.pid(i) for i in range(3))
    for n in st["nodes"]:
        assert len(n["groups"]) == 4
        assert all(g["leader"] in cluster.addresses for g in n["groups"])


def test_tag_filter_runs_on_the_server_and_keeps_offsets(client, topic):
    msgs = [Message(value=f"m{i}".encode(), tags=["TagA", "TagB", "TagC"][i % 3]) for i in range(9)]
    client.produce(topic, msgs, queue=1)
    client.produce(topic, [Message(value=b"only-c", tags="TagC")], queue=1)
    got = client.fetch(topic, 1, 0, tags="TagA || TagC")
    assert [(r.offset, r.tags) for r in got.records] == [
        (0, "TagA"), (2, "TagC"), (3, "TagA"), (5, "TagC"), (6, "TagA"), (8, "TagC"), (9, "TagC")]
    only_b = client.fetch(topic, 1, 9, tags="TagB")
    assert only_b.records == [] and only_b.next_offset == 10     # filtered out, still advances
    rb, nxt, _, _ = client.fetch_arrow(topic, 1, 0, tags="TagB")
    assert rb.column("offset").to_pylist() == [1, 4, 7] and nxt == 10
    with pytest.raises(InvalidArgument, match="not a tag"):
        client.fetch(topic, 1, 0, tags="TagA | TagB")


def test_fetch_arrow_matches_record_fetch(client, topic):
    msgs = [Message(value=f"v{i}".encode(), key=None if i % 2 else f"k{i}".encode(), tags="T",
                    properties={"i": str(i)}, born_timestamp=1000 + i) for i in range(50)]
    for i in range(0, 50, 10):
        client.produce(topic, msgs[i:i + 10], queue=0)
    recs = client.fetch(topic, 0, 5).records
    rb, nxt, earliest, latest = client.fetch_arrow(topic, 0, 5, end=45)
    assert (nxt, earliest, latest) == (50, 0, 50)
    rows = rb.to_pylist()
    assert [r["offset"] for r in rows] == list(range(5, 45))
    for row, rec in zip(rows, recs):
        assert (row["key"], row["value"], row["tags"], dict(row["properties"]), row["msg_id"]) == \
            (rec.key, rec.value, rec.tags, rec.properties, rec.msg_id)
        assert round(row["born_timestamp"].timestamp() * 1000) == rec.born_timestamp
        assert round(row["timestamp"].timestamp() * 1000) == rec.store_timestamp


def test_fetch_answer_reads_with_the_generated_stub_too(client, topic):
    """The node encodes Fetch answers by hand (fetchwire): a client generated from
    the .proto alone must parse them into the same FetchResponse."""
    for i in range(0, 30, 10):
        client.produce(topic, [f"m{j}".encode() for j in range(i, i + 10)], queue=2)
    ours = client.fetch_raw(topic, 2, 13)
    addr = ours.served_by
    with grpc.insecure_channel(addr) as ch:
        theirs = rmq_pb2_grpc.MessageLogStub(ch).Fetch(
            rmq_pb2.FetchRequest(topic=topic, queue=2, offset=13, allow_follower=True), timeout=10)
    assert (theirs.next_offset, theirs.earliest, theirs.latest, theirs.served_by) == \
        (ours.next_offset, ours.earliest, ours.latest, addr) == (30, 0, 30, addr)
    assert theirs.batches == bytes(ours.batches) and theirs.batches
    # the batch of offsets 0-9 is not sent; the one holding 13 is, and the decoder skips 10-12
    assert [r.offset for r in client.fetch(topic, 2, 13).records] == list(range(13, 30))


def _local_fetch(addr: str, topic: str, queue: int, offset: int, **kw):
    with grpc.insecure_channel(addr) as ch:
        return rmq_pb2_grpc.MessageLogStub(ch).Fetch(rmq_pb2.FetchRequest(
            topic=topic, queue=queue, offset=offset, allow_follower=True, **kw), timeout=10)


def test_short_circuit_read_equals_the_network_read(client, topic):
    msgs = [Message(value=f"v{i}".encode() * (i % 7), key=None if i % 3 else f"k{i}".encode(),
                    tags=f"T{i % 2}", properties={"i": str(i)}) for i in range(300)]
    for i in range(0, 300, 30):
        client.produce(topic, msgs[i:i + 30], queue=3)
    for start, end, max_bytes in ((0, None, 0), (17, 250, 0), (5, None, 64 << 10)):
        got = {}
        for local in (True, False):
            rows, off = [], start
            while off < (end or 300):
                rb, off, _, latest = client.fetch_arrow(topic, 3, off, end=end, max_bytes=max_bytes,
                                                        local=local)
                rows += rb.to_pylist()
            got[local] = rows
        assert got[True] == got[False]
        assert [r["offset"] for r in got[True]] == list(range(start, end or 300))


def test_node_answers_where_the_batches_are_only_to_its_own_host(client, topic):
    from storage_service.protocol.localread import host_id, read_span

    for i in range(0, 40, 10):
        client.produce(topic, [f"m{j}".encode() for j in range(i, i + 10)], queue=1)
    addr = client.fetch_raw(topic, 1, 0).served_by
    here = _local_fetch(addr, topic, 1, 13, local_host=host_id())
    assert here.HasField("local") and here.batches == b"" and here.next_offset == 40
    network = _local_fetch(addr, topic, 1, 13)
    assert read_span(here.local) == network.batches           # the same bytes, read by us
    for other in (dict(local_host="another-host"), dict(local_host=host_id(), tags="T"),
                  dict(local_host=host_id(), max_messages=5)):
        resp = _local_fetch(addr, topic, 1, 13, **other)
        assert not resp.HasField("local"), other
    assert not _local_fetch(addr, topic, 1, 40, local_host=host_id()).HasField("local")  # at the end


@pytest.mark.parametrize("fault", ["file gone", "other bytes"])
def test_short_circuit_read_that_fails_its_checks_fetches_instead(client, topic, monkeypatch, fault):
    # What a client sees when retention deletes, or compaction rewrites, the segment
    # between the node's answer and its read: the fetch is done over the network.
    import rmq_spark.client.client as client_module

    for i in range(0, 60, 20):
        client.produce(topic, [f"m{j}".encode() for j in range(i, i + 20)], queue=0)
    want = client.fetch_arrow(topic, 0, 10, local=False)[0].to_pylist()
    real = client_module.read_span
    calls = []

    def faulty(span):
        calls.append(span)
        data = real(span)
        return None if fault == "file gone" else data[: len(data) // 2] + data[: len(data) // 2]

    monkeypatch.setattr(client_module, "read_span", faulty)
    rb, nxt, _, _ = client.fetch_arrow(topic, 0, 10, local=True)
    assert calls and rb.to_pylist() == want and nxt == 60


def test_tiered_topic_keeps_everything_above_the_archived_watermark(client):
    client.create_topic("ret-tier", queues=1, retention_ms=86_400_000, tier="delta:/tmp/x",
                        local_retention_ms=500)
    for _ in range(20):
        client.produce("ret-tier", [b"v" * 1024] * 20, queue=0)    # 400 KiB in 64 KiB segments
    time.sleep(1.5)                                                 # past the local retention
    client.produce("ret-tier", [b"tail"], queue=0)
    time.sleep(1.5)                                                 # three retention passes
    assert client.offsets("ret-tier")[0].earliest == 0, "nothing is archived: nothing may go"
    token = client.lease("ret-tier", "tier", "test-job", 60_000)[3]    # what a tiering job holds
    client.set_watermark("ret-tier", "archive", {0: 150}, token)
    o = wait_until(lambda: (lambda x: x if x.earliest > 0 else None)(client.offsets("ret-tier")[0]),
                   what="retention up to the archived watermark")
    assert 0 < o.earliest <= 150
    time.sleep(1.5)
    assert client.offsets("ret-tier")[0].earliest <= 150
    assert client.describe_topic("ret-tier")["queue_info"][0]["archived"] == 150


def test_garbage_records_blocks_are_rejected_and_the_node_keeps_serving(cluster, client, topic):
    import random

    from rmq_spark.client._messages import to_block

    rng = random.Random(5)
    good = to_block([Message(value=b"v" * 20, key=b"k", tags="T", properties={"a": "b"})] * 3)
    stub = rmq_pb2_grpc.MessageLogStub(grpc.insecure_channel(cluster.addresses[0]))
    codes = set()
    for i in range(200):
        blob = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        if i % 3 == 0:
            blob = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80)))
        req = rmq_pb2.ProduceRequest(topic=topic, queue=0, records=bytes(blob), count=rng.choice([1, 3, 7]))
        try:
            client.call("Produce", req, group=client.group_of(topic, 0))
        except InvalidArgument as e:
            codes.add("INVALID_ARGUMENT")
            assert "records" in str(e) or "count" in str(e)
        except ResourceExhausted:
            codes.add("RESOURCE_EXHAUSTED")
    assert "INVALID_ARGUMENT" in codes
    assert stub.Health(rmq_pb2.HealthRequest(), timeout=5).serving
    # whatever was accepted reads back cleanly
    off = client.offsets(topic)[0]
    assert len(client.fetch(topic, 0, 0, max_bytes=4 << 20).records) == off.latest


def test_grow_queue_count_keeps_old_queues_and_serves_new_ones_at_once(cluster, client):
    name = "grow-queues"
    client.create_topic(name, queues=2)
    before = {q: client.group_of(name, q) for q in range(2)}
    client.produce(name, [b"a0", b"a1"], queue=0)
    client.produce(name, [b"b0"], queue=1)
    cfg = client.alter_topic(name, queues=5)
    assert cfg["queues"] == 5
    assert {q: client.group_of(name, q) for q in range(2)} == before   # stable placement
    # Every node knows the new queues right away: a fresh client per node, no retries needed.
    for addr in cluster.endpoints.split(","):
        with Client(addr, timeout=5) as one:
            assert [o.queue for o in one.offsets(name)] == [0, 1, 2, 3, 4]
            assert one.describe_topic(name)["queues"] == 5
            assert one.fetch(name, 4, 0, from_follower=True).records == []
    assert [(o.earliest, o.latest) for o in client.offsets(name)] == [(0, 2), (0, 1), (0, 0), (0, 0), (0, 0)]
    [r] = client.produce(name, [b"new"], queue=4)
    assert (r.queue, r.base_offset) == (4, 0)
    assert [x.value for x in client.fetch(name, 4, 0).records] == [b"new"]
    assert client.offset_for_timestamp(name, 3, 0) == 0
    client.commit_offsets("grow-g", name, {4: 1})
    assert client.committed_offsets("grow-g", name) == {4: 1}
    assert [x.value for x in client.fetch(name, 0, 0).records] == [b"a0", b"a1"]


def test_service_chosen_queues_spread_over_the_grown_count(client):
    name = "grow-spread"
    client.create_topic(name, queues=1)
    client.alter_topic(name, queues=6)
    keyed = client.produce(name, [Message(value=b"v", key=f"k{i}".encode()) for i in range(60)])
    assert {r.queue for r in keyed} == set(range(6))
    # Round robin is per node (each keeps its own counter); 36 calls reach every queue.
    unkeyed = {client.produce(name, [b"x"])[0].queue for _ in range(36)}
    assert unkeyed == set(range(6))
    assert sum(o.latest for o in client.offsets(name)) == 96


@pytest.mark.parametrize("queues", [2, 3])
def test_queue_count_cannot_shrink_or_stay(client, queues):
    name = f"no-shrink-{queues}"
    client.create_topic(name, queues=3)
    with pytest.raises(InvalidArgument) as exc:
        client.alter_topic(name, queues=queues)
    assert f"queues={queues}" in str(exc.value) and "has 3 queues" in str(exc.value)
    assert client.describe_topic(name)["queues"] == 3
    with pytest.raises(InvalidArgument):
        client.alter_topic(name, queues=5000)
    assert client.describe_topic(name)["queues"] == 3


def test_produce_batches_one_call_per_node_each_batch_answered_on_its_own(client, topic):
    res = client.produce_batches([(topic, q, [f"b{q}-{i}".encode() for i in range(3)]) for q in range(4)])
    assert [(r.queue, r.base_offset, r.count) for r in res] == [(q, 0, 3) for q in range(4)]
    again = client.produce_batches([(topic, 2, [b"x"]), (topic, 0, [b"y"])])
    assert [(r.queue, r.base_offset) for r in again] == [(2, 3), (0, 3)]
    for q in range(4):
        assert [r.value for r in client.fetch(topic, q, 0).records][:3] == [f"b{q}-{i}".encode() for i in range(3)]


def test_produce_batches_bad_batch_fails_alone(cluster, client, topic):
    """Over the wire: a bad batch gets its own status; the good ones are stored."""
    leader = client.describe_topic(topic)["queue_info"][1]["leader"]
    good = rmq_pb2.ProduceRequest(topic=topic, queue=1, messages=[rmq_pb2.Message(value=b"ok")])
    bad_queue = rmq_pb2.ProduceRequest(topic=topic, queue=7, messages=[rmq_pb2.Message(value=b"x")])
    spread = rmq_pb2.ProduceRequest(topic=topic, queue=-1, messages=[rmq_pb2.Message(value=b"x")])
    with grpc.insecure_channel(leader) as ch:
        resp = rmq_pb2_grpc.MessageLogStub(ch).ProduceBatches(
            rmq_pb2.ProduceBatchesRequest(batches=[bad_queue, good, spread]), timeout=10)
        with pytest.raises(grpc.RpcError) as exc:
            rmq_pb2_grpc.MessageLogStub(ch).ProduceBatches(rmq_pb2.ProduceBatchesRequest(), timeout=10)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    codes = [o.code for o in resp.outcomes]
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT.value[0], 0, grpc.StatusCode.INVALID_ARGUMENT.value[0]]
    assert "valid queues are 0..3" in resp.outcomes[0].message
    assert "explicit queue" in resp.outcomes[2].message
    assert resp.outcomes[1].result.count == 1
    assert [r.value for r in client.fetch(topic, 1, 0).records] == [b"ok"]
    assert sum(o.latest for o in client.offsets(topic)) == 1


def test_produce_batches_to_a_follower_names_the_leader_and_client_retries(cluster, client, topic):
    info = client.describe_topic(topic)["queue_info"]
    follower = next(a for a in cluster.endpoints.split(",") if a != info[3]["leader"])
    req = rmq_pb2.ProduceRequest(topic=topic, queue=3, messages=[rmq_pb2.Message(value=b"x")])
    with grpc.insecure_channel(follower) as ch:
        resp = rmq_pb2_grpc.MessageLogStub(ch).ProduceBatches(
            rmq_pb2.ProduceBatchesRequest(batches=[req]), timeout=10)
    [out] = resp.outcomes
    assert out.code == grpc.StatusCode.UNAVAILABLE.value[0] and out.leader == info[3]["leader"]
    with Client(follower, timeout=10) as one:         # only knows the follower: follows the hint
        [r] = one.produce_batches([(topic, 3, [b"y"])])
    assert (r.queue, r.base_offset) == (3, 0)
    with pytest.raises(InvalidArgument):
        client.produce_batches([(topic, 0, [])])


def test_concurrent_produce_batches_share_rpcs_and_each_gets_its_own_results(cluster, topic):
    """Calls from 8 threads to the same nodes go out in fewer RPCs than calls;
    every call still gets its own offsets, and every message is stored once,
    in each thread's order (retries after a leader change included)."""
    threads, calls = 8, 15
    with Client(cluster.endpoints, timeout=30) as c:
        c.produce_batches([(topic, q, [b"warm-up"]) for q in range(4)])   # routes known: no misroutes below
        rpcs, sends, start = [], [], threading.Barrier(threads)
        for addr in cluster.endpoints.split(","):
            sender = c._sender(addr)
            real = sender._call                      # the produce port's (or gRPC's) ProduceBatches
            sender._call = lambda req, _real=real, **kw: rpcs.append(len(req.batches)) or _real(req, **kw)
            real_send = sender.send
            sender.send = lambda reqs, timeout, _real=real_send: sends.append(len(reqs)) or _real(reqs, timeout)
        got: dict[int, list] = {}

        def producer(t):
            start.wait()
            mine = got.setdefault(t, [])
            for i in range(calls):
                res = c.produce_batches([(topic, q, [f"t{t}-c{i}-q{q}-{k}".encode() for k in range(3)])
                                         for q in range(4)])
                assert [(r.queue, r.count) for r in res] == [(q, 3) for q in range(4)]
                mine.append(res)

        workers = [threading.Thread(target=producer, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        assert sorted(got) == list(range(threads)) and all(len(v) == calls for v in got.values())
        # A call's share for one node is one send (a retry after a leader
        # change is another): each went out in exactly one RPC, and sends
        # made while RPCs were in flight shared them.
        assert sum(sends) >= threads * calls * 4
        assert sum(rpcs) == sum(sends)
        assert len(rpcs) < len(sends)
        for q in range(4):
            recs = c.fetch(topic, q, 1, max_messages=10_000).records
            assert [r.offset for r in recs] == list(range(1, 1 + threads * calls * 3))
            by_offset = {r.offset: r.value for r in recs}
            for t, results in got.items():
                mine = [by_offset[off] for res in results for off in range(res[q].base_offset, res[q].base_offset + 3)]
                assert mine == [f"t{t}-c{i}-q{q}-{k}".encode() for i in range(calls) for k in range(3)]


def test_produce_batches_retry_is_deduplicated(client, topic):
    req = rmq_pb2.ProduceBatchesRequest(batches=[rmq_pb2.ProduceRequest(
        topic=topic, queue=0, messages=[rmq_pb2.Message(value=b"a"), rmq_pb2.Message(value=b"b")],
        producer_id="retry-test", sequence=0)])
    first, again = (client.call("ProduceBatches", req, group=client.group_of(topic, 0)) for _ in range(2))
    assert not first.outcomes[0].result.duplicate and again.outcomes[0].result.duplicate
    assert again.outcomes[0].result.base_offset == first.outcomes[0].result.base_offset == 0
    assert client.offsets(topic)[0].latest == 2


def _keyless_at_3(n: int = 5) -> list[Message]:
    return [Message(value=f"v{i}".encode(), key=None if i == 3 else f"k{i}".encode()) for i in range(n)]


@pytest.mark.parametrize("path", ["records", "messages", "spread", "batches"])
def test_compact_topic_refuses_a_keyless_message_and_writes_nothing_of_the_batch(client, path):
    name = f"compact-keyless-{path}"
    client.create_topic(name, queues=2, cleanup_policy="compact")
    msgs = _keyless_at_3()
    want = (f"topic '{name}' has cleanup policy compact: every message needs a key "
            "(message 3 of the batch has none)")
    with pytest.raises(InvalidArgument) as exc:
        if path == "records":            # columnar block: key_valid of the block is checked
            client.produce(name, msgs, queue=0)
        elif path == "messages":         # protobuf messages to an explicit queue
            client.call("Produce", rmq_pb2.ProduceRequest(
                topic=name, queue=1, messages=[client_to_pb(m) for m in msgs]),
                group=client.group_of(name, 1))
        elif path == "spread":           # queue=-1: the service picks queues by key hash
            client.produce(name, msgs)
        else:
            client.produce_batches([(name, 0, msgs[:2]), (name, 1, msgs)])
    assert want in str(exc.value)
    if path == "batches":                # the good batch of the call is stored, the bad one not
        assert [o.latest for o in client.offsets(name)] == [2, 0]
    else:
        assert [o.latest for o in client.offsets(name)] == [0, 0]
    client.produce(name, [Message(value=b"v", key=b"k")], queue=0)   # keyed messages pass


def test_a_one_message_block_is_checked_like_any_block(client):
    """A one-message block is checked without a full parse (records.sound_single); a
    compact topic still refuses it keyless, and a tombstone with a key passes."""
    name = "compact-single"
    client.create_topic(name, queues=1, cleanup_policy="compact")
    with pytest.raises(InvalidArgument) as exc:
        client.produce_batches([(name, 0, [Message(value=b"v")])])
    assert (f"topic '{name}' has cleanup policy compact: every message needs a key "
            "(message 0 of the batch has none)") in str(exc.value)
    assert client.offsets(name)[0].latest == 0
    client.produce_batches([(name, 0, [Message(value=None, key=b"k")])])
    assert [(r.key, r.value) for r in client.fetch(name, 0, 0).records] == [(b"k", None)]


@pytest.mark.parametrize("path", ["records", "messages", "spread", "batches"])
def test_tombstone_null_value_stays_distinct_from_an_empty_value(client, path):
    name = f"tombstones-{path}"
    client.create_topic(name, queues=1, cleanup_policy="compact")
    msgs = [Message(value=b"v", key=b"a"), Message(value=None, key=b"a"), Message(value=b"", key=b"b")]
    if path == "records":
        client.produce(name, msgs, queue=0)
    elif path == "messages":
        client.call("Produce", rmq_pb2.ProduceRequest(topic=name, queue=0,
                                                      messages=[client_to_pb(m) for m in msgs]),
                    group=client.group_of(name, 0))
    elif path == "spread":
        client.produce(name, msgs)
    else:
        client.produce_batches([(name, 0, msgs)])
    recs = client.fetch(name, 0, 0).records
    assert [(r.key, r.value) for r in sorted(recs, key=lambda r: r.offset)] == \
        [(b"a", b"v"), (b"a", None), (b"b", b"")]
    batch, *_ = client.fetch_arrow(name, 0, 0)
    assert batch.column("value").to_pylist() == [b"v", None, b""]
    assert batch.column("value").null_count == 1


def test_tombstone_without_a_key_is_allowed_on_a_delete_topic(client, topic):
    [res] = client.produce(topic, [Message(value=None), Message(value=b"")], queue=2)
    assert [r.value for r in client.fetch(topic, 2, res.base_offset).records] == [None, b""]


def test_null_value_with_value_bytes_is_refused_over_the_wire(client, topic):
    bad = rmq_pb2.Message(value=b"x", null_value=True)
    with pytest.raises(InvalidArgument, match="message 0 has null_value set and 1 value bytes"):
        client.call("Produce", rmq_pb2.ProduceRequest(topic=topic, queue=0, messages=[bad]),
                    group=client.group_of(topic, 0))
    assert client.offsets(topic)[0].latest == 0


def test_threads_one_after_another_each_get_their_own_producer(client):
    """Python reuses a finished thread's ident: each thread must still be a new producer,
    or its first call (sequence 0) is dropped as a retry of the dead thread's."""
    import threading
    client.create_topic("thread-reuse", queues=1)
    results = []
    for i in range(3):
        t = threading.Thread(target=lambda i=i: results.extend(
            client.produce("thread-reuse", [f"{i}-{j}".encode() for j in range(10)], queue=0)))
        t.start()
        t.join()
    assert [r.duplicate for r in results] == [False, False, False]
    assert client.offsets("thread-reuse")[0].latest == 30


# ------------------------------------------------------------ hot-log compaction
def _read_keyed(client, topic: str, queue: int, address=None) -> list[tuple[int, bytes, bytes | None]]:
    out, off = [], 0
    while True:
        res = client.fetch(topic, queue, off, max_bytes=256 << 10, from_follower=address is not None,
                           address=address)
        out += [(r.offset, r.key, r.value) for r in res.records]
        if res.next_offset >= res.latest:
            return out
        off = res.next_offset


def _last_per_key(recs) -> dict:
    return {k: (o, v) for o, k, v in recs}


def test_hot_compaction_keeps_each_keys_latest_record_on_every_replica(cluster, client):
    name = "hot-compaction"
    client.create_topic(name, queues=1, cleanup_policy="compact")
    # 40 keys updated 20 times each, 1 KiB values: ~13 segments of 64 KiB; keys 0-4 deleted.
    for round_ in range(20):
        client.produce(name, [Message(key=b"k%02d" % k, value=b"%04d" % round_ + b"." * 1020)
                              for k in range(40)], queue=0)
    client.produce(name, [Message(key=b"k%02d" % k, value=None) for k in range(5)], queue=0)
    for _ in range(13):      # a tail of 130 KiB in separate appends: the segments below get sealed
        client.produce(name, [Message(key=b"tail", value=b"x" * 1024)] * 10, queue=0)
    before = _read_keyed(client, name, 0)
    assert len(before) == 935
    # Nothing goes before the compaction job reports a watermark.
    time.sleep(1.2)
    assert _read_keyed(client, name, 0) == before
    token = client.lease(name, "compact", "test-job", 60_000)[3]          # as the compaction job
    client.set_watermark(name, "compaction", {0: 805}, token)    # the updates and deletes, not the tail

    def compacted(address=None):
        recs = _read_keyed(client, name, 0, address)
        return recs if len(recs) < 200 else None
    for address in [None, *cluster.addresses]:
        after = wait_until(lambda: compacted(address), what=f"compaction on {address or 'the leader'}")
        assert set(after) <= set(before)                            # nothing changed, only dropped
        assert _last_per_key(after) == _last_per_key(before)        # every key's latest value stays
        assert [r for r in after if r[0] >= 805] == [r for r in before if r[0] >= 805]
        # The tombstones are younger than delete-retention (24 h): a reader from earliest sees them.
        assert [(o, k) for o, k, v in after if v is None] == [(800 + k, b"k%02d" % k) for k in range(5)]
    offs = client.offsets(name)[0]
    assert (offs.earliest, offs.latest) == (0, 935)
    # Delete-retention shortened to 1 ms: the deletes themselves go (but a segment's last record stays).
    cfg = client.alter_topic(name, delete_retention_ms=1)
    assert cfg["delete_retention_ms"] == 1
    wait_until(lambda: len([r for r in _read_keyed(client, name, 0) if r[2] is None]) <= 1,
               what="expired tombstones to go")
    assert {k for _, k, v in _read_keyed(client, name, 0) if v is not None} >= {b"k%02d" % k for k in range(5, 40)}


def test_compaction_settings_are_checked_and_shown(client):
    cfg = client.create_topic("compact-settings", queues=1, cleanup_policy="compact", min_compaction_lag_ms=5000)
    assert (cfg["delete_retention_ms"], cfg["min_compaction_lag_ms"]) == (86_400_000, 5000)
    with pytest.raises(InvalidArgument, match="delete_retention_ms=-1: must be >= 0"):
        client.alter_topic("compact-settings", delete_retention_ms=-1)
    assert client.describe_topic("compact-settings")["delete_retention_ms"] == 86_400_000


def test_job_lease_over_the_cluster(cluster, client, topic):
    from rmq_spark.tiering._lease import LeaseLost, TierLease
    from rmq_spark.tiering.errors import TierConfigError

    ep = cluster.endpoints
    a = TierLease(ep, topic, "/ck/a", ttl_s=0.6)
    a.take()
    with pytest.raises(TierConfigError, match=r"being tiered by another job \(checkpoint /ck/a\)"):
        TierLease(ep, topic, "/ck/b", ttl_s=30).take()
    TierLease(ep, topic, "/ck/a", ttl_s=0.6).take()             # the same checkpoint: at once
    a.check()                                                    # fresh grant: no RPC needed
    time.sleep(0.8)                                              # a's lease lapses unrenewed
    b = TierLease(ep, topic, "/ck/b", ttl_s=30)
    b.take()
    with pytest.raises(LeaseLost, match="checkpoint /ck/b holds it"):
        a.check()
    # b renews on its thread; a lost lease is reported there, not silently dropped
    lost: list = []
    b.start_renewing(lost.append)
    time.sleep(0.2)
    assert not lost
    b.release()                                                  # stops renewing, gives it back
    c = TierLease(ep, topic, "/ck/c", ttl_s=0.6)
    c.take()                                                     # released: free at once
    c.start_renewing(lost.append)
    time.sleep(1.5)                                              # > 2 TTLs: kept by renewals
    with pytest.raises(TierConfigError, match="checkpoint /ck/c"):
        TierLease(ep, topic, "/ck/d", ttl_s=30).take()
    assert not lost
    client.lease(topic, "tier", "/ck/c", 0)                      # taken away behind c's back...
    client.lease(topic, "tier", "/ck/e", 60_000)
    wait_until(lambda: lost, timeout=5, what="c's renewal to notice the lease is gone")
    assert isinstance(lost[0], LeaseLost) and "checkpoint /ck/e holds it" in str(lost[0])
    c.release()
    client.lease(topic, "tier", "/ck/e", 0)


@pytest.mark.parametrize("kwargs,what", [
    (dict(kind="nope"), "kind='nope': allowed tier"),
    (dict(owner=""), "owner has 0 characters"),
    (dict(ttl_ms=-1), "ttl_ms=-1"),
    (dict(ttl_ms=10**12), "ttl_ms=1000000000000"),
    (dict(topic="no-such-topic"), "does not exist"),
])
def test_bad_lease_requests_name_the_field(client, topic, kwargs, what):
    args = dict(topic=topic, kind="tier", owner="o", ttl_ms=1000) | kwargs
    with pytest.raises((InvalidArgument, NotFound), match=re.escape(what)):
        client.lease(**args)
    assert client.lease(topic, "tier", "o", 1000)[0]             # nothing was taken by the bad ones
    client.lease(topic, "tier", "o", 0)


def test_client_that_cannot_read_the_nodes_files_stops_asking(client, topic, monkeypatch):
    # e.g. another container on the same host: same boot id, other files
    import rmq_spark.client.client as client_module

    client.produce(topic, [b"a", b"b"], queue=2)
    spans = []
    monkeypatch.setattr(client_module, "read_span", lambda span: spans.append(span))
    with Client(client.endpoints) as fresh:
        for _ in range(client_module.LOCAL_READ_TRIES + 3):
            rb, nxt, _, _ = fresh.fetch_arrow(topic, 2, 0, local=True)
            assert rb.column("value").to_pylist() == [b"a", b"b"] and nxt == 2
    assert len(spans) == client_module.LOCAL_READ_TRIES

