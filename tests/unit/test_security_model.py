"""The security model without the network: ACLs (security/acl.py), tokens
(security/tokens.py), the metadata group's security record (statemachine/security.py
through MetaState.apply), the Gate every call passes (security/authz.py) and the
produce port's hello with a token (protocol/produce_frames.py)."""
from __future__ import annotations

import json
import os
import stat
import time
import types

import grpc
import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage_service.proto import rmq_pb2
from storage_service.protocol.produce_frames import (FLAG_TOKEN, HELLO, MAX_TOKEN, TOKEN_LEN, WireProtocolError,
                                                     check_hello, hello)
from storage_service.security.acl import OPERATIONS, AclEntry, allows, check_entry
from storage_service.security.tokens import BadToken, TokenKeys, make_secret
from storage_service.security import authz
from storage_service.security.authz import ANONYMOUS, NODE_ONLY, POLICY, Gate, Principal, SecurityConfig
from storage_service.protocol.errors import ServiceError
from storage_service.statemachine.commands import ChangeAcls, SetPrincipal
from storage_service.statemachine.meta import MetaState

pytestmark = pytest.mark.unit

SECRET = b"x" * 32
KEYS = TokenKeys(SECRET)


def _entry(principal="alice", rtype="topic", name="t", prefix=False, ops=("produce",)) -> AclEntry:
    return AclEntry(principal, rtype, name, prefix, frozenset(ops))


# ------------------------------------------------------------------------ ACLs
def test_literal_entry_covers_only_its_name_and_type():
    e = _entry(name="orders")
    assert e.covers("topic", "orders")
    assert not e.covers("topic", "orders2") and not e.covers("topic", "order")
    assert not e.covers("group", "orders")


def test_prefix_entry_covers_every_name_starting_with_it():
    e = _entry(name="ord", prefix=True)
    assert e.covers("topic", "ord") and e.covers("topic", "orders")
    assert not e.covers("topic", "xord") and not e.covers("group", "orders")
    assert _entry(name="", prefix=True).covers("topic", "anything")


def test_cluster_entry_covers_the_cluster_whatever_the_name():
    e = _entry(rtype="cluster", name="", ops=("alter",))
    assert e.covers("cluster", "") and e.covers("cluster", "x")
    assert not e.covers("topic", "")


@pytest.mark.parametrize("e", [
    _entry(),
    _entry("*", "group", "g-", True, ("consume", "describe")),
    _entry("bob", "cluster", "", False, OPERATIONS),
])
def test_entry_encode_decode_round_trip_also_through_json(e):
    assert AclEntry.decode(e.encode()) == e
    assert AclEntry.decode(json.loads(json.dumps(e.encode()))) == e
    assert e.encode()[-1] == tuple(sorted(e.operations))


def test_entry_describe_names_principal_operations_and_resource():
    assert _entry(ops=("produce", "alter")).describe() == "alice: alter,produce on topic 't'"
    assert _entry(rtype="group", name="g", prefix=True).describe() == "alice: produce on groups starting with 'g'"
    assert _entry(rtype="cluster", name="").describe() == "alice: produce on the cluster"


def test_allows_literal_vs_prefix():
    lit, pre = [_entry(name="t")], [_entry(name="t", prefix=True)]
    assert allows(lit, "alice", "produce", "topic", "t")
    assert not allows(lit, "alice", "produce", "topic", "t2")
    assert allows(pre, "alice", "produce", "topic", "t2")
    assert not allows(pre, "alice", "produce", "topic", "s")


def test_allows_star_is_any_principal_and_names_are_exact():
    entries = [_entry(principal="*", ops=("consume",)), _entry(principal="bob", ops=("produce",))]
    assert allows(entries, "anyone", "consume", "topic", "t")
    assert not allows(entries, "anyone", "produce", "topic", "t")
    assert allows(entries, "bob", "produce", "topic", "t")
    assert not allows(entries, "bobby", "produce", "topic", "t")
    assert not allows([], "alice", "describe", "topic", "t")


@pytest.mark.parametrize("granted", ["produce", "consume", "alter"])
def test_produce_consume_alter_imply_describe_but_not_each_other(granted):
    entries = [_entry(ops=(granted,))]
    assert allows(entries, "alice", "describe", "topic", "t")
    for op in ("produce", "consume", "alter"):
        assert allows(entries, "alice", op, "topic", "t") == (op == granted)
    assert not allows(entries, "alice", "describe", "topic", "other")


