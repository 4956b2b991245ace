"""Messages in and out: the forms ``produce`` accepts -> protobuf or records
blocks, fetched records blocks -> ``Record``, topic configs -> dicts."""
from __future__ import annotations

import time
from typing import Sequence

from storage_service.proto import rmq_pb2
from storage_service.protocol import framing, records

from ._types import Message, Record, msg_id

__all__ = ["MessageLike", "normalize", "to_pb", "to_block", "plain_block", "decode_records",
           "topic_config"]

MessageLike = bytes | str | Message | dict


def _as_bytes(v) -> bytes:
    return bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else str(v).encode()


def normalize(m: MessageLike, now_ms: int) -> Message:
    """Any accepted message form -> a Message with bytes value/key and str properties."""
    if isinstance(m, (bytes, bytearray, memoryview, str)):
        return Message(value=_as_bytes(m), born_timestamp=now_ms)
    if isinstance(m, dict):
        m = Message(**m)
    value = None if m.value is None else _as_bytes(m.value)     # None: a tombstone
    return Message(value=value, key=None if m.key is None else _as_bytes(m.key),
                   tags=m.tags or "", properties={str(k): str(v) for k, v in (m.properties or {}).items()},
                   born_timestamp=m.born_timestamp or now_ms)


def to_pb(m: MessageLike) -> rmq_pb2.Message:
    n = normalize(m, int(time.time() * 1000))
    pb = rmq_pb2.Message(value=n.value or b"", null_value=n.value is None, tags=n.tags,
                         properties=n.properties, born_timestamp=n.born_timestamp)
    if n.key is not None:
        pb.key = n.key
    return pb


def to_block(messages: Sequence[MessageLike]) -> bytes:
    """Messages -> the columnar records block the service stores as is."""
    now = int(time.time() * 1000)
    ms = [normalize(m, now) for m in messages]
    return records.encode([m.value for m in ms], [m.key for m in ms], [m.tags for m in ms],
                          [m.properties for m in ms], [m.born_timestamp for m in ms])


def plain_block(messages: Sequence[MessageLike]) -> bytes:
    """``to_block``, without a Message object per message when all are plain bytes."""
    if all(type(m) is bytes for m in messages):
        return records.encode(messages, born_ts=[int(time.time() * 1000)] * len(messages))
    return to_block(messages)


def decode_records(topic: str, queue: int, batches: bytes, start: int,
                   limit: int | None = None) -> list[Record]:
    out = []
    for off, store_ts, key, value, tags, props, born in framing.iter_records_from(batches, start):
        out.append(Record(topic, queue, off, key, value, tags, props, born, store_ts, msg_id(topic, queue, off)))
        if limit is not None and len(out) >= limit:
            break
    return out


def topic_config(c: rmq_pb2.TopicConfig) -> dict:
    return dict(name=c.name, queues=c.queues, retention_ms=c.retention_ms,
                retention_bytes=c.retention_bytes, cleanup_policy=c.cleanup_policy, tier=c.tier,
                local_retention_ms=c.local_retention_ms, delete_retention_ms=c.delete_retention_ms,
                min_compaction_lag_ms=c.min_compaction_lag_ms, compacted_table=c.compacted_table,
                incarnation=c.incarnation, created_ms=c.created_ms, queue_groups=list(c.queue_groups))
