"""Hostile input (issue 18): random requests to every gRPC method, and bodies that are not
requests at all, against a real cluster. No answer may be INTERNAL or UNKNOWN (bad input
gets INVALID_ARGUMENT or the precise code), nothing is logged as an internal error, and
every node keeps serving.

Requests are generated from the ``.proto``'s descriptors with hypothesis: every field of
its type, strings from a mix of plausible names (an existing topic, queue directory
names) and arbitrary text, integers across the whole range.
"""
from __future__ import annotations

import glob
import os

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_spark.client import Client
from storage_service.proto import rmq_pb2

from .conftest import start_cluster

pytestmark = pytest.mark.integration

SERVICE = rmq_pb2.DESCRIPTOR.services_by_name["MessageLog"]
FD = rmq_pb2.DESCRIPTOR.message_types_by_name["TopicConfig"].fields[0].__class__
BAD = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
NAMES = ["fz", "fz-kv", "", "fz~abc~0", "fz~abc~x", "a~b", "~~", "fz/0", "ünï", "x" * 300]
# fields whose large values would only make the test slow (a long poll), not more hostile
SMALL = {"wait_ms": 30, "max_messages": 10_000, "queues": 64}


def _scalar(f):
    t = f.type
    if f.name in SMALL:
        return st.integers(min_value=-5, max_value=SMALL[f.name])
    if t in (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32):
        return st.one_of(st.integers(-3, 10), st.integers(-2**31, 2**31 - 1))
    if t in (FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64):
        return st.one_of(st.integers(-3, 1000), st.integers(-2**63, 2**63 - 1))
    if t in (FD.TYPE_UINT32, FD.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    if t in (FD.TYPE_UINT64, FD.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if t == FD.TYPE_BOOL:
        return st.booleans()
    if t == FD.TYPE_STRING:
        return st.one_of(st.sampled_from(NAMES), st.text(max_size=40))
    if t == FD.TYPE_BYTES:
        return st.binary(max_size=200)
    if t in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return st.floats(allow_nan=False, width=32)
    if t == FD.TYPE_ENUM:
        return st.sampled_from([v.number for v in f.enum_type.values])
    raise AssertionError(f"no strategy for field {f.full_name} of type {t}")


def message(desc, depth: int = 0):
    """A strategy for messages of ``desc``: any subset of its fields, each of its type."""
    fields = {}
    for f in desc.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            fields[f.name] = st.dictionaries(_scalar(k), _scalar(v), max_size=4)
        elif f.message_type is not None:
            if depth >= 2:
                continue
            inner = message(f.message_type, depth + 1)
            fields[f.name] = st.lists(inner, max_size=3) if f.is_repeated else inner
        else:
            fields[f.name] = st.lists(_scalar(f), max_size=3) if f.is_repeated else _scalar(f)
    cls = getattr(rmq_pb2, desc.name, None) or _nested(desc)
    return st.fixed_dictionaries({}, optional=fields).map(lambda kw: _build(cls, desc, kw))


def _nested(desc):
    from google.protobuf import message_factory
    return message_factory.GetMessageClass(desc)


def _build(cls, desc, kw):
    msg = cls()
    for name, value in kw.items():
        f = desc.fields_by_name[name]
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            getattr(msg, name).update(value)
        elif f.is_repeated and f.message_type is not None:
            getattr(msg, name).extend(value)
        elif f.is_repeated:
            getattr(msg, name).extend(value)
        elif f.message_type is not None:
            getattr(msg, name).CopyFrom(value)
        else:
            setattr(msg, name, value)
    return msg


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("hostile"), groups=2)
    with Client(c.endpoints) as client:
        client.create_topic("fz", queues=2)
        client.create_topic("fz-kv", queues=1, cleanup_policy="compact")
        client.create_topic("keep-me", queues=1)        # not a name the fuzzing uses
        client.produce("keep-me", [b"a", b"b"], queue=0)
    channel = grpc.insecure_channel(c.addresses[0])
    yield c, channel
    channel.close()
    c.stop()


def _call(channel, method: str, body: bytes) -> grpc.StatusCode:
    rpc = channel.unary_unary(f"/{SERVICE.full_name}/{method}", request_serializer=lambda b: b,
                              response_deserializer=lambda b: b)
    try:
        rpc(body, timeout=10)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


@pytest.mark.parametrize("method", [m.name for m in SERVICE.methods])
def test_random_requests_get_no_internal_error(hostile, method):
    cluster, channel = hostile
    desc = SERVICE.methods_by_name[method].input_type
    seen: list[tuple[grpc.StatusCode, str]] = []

    @settings(max_examples=30, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(message(desc))
    def one(request):
        code = _call(channel, method, request.SerializeToString())
        if code in BAD:
            seen.append((code, str(request)[:300]))

    one()
    assert not seen, f"{method}: {len(seen)} answers {seen[0][0]} for requests like {seen[0][1]!r}"


@pytest.mark.parametrize("method", [m.name for m in SERVICE.methods])
def test_a_body_that_is_not_a_request_is_invalid_argument(hostile, method):
    cluster, channel = hostile
    # a truncated varint and a field with a wire type the message cannot hold
    for body in (b"\x08\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\xff" * 7):
        assert _call(channel, method, body) == grpc.StatusCode.INVALID_ARGUMENT, (method, body)


def test_after_the_fuzzing_every_node_serves_and_logged_no_internal_error(hostile):
    cluster, _ = hostile
    cluster.wait_ready(timeout=30)
    with Client(cluster.endpoints) as c:
        assert [r.value for r in c.fetch("keep-me", 0, 0).records] == [b"a", b"b"]
    for log in glob.glob(os.path.join(cluster.log_dir, "node-*.log")):
        text = open(log, errors="replace").read()
        assert "internal error" not in text and " failed\nTraceback" not in text, log