def test_describe_implies_nothing_else():
    entries = [_entry(ops=("describe",))]
    assert [op for op in OPERATIONS if allows(entries, "alice", op, "topic", "t")] == ["describe"]


def test_allows_on_the_cluster_resource():
    entries = [_entry(rtype="cluster", name="", ops=("alter",))]
    assert allows(entries, "alice", "alter", "cluster", "")
    assert allows(entries, "alice", "describe", "cluster", "")
    assert not allows(entries, "alice", "alter", "topic", "t")


def test_check_entry_gives_a_valid_entry():
    e = check_entry("alice", "topic", "t", False, ["produce", "consume"])
    assert e == _entry(ops=("produce", "consume"))
    assert check_entry("*", "group", "", True, ["describe"]).covers("group", "any")
    assert check_entry("admin", "cluster", "", False, ["alter"]).resource_type == "cluster"


def test_check_entry_expands_all_to_every_operation():
    assert check_entry("alice", "topic", "t", False, ["all"]).operations == frozenset(OPERATIONS)
    assert check_entry("alice", "topic", "t", False, ["all", "produce"]).operations == frozenset(OPERATIONS)


@pytest.mark.parametrize("args,why", [
    (("alice", "queue", "t", False, ["produce"]), "resource type 'queue': allowed topic, group, cluster"),
    (("alice", "cluster", "c", False, ["alter"]), "the cluster resource has no name or prefix"),
    (("alice", "cluster", "", True, ["alter"]), "the cluster resource has no name or prefix"),
    (("alice", "topic", "", False, ["produce"]), "a topic ACL needs the topic's name"),
    (("alice", "group", "", False, ["consume"]), "a group ACL needs the group's name"),
    (("alice", "topic", "t" * 513, False, ["produce"]), "topic name of 513 characters: at most 512"),
    (("alice", "topic", "t", False, ["write"]), "operations write: allowed produce, consume, describe, alter, all"),
    (("alice", "topic", "t", False, ["all", "write"]), "operations write: allowed"),
    (("alice", "topic", "t", False, []), r"operations \(none\): allowed"),
    (("al ice", "topic", "t", False, ["produce"]), "principal 'al ice': give a name of 1-512 characters"),
    (("alice\t", "topic", "t", False, ["produce"]), "without spaces"),
    (("", "topic", "t", False, ["produce"]), "principal '': give a name"),
    (("a" * 513, "topic", "t", False, ["produce"]), "give a name of 1-512 characters"),
])
def test_check_entry_refuses_naming_what_is_wrong(args, why):
    with pytest.raises(ValueError, match=why):
        check_entry(*args)


# ---------------------------------------------------------------------- tokens
@settings(max_examples=150, deadline=None, database=None)
@given(st.text(max_size=80), st.integers(min_value=0, max_value=2**63 - 1))
def test_token_round_trip_keeps_principal_and_version(principal, version):
    c = KEYS.verify(KEYS.mint(principal, version))
    assert (c.principal, c.version, c.expires) == (principal, version, None)


def test_token_with_ttl_carries_its_expiry():
    now = time.time()
    c = KEYS.verify(KEYS.mint("alice", 3, ttl_s=60, now=now))
    assert c.expires == int(now + 60)


def test_expired_token_is_refused_saying_so():
    token = KEYS.mint("alice", 3, ttl_s=10, now=time.time() - 100)
    with pytest.raises(BadToken, match="expired"):
        KEYS.verify(token)


def test_token_of_another_secret_is_refused_for_its_signature():
    token = TokenKeys(b"y" * 32).mint("alice", 3)
    with pytest.raises(BadToken, match="signature does not match"):
        KEYS.verify(token)


@pytest.mark.parametrize("token", ["garbage", "", "a.b.c", KEYS.mint("alice", 1)[:-4]])
def test_garbage_is_not_a_token(token):
    with pytest.raises(BadToken):
        KEYS.verify(token)


@pytest.mark.parametrize("claims,why", [
    ({"sub": "alice", "ver": 1, "iat": int(time.time()), "iss": "someone-else"}, "not a token of this cluster"),
    ({"sub": "alice", "iat": int(time.time()), "iss": "rmq-spark"}, "not a token of this cluster"),
    ({"sub": "alice", "ver": "1", "iat": int(time.time()), "iss": "rmq-spark"}, "wrong type"),
])
def test_token_with_wrong_claims_is_refused(claims, why):
    token = jwt.encode(claims, SECRET, algorithm="HS256")
    with pytest.raises(BadToken, match=why):
        KEYS.verify(token)


