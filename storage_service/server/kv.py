"""The key-value calls of a node: ``KvPut`` and ``KvRead`` (issue 40, RIP-22).

A put (or delete) is a produce of one keyed message to the key's queue
(``crc32(key) % queues``, the produce rule), with its condition decided at
apply (``statemachine/kv.py``): it goes through the group's committer like any
produce, shares raft entries with other batches, and a retry with the same
producer id and sequence is answered as the first attempt was. Reads are served
by the queue's leader after it confirmed its lease (linearizable, as ``Fetch``),
or by any replica with ``allow_follower`` (its applied state: behind the
leader's by what it has not applied yet).
"""
from __future__ import annotations

import zlib
from typing import Callable

import grpc

from storage_service.proto import rmq_pb2

from ..log.durability import Damaged
from ..protocol import records
from ..statemachine.data import queue_dir
from ..statemachine.kv import EXPIRES_PROPERTY, KV_CONFLICT, KvEntry
from ..protocol.errors import ServiceError
from .validate import check_batch_bytes, check_topic_name, invalid

__all__ = ["MAX_KEY_BYTES", "KvConflict", "kv_put", "kv_put_submit", "kv_read"]

MAX_KEY_BYTES = 4096
DEFAULT_LIMIT, MAX_LIMIT = 1000, 10_000


class KvConflict(ServiceError):
    """A write's condition failed: nothing was stored."""

    def __init__(self, topic: str, key: bytes, current: int, condition: str):
        now = f"is at revision {current}" if current >= 0 else "has no live value"
        super().__init__(grpc.StatusCode.ABORTED,
                         f"kv conflict: key {key!r} of topic {topic!r} {now} (the write asked {condition}); "
                         f"current revision {current}")
        self.current = current


def _kv_topic(node, topic: str) -> dict:
    check_topic_name(topic)
    cfg = node.topic(topic)
    if cfg["cleanup_policy"] != "compact":
        raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                           f"topic {topic!r} has cleanup policy {cfg['cleanup_policy']!r}: key-value calls need a "
                           f"compact topic (rmq topic create NAME --cleanup-policy compact)")
    return cfg


def _check_key(key: bytes) -> None:
    if not key:
        raise invalid("key is empty: give a key of 1 to 4096 bytes")
    if len(key) > MAX_KEY_BYTES:
        raise invalid(f"key is {len(key)} bytes; the limit is {MAX_KEY_BYTES} bytes")


def _queue_of(cfg: dict, key: bytes) -> int:
    return zlib.crc32(key) % cfg["queues"]


def kv_put(node, request: rmq_pb2.KvPutRequest) -> rmq_pb2.KvPutResponse:
    return kv_put_submit(node, request)()


def kv_put_submit(node, request: rmq_pb2.KvPutRequest) -> Callable[[], rmq_pb2.KvPutResponse]:
    """Check a put and hand it to its group's committer; returns the wait for its answer
    (the produce port's reader goes on reading meanwhile: ``produce_port._Answers``).
    Bad input and a node that cannot take it raise here, before anything is submitted."""
    cfg = _kv_topic(node, request.topic)
    _check_key(request.key)
    if request.delete and request.value:
        raise invalid("delete with a value: a delete stores a tombstone; give no value")
    has_rev = request.HasField("if_revision")
    if has_rev and request.if_absent:
        raise invalid("if_revision and if_absent together: give one condition")
    if has_rev and request.if_revision < 0:
        raise invalid(f"if_revision={request.if_revision} is negative: revisions are offsets, 0 or more")
    if request.ttl_ms < 0 or (request.ttl_ms and request.delete):
        raise invalid(f"ttl_ms={request.ttl_ms}: give 0 (no expiry) or more, and none on a delete")
    condition = ("revision", request.if_revision) if has_rev else ("absent",) if request.if_absent else None
    expires = str(node.now_ms() + request.ttl_ms) if request.ttl_ms else None
    props = [{EXPIRES_PROPERTY: expires}] if expires else None
    block = records.encode([None if request.delete else request.value], [request.key], properties=props)
    size = len(request.key) + len(request.value) + (len(EXPIRES_PROPERTY) + len(expires) if expires else 0)
    limit = node.config.max_message_bytes
    if size > limit:
        raise invalid(f"value is {len(request.value)} bytes; the message (key, value and TTL) is {size} bytes "
                      f"and the limit is {limit} bytes (the node's --max-message-bytes)")
    check_batch_bytes(node, len(block))     # (with the size above, what check_block finds, without a parse)
    queue = _queue_of(cfg, request.key)
    g, fut = node.submit_produce(cfg, queue, block, 1, request.producer_id, request.sequence,
                                 condition=condition)

    def answer() -> rmq_pb2.KvPutResponse:
        res = node.wait_produce(g, fut)
        if res[0] == KV_CONFLICT:
            asked = "no live value" if condition == ("absent",) else f"revision {request.if_revision}"
            raise KvConflict(request.topic, request.key, res[1], asked)
        return rmq_pb2.KvPutResponse(revision=res[0], duplicate=res[3])
    return answer


