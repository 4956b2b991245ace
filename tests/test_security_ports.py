"""The produce port of a secured cluster (issue 22): its token hello over TLS, every
frame checked against the caller's ACLs (produce, fetch, key-value), and threads of
one client each getting their own answer. One 3-node ``secure=True`` cluster for the
module (test_security.py has its own)."""
from __future__ import annotations

import pytest

from rmq_spark.client import PermissionDenied
from storage_service.proto import rmq_pb2
from storage_service.protocol.fetch_wire import decode_fetch_response
from storage_service.protocol.produce_frames import METHOD_KV_PUT, METHOD_KV_READ

from .secured import ProducePort, client_as
from .wire import leader_of

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(secure):
    return secure                  # (conftest's secured cluster, under this module's name)


@pytest.fixture(scope="module")
def admin(secure_admin):
    return secure_admin


def test_the_produce_port_authenticates_its_hello_and_every_frame(cluster, admin):
    admin.create_topic("wire", queues=1)
    leader = cluster.addresses[leader_of(admin, "wire", 0)]
    pete = admin.create_principal("pete")
    garbage = ProducePort(cluster, leader, "garbage")
    assert garbage.refused is not None and garbage.refused[0] == 16 and b"not a token" in garbage.refused[1]
    garbage.close()
    anonymous = ProducePort(cluster, leader, None)
    code, body = anonymous.produce("wire")
    assert code == 16 and b"needs credentials" in body                     # UNAUTHENTICATED
    anonymous.close()
    conn = ProducePort(cluster, leader, pete["token"])
    try:
        code, body = conn.produce("wire")
        assert code == 7 and b"'pete' may not produce topic 'wire'" in body  # PERMISSION_DENIED
        assert [o.latest for o in admin.offsets("wire")] == [0]
        admin.change_acls(True, [dict(principal="pete", resource_type="topic", name="wire",
                                      operations=["produce"])])
        code, body = conn.produce("wire", 2)
        assert code == 0 and rmq_pb2.ProduceBatchesResponse.FromString(body).outcomes[0].code == 0
        # a fetch on the port is checked as gRPC's Fetch is: produce is not consume
        code, body = conn.fetch("wire", 4)
        assert code == 7 and b"'pete' may not consume topic 'wire'" in body, body
        admin.change_acls(True, [dict(principal="pete", resource_type="topic", name="wire",
                                      operations=["consume"])])
        code, body = conn.fetch("wire", 5)
        assert code == 0 and bytes(decode_fetch_response(body).batches).count(b"wire") == 1
        # rotated while the connection is open: its next frame is refused
        admin.create_principal("pete", rotate=True)
        code, body = conn.produce("wire", 3)
        assert code == 16 and b"replaced by a newer one" in body
    finally:
        conn.close()
    assert [o.latest for o in admin.offsets("wire")] == [1]


def test_threads_producing_to_an_allowed_and_a_denied_topic_each_get_their_own_answer(cluster, admin):
    """One Client's threads share produce requests to a node (ProduceSender); a request
    refused for the topic one thread may not write is sent again call by call, so the
    other threads' produces are stored (review of 51bd33e)."""
    import threading

    for t in ("mx-ok", "mx-no"):
        admin.create_topic(t, queues=6)
    leaders = {t: {q: i["leader"] for q, i in enumerate(admin.describe_topic(t)["queue_info"])}
               for t in ("mx-ok", "mx-no")}
    pairs = [(qa, qb) for qa, la in leaders["mx-ok"].items() for qb, lb in leaders["mx-no"].items() if la == lb]
    assert pairs, f"no node leads a queue of both topics: {leaders}"
    qa, qb = pairs[0]
    mia = admin.create_principal("mia")
    admin.change_acls(True, [dict(principal="mia", resource_type="topic", name="mx-ok",
                                  operations=["produce", "describe"]),
                             dict(principal="mia", resource_type="topic", name="mx-no", operations=["describe"])])
    outcomes: list = []
    with client_as(cluster, mia["token"]) as c:
        def run(i: int) -> None:
            topic, q = ("mx-ok", qa) if i % 2 else ("mx-no", qb)
            for k in range(10):
                try:
                    c.produce(topic, [f"{i}-{k}".encode()], queue=q)
                    outcomes.append((topic, "stored"))
                except PermissionDenied as e:
                    outcomes.append((topic, "denied" if "may not produce topic 'mx-no'" in str(e) else str(e)))
        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(set(outcomes)) == [("mx-no", "denied"), ("mx-ok", "stored")], sorted(set(outcomes))
    assert admin.offsets("mx-ok")[qa].latest == 40 and sum(o.latest for o in admin.offsets("mx-no")) == 0


def test_key_value_calls_need_produce_to_write_and_consume_to_read(cluster, admin):
    """KvPut is a produce and KvRead a consume, over gRPC (the client over TLS) and
    on the produce port's frames alike; a refused write stores nothing."""
    admin.create_topic("settings", queues=1, cleanup_policy="compact")
    rev = admin.kv_put("settings", "k", b"v1")
    reader, writer = admin.create_principal("kv-reader"), admin.create_principal("kv-writer")
    admin.change_acls(True, [dict(principal="kv-reader", resource_type="topic", name="settings",
                                  operations=["consume"]),
                             dict(principal="kv-writer", resource_type="topic", name="settings",
                                  operations=["produce"])])
    with client_as(cluster, reader["token"]) as r, client_as(cluster, writer["token"]) as w:
        assert r.kv_get("settings", "k").value == b"v1"
        assert [k for k, _ in r.kv_keys("settings")] == [b"k"]
        with pytest.raises(PermissionDenied, match="'kv-reader' may not produce topic 'settings'"):
            r.kv_put("settings", "k", b"no", if_revision=rev)
        rev2 = w.kv_put("settings", "k", b"v2", if_revision=rev)
        with pytest.raises(PermissionDenied, match="'kv-writer' may not consume topic 'settings'"):
            w.kv_get("settings", "k")
    leader = cluster.addresses[leader_of(admin, "settings", 0)]
    port = ProducePort(cluster, leader, reader["token"])
    try:
        code, body = port.call(METHOD_KV_PUT, rmq_pb2.KvPutRequest(topic="settings", key=b"k", value=b"no"))
        assert code == 7 and b"'kv-reader' may not produce topic 'settings'" in body, body
        code, body = port.call(METHOD_KV_READ, rmq_pb2.KvReadRequest(topic="settings", key=b"k"), rid=2)
        assert code == 0 and rmq_pb2.KvReadResponse.FromString(body).entries[0].value == b"v2"
    finally:
        port.close()
    got = admin.kv_get("settings", "k")
    assert (got.value, got.revision) == (b"v2", rev2)