def test_bad_token_is_a_value_error():
    assert issubclass(BadToken, ValueError)


def test_short_secret_is_refused():
    with pytest.raises(ValueError, match="31 bytes: it needs at least 32"):
        TokenKeys(b"x" * 31)
    TokenKeys(b"x" * 32)


def test_from_file_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match=f"token secret {missing}: No such file"):
        TokenKeys.from_file(str(missing))
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(ValueError, match=f"token secret {short}: .*3 bytes.*at least 32"):
        TokenKeys.from_file(str(short))


def test_make_secret_writes_a_0600_file_that_from_file_reads(tmp_path):
    path = str(tmp_path / "secret")
    assert make_secret(path) == path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = open(path).read()
    assert text.endswith("\n") and len(text.strip()) == 64 and int(text, 16) >= 0
    keys = TokenKeys.from_file(path)
    assert keys.verify(keys.mint("alice", 7)).version == 7
    assert not os.path.exists(path + ".tmp")


def test_make_secret_does_not_overwrite_an_existing_secret(tmp_path):
    path = str(tmp_path / "secret")
    make_secret(path)
    first = open(path).read()
    make_secret(path)
    assert open(path).read() == first
    other = tmp_path / "mine"
    other.write_text("z" * 40)
    make_secret(str(other))
    assert other.read_text() == "z" * 40


# ------------------------------------------------------ metadata group record
def _set(m: MetaState, index: int, name: str, rotate=False, delete=False):
    return m.apply(index, SetPrincipal(name, 1000 + index, rotate=rotate, delete=delete).encode())


def _acls(m: MetaState, index: int, add: bool, *entries: AclEntry):
    return m.apply(index, ChangeAcls(add, tuple(e.encode() for e in entries)).encode())


def test_set_principal_command_encodes_to_its_tuple():
    assert SetPrincipal("alice", 5).encode() == ("set_principal", "alice", 5, False, False)
    assert ChangeAcls(True, (_entry().encode(),)).encode() == \
        ("change_acls", True, (("alice", "topic", "t", False, ("produce",)),))


def test_created_principal_version_is_the_raft_index():
    m = MetaState()
    assert _set(m, 12, "alice") == ("ok", 12)
    assert m.security.version("alice") == 12
    assert m.security.principals["alice"]["created_ms"] == 1012
    assert m.security.version("bob") is None


def test_create_again_without_rotate_already_exists():
    m = MetaState()
    _set(m, 3, "alice")
    res = _set(m, 4, "alice")
    assert res[:2] == ("error", "ALREADY_EXISTS") and "'alice'" in res[2]
    assert m.security.version("alice") == 3


def test_rotate_gives_a_new_version_and_keeps_created():
    m = MetaState()
    _set(m, 3, "alice")
    assert _set(m, 9, "alice", rotate=True) == ("ok", 9)
    p = m.security.principals["alice"]
    assert (p["version"], p["created_ms"], p["rotated_ms"]) == (9, 1003, 1009)
    assert _set(m, 10, "bob", rotate=True) == ("ok", 10)     # rotate of a new one creates it


def test_delete_then_delete_again_is_not_found():
    m = MetaState()
    _set(m, 3, "alice")
    assert _set(m, 4, "alice", delete=True) == ("ok", None)
    assert m.security.version("alice") is None
    res = _set(m, 5, "alice", delete=True)
    assert res[:2] == ("error", "NOT_FOUND") and "'alice'" in res[2]
    assert _set(m, 6, "alice") == ("ok", 6)       # recreated: a version never seen before


def test_change_acls_add_merges_operations_and_counts_changes():
    m = MetaState()
    assert _acls(m, 1, True, _entry(ops=("produce",))) == ("ok", 1)
    assert _acls(m, 2, True, _entry(ops=("consume",)), _entry(name="u")) == ("ok", 2)
    assert _acls(m, 3, True, _entry(ops=("produce", "consume"))) == ("ok", 0)   # nothing new
    assert m.security.entries() == [_entry(ops=("produce", "consume")), _entry(name="u")]
    assert m.security.allows("alice", "consume", "topic", "t")
    assert m.security.allows("alice", "describe", "topic", "u")
    assert not m.security.allows("bob", "consume", "topic", "t")