def _entry(e: KvEntry, queue: int) -> rmq_pb2.KvEntry:
    return rmq_pb2.KvEntry(key=e.key, value=e.value or b"", deleted=e.value is None, revision=e.revision,
                           store_timestamp=e.store_ts, expires_ms=e.expires_ms, queue=queue)


def kv_read(node, request: rmq_pb2.KvReadRequest) -> rmq_pb2.KvReadResponse:
    try:
        return _kv_read(node, request)
    except Damaged as e:                   # a copy failed its check: being repaired (kv.py)
        raise ServiceError(grpc.StatusCode.UNAVAILABLE, f"{e}; retry") from None


def _kv_read(node, request: rmq_pb2.KvReadRequest) -> rmq_pb2.KvReadResponse:
    cfg = _kv_topic(node, request.topic)
    limit = request.limit or DEFAULT_LIMIT
    if limit < 0 or limit > MAX_LIMIT:
        raise invalid(f"limit={request.limit}: give 1 to {MAX_LIMIT} (0: {DEFAULT_LIMIT})")
    now = node.now_ms()
    if request.op == rmq_pb2.KvReadRequest.KEYS:
        if not 0 <= request.queue < cfg["queues"]:
            raise invalid(f"queue {request.queue}: KEYS lists one queue, 0..{cfg['queues'] - 1}")
        store, name = _store(node, cfg, request.queue, request.allow_follower)
        after = request.after if request.HasField("after") else None
        keys, end = store.keys(name, request.prefix, after, limit, now)
        resp = rmq_pb2.KvReadResponse(end=end)
        for k, r in keys:
            e = store.read(name, r) if request.values else None
            if request.values and e is None:
                continue                     # compacted since: a later revision is at or past `end`
            resp.entries.add(key=k, revision=r, queue=request.queue, value=e.value if e else b"",
                             store_timestamp=e.store_ts if e else 0, expires_ms=e.expires_ms if e else 0)
        return resp
    _check_key(request.key)
    queue = _queue_of(cfg, request.key)
    store, name = _store(node, cfg, queue, request.allow_follower)
    if request.op == rmq_pb2.KvReadRequest.HISTORY:
        return rmq_pb2.KvReadResponse(entries=[_entry(e, queue) for e in store.history(name, request.key, limit)])
    if request.HasField("revision") and request.revision < 0:
        raise invalid(f"revision={request.revision} is negative: revisions are offsets, 0 or more")
    try:
        e = store.get(name, request.key, now, request.revision if request.HasField("revision") else None)
    except KeyError as err:
        raise ServiceError(grpc.StatusCode.OUT_OF_RANGE, err.args[0]) from None
    return rmq_pb2.KvReadResponse(entries=[] if e is None else [_entry(e, queue)])


def _store(node, cfg: dict, queue: int, allow_follower: bool):
    """The data group's key-value store holding ``queue`` (its leader's, after the lease
    check, unless ``allow_follower``) and the queue's name there."""
    g = node.group_of(cfg["name"], queue, cfg)
    if allow_follower:
        node.hosted(g)
    else:
        node.require_read_leader(g)
    return node.states[g].kv, queue_dir(cfg["name"], cfg["incarnation"], queue)