def test_change_acls_remove_drops_operations_then_the_entry():
    m = MetaState()
    _acls(m, 1, True, _entry(ops=("produce", "consume")), _entry(name="u"))
    assert _acls(m, 2, False, _entry(ops=("produce",))) == ("ok", 1)
    assert m.security.entries() == [_entry(ops=("consume",)), _entry(name="u")]
    assert _acls(m, 3, False, _entry(ops=("alter",))) == ("ok", 0)             # not granted
    assert _acls(m, 4, False, _entry(name="missing")) == ("ok", 0)            # no such entry
    assert _acls(m, 5, False, _entry(ops=("consume",)), _entry(name="u")) == ("ok", 2)
    assert m.security.entries() == [] and m.security.acls == {}
    assert not m.security.allows("alice", "describe", "topic", "t")


def test_prefix_and_literal_entries_are_distinct_keys():
    m = MetaState()
    _acls(m, 1, True, _entry(name="t"), _entry(name="t", prefix=True, ops=("consume",)))
    assert len(m.security.entries()) == 2
    assert m.security.allows("alice", "consume", "topic", "tx")
    assert not m.security.allows("alice", "produce", "topic", "tx")


def test_snapshot_restore_keeps_principals_and_acls():
    m = MetaState()
    _set(m, 3, "alice")
    _set(m, 4, "bob")
    _set(m, 7, "bob", rotate=True)
    _acls(m, 8, True, _entry(ops=("produce", "consume")), _entry("*", "group", "g-", True, ("consume",)),
          _entry("bob", "cluster", "", False, ("alter",)))
    fresh = MetaState()
    fresh.restore(m.snapshot(), 8, None)
    assert fresh.security.principals == m.security.principals
    assert fresh.security.version("alice") == 3 and fresh.security.version("bob") == 7
    assert fresh.security.entries() == m.security.entries()
    assert fresh.security.allows("carol", "consume", "group", "g-1")
    assert fresh.security.allows("bob", "alter", "cluster", "")
    # and it goes on applying as the original would
    assert _set(fresh, 9, "alice")[:2] == ("error", "ALREADY_EXISTS")
    assert _set(fresh, 9, "alice", rotate=True) == ("ok", 9)


def test_snapshot_without_security_restores_to_empty_security():
    m = MetaState()
    _set(m, 1, "alice")
    _acls(m, 2, True, _entry())
    old = json.loads(m.snapshot())
    del old["security"]
    target = MetaState()
    _set(target, 1, "stale")
    _acls(target, 2, True, _entry("stale"))
    target.restore(json.dumps(old).encode(), 2, None)
    assert target.security.principals == {} and target.security.entries() == []
    assert target.security.version("stale") is None


# ------------------------------------------------------------------------ Gate
def _config(**kw) -> SecurityConfig:
    base = dict(authorize=True, tls=True, token_keys=KEYS, superusers=frozenset({"admin"}),
                node_names=frozenset({"node"}))
    base.update(kw)
    return SecurityConfig(**base)


@pytest.fixture
def meta() -> MetaState:
    m = MetaState()
    _set(m, 5, "alice")
    return m


@pytest.fixture
def gate(meta) -> Gate:
    return Gate(_config(), meta)


def _bearer(name: str, version: int, **kw) -> str:
    return "Bearer " + KEYS.mint(name, version, **kw)


def _unauthenticated(gate: Gate, header, match: str | None = None):
    with pytest.raises(ServiceError, match=match) as e:
        gate.principal(header, None)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    return e.value


def test_node_certificate_is_a_node_allowed_everything(gate):
    p = gate.principal(None, "node")
    assert p.is_node and p.all_allowed and p.name == "node"
    assert gate.principal(_bearer("alice", 5), "node").is_node   # the certificate wins


def test_client_certificate_is_a_principal_by_its_name(gate):
    p = gate.principal(None, "carol")
    assert (p.name, p.how, p.superuser, p.is_node) == ("carol", "certificate", False, False)
    assert gate.principal(None, "admin").superuser
    assert gate.principal(_bearer("alice", 5), "carol").name == "alice"   # a token first


def test_token_of_a_recorded_principal_with_its_version(gate):
    p = gate.principal(_bearer("alice", 5), None)
    assert (p.name, p.how, p.superuser, p.is_node) == ("alice", "token", False, False)
    assert gate.principal("bearer " + KEYS.mint("alice", 5), None).name == "alice"


def test_token_of_another_version_is_unauthenticated(gate):
    e = _unauthenticated(gate, _bearer("alice", 4), "replaced by a newer one")
    assert "version 4, now 5" in e.message


def test_rotation_and_deletion_end_a_cached_token(gate, meta):
    header = _bearer("alice", 5)
    gate.principal(header, None)                       # verified and cached
    _set(meta, 6, "alice", rotate=True)
    _unauthenticated(gate, header, "replaced")
    assert gate.principal(_bearer("alice", 6), None).name == "alice"
    _set(meta, 7, "alice", delete=True)
    _unauthenticated(gate, _bearer("alice", 6), "was deleted")


def test_a_deleted_superuser_record_does_not_bring_the_bootstrap_token_back(gate, meta):
    """admin's version-0 token works while admin was never recorded; once a record was
    made (which ends it) and deleted, it stays dead."""
    assert gate.principal(_bearer("admin", 0), None).superuser
    _set(meta, 9, "admin")
    _unauthenticated(gate, _bearer("admin", 0), "replaced")
    _set(meta, 10, "admin", delete=True)
    _unauthenticated(gate, _bearer("admin", 0), "was deleted")


def test_cached_token_is_refused_once_expired(gate, monkeypatch):
    header = _bearer("alice", 5, ttl_s=60)
    assert gate.principal(header, None).name == "alice"
    later = time.time() + 3600
    monkeypatch.setattr(authz, "time", types.SimpleNamespace(time=lambda: later))
    _unauthenticated(gate, header, "expired")


def test_superuser_bootstrap_token_without_a_record(gate):
    p = gate.principal(_bearer("admin", 0), None)
    assert p.superuser and p.all_allowed and not p.is_node
    _unauthenticated(gate, _bearer("admin", 1), "does not exist")


def test_superuser_with_a_record_needs_the_recorded_version(gate, meta):
    _set(meta, 8, "admin")
    _unauthenticated(gate, _bearer("admin", 0), "replaced")
    assert gate.principal(_bearer("admin", 8), None).superuser


def test_version_zero_token_of_a_non_superuser_without_record(gate):
    _unauthenticated(gate, _bearer("mallory", 0), "'mallory' does not exist")


@pytest.mark.parametrize("header,why", [
    ("Basic abc", "must be 'Bearer TOKEN'"),
    ("Token " + KEYS.mint("alice", 5), "must be 'Bearer TOKEN'"),
    (KEYS.mint("alice", 5), "must be 'Bearer TOKEN'"),
    ("Bearer", "must be 'Bearer TOKEN'"),
    ("Bearer ", "not a token of this cluster"),
    ("Bearer garbage", "not a token of this cluster"),
])
def test_header_that_is_not_a_valid_bearer_token(gate, header, why):
    _unauthenticated(gate, header, why)


def test_bad_signature_and_expiry_are_unauthenticated_saying_why(gate):
    _unauthenticated(gate, "Bearer " + TokenKeys(b"y" * 32).mint("alice", 5), "signature")
    _unauthenticated(gate, _bearer("alice", 5, ttl_s=10, now=time.time() - 100), "expired")


def test_node_without_token_secret_takes_no_tokens(meta):
    g = Gate(_config(token_keys=None), meta)
    with pytest.raises(ServiceError, match="takes no tokens") as e:
        g.principal(_bearer("alice", 5), None)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_token_naming_a_node_is_refused(gate, meta):
    _set(meta, 9, "node")
    _unauthenticated(gate, _bearer("node", 9), "is a node's name")


def test_no_credentials_is_anonymous(gate):
    assert gate.principal(None, None) is ANONYMOUS
    assert gate.principal("", "") is ANONYMOUS


def test_sync_is_asked_before_refusing_a_token_made_a_moment_ago(meta):
    synced = []

    def sync():
        synced.append(1)
        _set(meta, 20, "bob")              # the leader's entry, applied here now
    g = Gate(_config(), meta, sync=sync)
    assert g.principal(_bearer("bob", 20), None).name == "bob"
    assert synced == [1]


# the request of each method whose POLICY rule needs something, and what it needs
TOPIC, GROUP, CLUSTER = "topic 't'", "group 'g'", "the cluster"
REQUESTS = {
    "CreateTopic": (rmq_pb2.CreateTopicRequest(config=rmq_pb2.TopicConfig(name="t")), "alter", TOPIC),
    "AlterTopic": (rmq_pb2.AlterTopicRequest(name="t"), "alter", TOPIC),
    "DeleteTopic": (rmq_pb2.DeleteTopicRequest(name="t"), "alter", TOPIC),
    "DescribeTopic": (rmq_pb2.DescribeTopicRequest(name="t"), "describe", TOPIC),
    "Produce": (rmq_pb2.ProduceRequest(topic="t"), "produce", TOPIC),
    "ProduceBatches": (rmq_pb2.ProduceBatchesRequest(batches=[rmq_pb2.ProduceRequest(topic="t")]), "produce", TOPIC),
    "Fetch": (rmq_pb2.FetchRequest(topic="t"), "consume", TOPIC),
    "KvPut": (rmq_pb2.KvPutRequest(topic="t"), "produce", TOPIC),
    "KvRead": (rmq_pb2.KvReadRequest(topic="t"), "consume", TOPIC),
    "Offsets": (rmq_pb2.OffsetsRequest(topic="t"), "describe", TOPIC),
    "OffsetForTimestamp": (rmq_pb2.OffsetForTimestampRequest(topic="t"), "describe", TOPIC),
    "CommitOffsets": (rmq_pb2.CommitOffsetsRequest(consumer_group="g", topic="t"), "consume", GROUP),
    "GetCommittedOffsets": (rmq_pb2.GetCommittedOffsetsRequest(consumer_group="g", topic="t"), "describe", GROUP),
    "ListConsumerGroups": (rmq_pb2.ListConsumerGroupsRequest(topic="t"), "describe", TOPIC),
    "SetWatermark": (rmq_pb2.SetWatermarkRequest(topic="t"), "alter", TOPIC),
    "Lease": (rmq_pb2.LeaseRequest(topic="t"), "alter", TOPIC),
    "GetNodeStatus": (rmq_pb2.NodeStatusRequest(), "describe", CLUSTER),
    "GroupInfo": (rmq_pb2.GroupInfoRequest(group=1), "describe", CLUSTER),
    "ChangeReplicas": (rmq_pb2.ChangeReplicasRequest(group=1), "alter", CLUSTER),
    "TransferLeader": (rmq_pb2.TransferLeaderRequest(group=1), "alter", CLUSTER),
    "DropReplica": (rmq_pb2.DropReplicaRequest(group=1), "alter", CLUSTER),
    "ClusterCommand": (rmq_pb2.ClusterCommandRequest(), "alter", CLUSTER),
    "CreatePrincipal": (rmq_pb2.CreatePrincipalRequest(name="x"), "alter", CLUSTER),
    "DeletePrincipal": (rmq_pb2.DeletePrincipalRequest(name="x"), "alter", CLUSTER),
    "ListPrincipals": (rmq_pb2.ListPrincipalsRequest(), "describe", CLUSTER),
    "ChangeAcls": (rmq_pb2.ChangeAclsRequest(add=True), "alter", CLUSTER),
    "ListAcls": (rmq_pb2.ListAclsRequest(), "describe", CLUSTER),
    # the HTTP port's own (no request message)
    "Metrics": (None, "describe", CLUSTER),
    "Status": (None, "describe", CLUSTER),
}
OPEN_TO_ANY = {"ListTopics": rmq_pb2.ListTopicsRequest(), "ClusterStatus": rmq_pb2.ClusterStatusRequest(),
               "WhoAmI": rmq_pb2.WhoAmIRequest()}


def test_every_policy_method_is_covered_here():
    assert set(REQUESTS) | set(OPEN_TO_ANY) == set(POLICY)
    assert all(POLICY[m] is None for m in OPEN_TO_ANY)


@pytest.mark.parametrize("method", sorted(REQUESTS))
def test_call_without_acls_is_denied_naming_principal_operation_resource(gate, method):
    request, op, what = REQUESTS[method]
    alice = gate.principal(_bearer("alice", 5), None)
    with pytest.raises(ServiceError) as e:
        gate.check_call(method, request, alice)
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert f"principal 'alice' may not {op} {what}" in e.value.message
    assert "rmq acl add alice" in e.value.message


@pytest.mark.parametrize("method", sorted(REQUESTS))
def test_call_with_the_acls_it_needs_is_allowed(gate, meta, method):
    request, _, _ = REQUESTS[method]
    _acls(meta, 10, True, _entry(ops=OPERATIONS), _entry(rtype="group", name="g", ops=OPERATIONS),
          _entry(rtype="cluster", name="", ops=OPERATIONS))
    gate.check_call(method, request, gate.principal(_bearer("alice", 5), None))


@pytest.mark.parametrize("method", sorted(REQUESTS))
def test_superuser_and_node_may_call_everything(gate, method):
    request = REQUESTS[method][0]
    gate.check_call(method, request, gate.principal(_bearer("admin", 0), None))
    gate.check_call(method, request, gate.principal(None, "node"))
    gate.check_call(method, request, gate.principal(None, "admin"))      # superuser's certificate


@pytest.mark.parametrize("method", sorted(OPEN_TO_ANY))
def test_calls_open_to_any_authenticated_caller(gate, method):
    gate.check_call(method, OPEN_TO_ANY[method], gate.principal(_bearer("alice", 5), None))
    with pytest.raises(ServiceError) as e:
        gate.check_call(method, OPEN_TO_ANY[method], ANONYMOUS)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_denial_names_the_first_missing_need():
    """ProduceBatches to two topics, one allowed: the other is named."""
    m = MetaState()
    _set(m, 5, "alice")
    _acls(m, 6, True, _entry(name="a"))
    g = Gate(_config(), m)
    req = rmq_pb2.ProduceBatchesRequest(batches=[rmq_pb2.ProduceRequest(topic="a"),
                                                 rmq_pb2.ProduceRequest(topic="b")])
    with pytest.raises(ServiceError, match="may not produce topic 'b'"):
        g.check_call("ProduceBatches", req, g.principal(_bearer("alice", 5), None))


def test_commit_offsets_needs_the_group_and_the_topic(gate, meta):
    req, _, _ = REQUESTS["CommitOffsets"]
    alice = gate.principal(_bearer("alice", 5), None)
    _acls(meta, 10, True, _entry(rtype="group", name="g", ops=("consume",)))
    with pytest.raises(ServiceError, match="may not consume topic 't'"):
        gate.check_call("CommitOffsets", req, alice)
    _acls(meta, 11, True, _entry(ops=("consume",)))
    gate.check_call("CommitOffsets", req, alice)


def test_star_and_implied_describe_through_the_gate(gate, meta):
    alice = gate.principal(_bearer("alice", 5), None)
    _acls(meta, 10, True, _entry(principal="*", name="pub", prefix=True, ops=("consume",)))
    gate.check_call("Fetch", rmq_pb2.FetchRequest(topic="pub-1"), alice)
    gate.check_call("DescribeTopic", rmq_pb2.DescribeTopicRequest(name="pub-1"), alice)
    with pytest.raises(ServiceError, match="may not produce topic 'pub-1'"):
        gate.check_call("Produce", rmq_pb2.ProduceRequest(topic="pub-1"), alice)


def test_sync_is_asked_before_denying_and_a_grant_there_holds(meta):
    synced = []

    def sync():
        synced.append(1)
        _acls(meta, 30, True, _entry(ops=("produce",)))
    g = Gate(_config(), meta, sync=sync)
    alice = g.principal(_bearer("alice", 5), None)
    g.check_call("Produce", rmq_pb2.ProduceRequest(topic="t"), alice)
    assert synced == [1]
    g.check_call("Produce", rmq_pb2.ProduceRequest(topic="t"), alice)
    assert synced == [1]                     # allowed at once: no sync


def test_unknown_method_needs_alter_on_the_cluster(gate):
    alice = gate.principal(_bearer("alice", 5), None)
    with pytest.raises(ServiceError, match="may not alter the cluster"):
        gate.check_call("SomethingNew", rmq_pb2.HealthRequest(), alice)


@pytest.mark.parametrize("config", [_config(), _config(authorize=False), _config(tls=False),
                                    _config(authorize=False, tls=False)])
def test_health_never_raises(meta, config):
    g = Gate(config, meta)
    for p in (ANONYMOUS, Principal("alice", "token"), Principal("node", "node", True)):
        g.check_call("Health", rmq_pb2.HealthRequest(), p)


def test_anonymous_is_unauthenticated_naming_the_method(gate):
    with pytest.raises(ServiceError, match="Produce needs credentials") as e:
        gate.check_call("Produce", rmq_pb2.ProduceRequest(topic="t"), ANONYMOUS)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("method", NODE_ONLY)
def test_node_only_calls_refuse_a_superuser_token_but_take_a_node(gate, method):
    request = getattr(rmq_pb2, f"{method}Request")()
    for p in (gate.principal(_bearer("admin", 0), None), gate.principal(None, "admin"), ANONYMOUS):
        with pytest.raises(ServiceError, match="is for the cluster's nodes") as e:
            gate.check_call(method, request, p)
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
    gate.check_call(method, request, gate.principal(None, "node"))


@pytest.mark.parametrize("method", NODE_ONLY)
def test_node_only_calls_without_tls_still_refuse_a_superuser_under_authorize(meta, method):
    g = Gate(_config(tls=False), meta)
    request = getattr(rmq_pb2, f"{method}Request")()
    with pytest.raises(ServiceError, match="is for the cluster's nodes") as e:
        g.check_call(method, request, g.principal(_bearer("admin", 0), None))
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_tls_without_authorize_checks_only_the_node_only_calls(meta):
    g = Gate(_config(authorize=False), meta)
    g.check_call("Produce", rmq_pb2.ProduceRequest(topic="t"), ANONYMOUS)
    g.check_call("DeleteTopic", rmq_pb2.DeleteTopicRequest(name="t"), ANONYMOUS)
    with pytest.raises(ServiceError) as e:
        g.check_call("ReplicaFetch", rmq_pb2.ReplicaFetchRequest(), ANONYMOUS)
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
    g.check_call("ReplicaFetch", rmq_pb2.ReplicaFetchRequest(), g.principal(None, "node"))


def test_inactive_config_checks_nothing(meta):
    cfg = SecurityConfig()
    assert not cfg.active and _config(authorize=False).active and _config(tls=False).active
    g = Gate(cfg, meta)
    for method in (*REQUESTS, *NODE_ONLY):
        g.check_call(method, REQUESTS.get(method, (rmq_pb2.HealthRequest(),))[0], ANONYMOUS)


def test_offsets_of_one_data_group_needs_only_describe_on_the_topic(gate, meta):
    """OffsetsRequest.group is the data (raft) group asked, not a consumer group:
    Client.offsets() sends it for every group of the topic."""
    _acls(meta, 10, True, _entry(ops=("consume",)))
    alice = gate.principal(_bearer("alice", 5), None)
    gate.check_call("Offsets", rmq_pb2.OffsetsRequest(topic="t"), alice)
    gate.check_call("Offsets", rmq_pb2.OffsetsRequest(topic="t", group=2), alice)
    with pytest.raises(ServiceError, match="may not describe topic 'u'"):
        gate.check_call("Offsets", rmq_pb2.OffsetsRequest(topic="u", group=2), alice)


def test_offsets_of_one_data_group_with_a_prefix_group_acl(gate, meta):
    """A prefix group ACL of the caller is never matched against the int data group."""
    _acls(meta, 10, True, _entry(ops=("consume",)), _entry(rtype="group", name="g-", prefix=True, ops=("consume",)))
    alice = gate.principal(_bearer("alice", 5), None)
    gate.check_call("Offsets", rmq_pb2.OffsetsRequest(topic="t", group=2), alice)


# -------------------------------------------------------- produce port hello
def test_hello_without_token_has_no_flags():
    assert hello() == hello(None) == hello("") == HELLO.pack(b"RMQP", 1, 0)
    assert check_hello(hello()) == 0


def test_hello_with_token_sets_the_flag_then_length_and_token():
    token = KEYS.mint("alice", 5)
    data = hello(token)
    assert check_hello(data[:HELLO.size]) == FLAG_TOKEN
    (n,) = TOKEN_LEN.unpack(data[HELLO.size:HELLO.size + TOKEN_LEN.size])
    assert n == len(token) and data[HELLO.size + TOKEN_LEN.size:].decode() == token
    assert len(data) == HELLO.size + TOKEN_LEN.size + n


def test_hello_token_length_limit_counts_bytes():
    assert len(hello("a" * MAX_TOKEN)) == HELLO.size + TOKEN_LEN.size + MAX_TOKEN
    with pytest.raises(ValueError, match=f"{MAX_TOKEN + 1} bytes.*at most {MAX_TOKEN}"):
        hello("a" * (MAX_TOKEN + 1))
    with pytest.raises(ValueError, match=f"{MAX_TOKEN + 2} bytes"):
        hello("é" * (MAX_TOKEN // 2 + 1))               # 2 bytes each in UTF-8


@pytest.mark.parametrize("flags", [4, 5, 0x8000, 0xFFFF])
def test_hello_with_unknown_flags_is_refused(flags):
    with pytest.raises(WireProtocolError, match=f"hello flags {flags:#x}: this side knows 0x1 .* and 0x2"):
        check_hello(HELLO.pack(b"RMQP", 1, flags))


@pytest.mark.parametrize("flags", [0, 1, 2, 3])
def test_hello_with_token_and_pipelined_flags_is_taken(flags):
    assert check_hello(HELLO.pack(b"RMQP", 1, flags)) == flags
