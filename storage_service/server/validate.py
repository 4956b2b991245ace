"""Where a request is validated: names, queues, topic configs, produce batches.

Every check raises ``ServiceError`` (INVALID_ARGUMENT naming the field and
what is allowed, RESOURCE_EXHAUSTED naming the limit) before anything is
submitted to raft, so a bad request changes nothing.
"""
from __future__ import annotations

import re
import zlib

import grpc

from ..proto import rmq_pb2
from ..protocol import records
from ..statemachine.data import parse_queue_dir
from ..protocol.errors import ServiceError, invalid

__all__ = ["CLEANUP_POLICIES", "LEASE_KINDS", "MAX_LEASE_MS", "WATERMARK_KINDS", "check_block", "check_config",
           "check_group", "check_queue", "check_replica_fetch", "check_topic_name", "messages_to_block", "parse_block",
           "validate_produce", "validate_spread"]

TOPIC_RE = re.compile(r"^[A-Za-z0-9_.-]{1,127}$")
GROUP_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,255}$")
CLEANUP_POLICIES = ("delete", "compact")
WATERMARK_KINDS = ("archive", "archive_earliest", "compaction")
LEASE_KINDS = ("tier", "compact")
# An archive or table on an object store: SCHEME://BUCKET/... (rmq_spark.fs.OBJECT_SCHEMES)
_STORE_URI = r"((s3a|s3|s3n|gs)://[^/:@]+|(hdfs|abfs|abfss)://[^/]+)(/|$)"
MAX_LEASE_MS = 86_400_000


def check_topic_name(name: str) -> None:
    if not TOPIC_RE.match(name or ""):
        raise invalid(f"topic name {name!r} is invalid: use 1-127 characters from [A-Za-z0-9_.-]")


def check_queue(cfg: dict, queue: int) -> None:
    if not 0 <= queue < cfg["queues"]:
        raise invalid(f"queue {queue} does not exist in topic {cfg['name']!r}: "
                      f"valid queues are 0..{cfg['queues'] - 1}")


def check_config(c: rmq_pb2.TopicConfig) -> None:
    check_topic_name(c.name)
    if not 1 <= c.queues <= 4096:
        raise invalid(f"queues={c.queues}: must be between 1 and 4096")
    for field in ("retention_ms", "retention_bytes", "local_retention_ms", "delete_retention_ms",
                  "min_compaction_lag_ms"):
        if getattr(c, field) < 0:
            raise invalid(f"{field}={getattr(c, field)}: must be >= 0 (0 = unlimited)")
    if c.cleanup_policy and c.cleanup_policy not in CLEANUP_POLICIES:
        raise invalid(f"cleanup_policy={c.cleanup_policy!r}: allowed {', '.join(CLEANUP_POLICIES)}")
    if c.tier and c.cleanup_policy == "compact":
        raise invalid(f"tier={_masked(c.tier)!r}: topic {c.name!r} has cleanup policy compact; tiering archives "
                      "delete topics (a compact topic's table is its compacted_table)")
    if c.compacted_table and c.cleanup_policy != "compact":
        raise invalid(f"compacted_table={_masked(c.compacted_table)!r}: topic {c.name!r} has cleanup policy "
                      f"{c.cleanup_policy or 'delete'}; only a compact topic has a compacted table")
    if c.compacted_table and not re.match(rf"^delta:(/|file:/|{_STORE_URI})", c.compacted_table):
        raise invalid(f"compacted_table={_masked(c.compacted_table)!r}: use delta:PATH with an "
                      "absolute PATH or an object-store URI without credentials "
                      "(delta:s3a://BUCKET/PREFIX)")
    if c.tier and not re.match(r"^(delta|parquet):.+", c.tier):
        raise invalid(f"tier={_masked(c.tier)!r}: use delta:PATH or parquet:PATH")
    if c.tier and not re.match(rf"^(delta|parquet):(/|file:/|{_STORE_URI})", c.tier):
        # every job and reader must find the same archive, whatever its working directory
        raise invalid(f"tier={_masked(c.tier)!r}: the archive PATH must be absolute or an object-store "
                      "URI with a bucket and no credentials (e.g. delta:/data/archive, "
                      "delta:s3a://bucket/archive)")


def _masked(spec: str) -> str:
    """A tier or table spec with any credentials in its URI masked."""
    return re.sub(r"\b(s3a|s3n|s3|gs)://(?:[^/@:]*@|[^/@:]*:[^@]*@)", r"\1://***@", spec)


def messages_to_block(msgs, index: list[int] | None = None) -> bytes:
    """Protobuf messages -> a columnar records block (``null_value`` -> a tombstone);
    ``index``: the request's number of each message (errors name it)."""
    for i, m in enumerate(msgs):
        if m.null_value and m.value:
            raise invalid(f"message {i if index is None else index[i]} has null_value set and "
                          f"{len(m.value)} value bytes: a tombstone has no value")
    return records.encode([None if m.null_value else m.value for m in msgs],
                          [m.key if m.HasField("key") else None for m in msgs],
                          [m.tags for m in msgs], [m.properties for m in msgs],
                          [m.born_timestamp for m in msgs])


def check_group(group: str) -> None:
    if not GROUP_RE.match(group or ""):
        raise invalid(f"consumer_group {group!r} is invalid: use 1-255 characters from [A-Za-z0-9_.:-]")


def validate_produce(node, request) -> tuple[dict, bytes, int]:
    """Check a produce request to one queue; returns (topic config, records block, count).
    Legacy ``messages`` are encoded here, once (``messages_to_block``)."""
    cfg, count = _produce_head(node, request)
    if request.records:
        block = request.records
        single = records.sound_single(block) if count == 1 else None
        if single is not None:          # one record: checked without numpy (sound_single)
            _check_size(node, 0, single[0])
            check_batch_bytes(node, len(block))
            if cfg["cleanup_policy"] == "compact" and not single[1]:
                _refuse_keyless(cfg, 0)
        else:
            check_block(node, cfg, parse_block(block, count))
    else:
        block = messages_to_block(request.messages)
        check_block(node, cfg, records.parse(block, count, check=False))   # sound by construction
    if request.queue >= 0:
        check_queue(cfg, request.queue)
    return cfg, block, count


def validate_spread(node, request, round_robin: int) -> tuple[dict, list[tuple[int, bytes, int]]]:
    """Check a produce request with ``queue=-1`` and split it: keyed messages go to
    ``crc32(key) % queues``, the rest to queue ``round_robin % queues``. Returns the topic
    config and ``(queue, records block, count)`` a queue, each part encoded once."""
    cfg, count = _produce_head(node, request)
    by_queue: dict[int, list[int]] = {}
    for i, m in enumerate(request.messages):
        q = zlib.crc32(m.key) % cfg["queues"] if m.HasField("key") else round_robin % cfg["queues"]
        by_queue.setdefault(q, []).append(i)
    parts, size = [], 0
    for q, at in sorted(by_queue.items()):
        block = messages_to_block([request.messages[i] for i in at], at)
        cols = records.parse(block, len(at), check=False)
        check_block(node, cfg, cols, at)
        size += cols.size
        parts.append((q, block, len(at)))
    check_batch_bytes(node, size)
    return cfg, parts


def _produce_head(node, request) -> tuple[dict, int]:
    """What every produce request is checked for first: its topic, queue and count."""
    check_topic_name(request.topic)
    cfg = node.topic(request.topic, queue=request.queue)
    if request.queue < -1:
        raise invalid(f"queue {request.queue}: use 0..{cfg['queues'] - 1}, or -1 to let the service choose")
    if request.records:
        if request.messages:
            raise invalid("give either messages or records, not both")
        if request.queue < 0:
            raise invalid("records need an explicit queue (0..{}); send messages to let the "
                          "service choose".format(cfg["queues"] - 1))
        count = request.count
        if count <= 0:
            raise invalid(f"count={count}: messages is empty: a produce request needs at least one message")
    else:
        count = len(request.messages)
    if not count:
        raise invalid("messages is empty: a produce request needs at least one message")
    if count > node.config.max_batch_messages:
        raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"{count} messages in one request; the limit is "
                           f"{node.config.max_batch_messages}")
    return cfg, count

def parse_block(block: bytes, count: int) -> records.Columns:
    if count <= 0:
        raise invalid(f"count={count}: messages is empty: a produce request needs at least one message")
    try:
        cols = records.parse(block, count)
    except ValueError as e:
        raise invalid(f"records: {e}") from None
    if cols.offset_delta[0] != 0 or cols.offset_delta[-1] != count - 1:
        raise invalid("records: a produced block must have offset deltas 0..count-1")
    return cols


def check_block(node, cfg: dict, cols: records.Columns, index: list[int] | None = None) -> None:
    """A block's messages against the node's limits and the topic's policy; ``index``: the
    request's number of each message, where the block is a part of the request."""
    sizes = cols.message_sizes()
    big = int(sizes.argmax())
    _check_size(node, big if index is None else index[big], int(sizes[big]))
    check_batch_bytes(node, cols.size)
    if cfg["cleanup_policy"] == "compact" and (keyless := ~cols.has_key()).any():
        i = int(keyless.argmax())
        _refuse_keyless(cfg, i if index is None else index[i])


def _check_size(node, i: int, size: int) -> None:
    limit = node.config.max_message_bytes
    if size > limit:
        raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"message {i} is {size} bytes; the limit is {limit} bytes")


def _refuse_keyless(cfg: dict, i: int) -> None:
    raise invalid(f"topic {cfg['name']!r} has cleanup policy compact: every message needs "
                  f"a key (message {i} of the batch has none)")


def check_batch_bytes(node, size: int) -> None:
    """A request's (or block's) bytes against the node's batch limit."""
    if size > node.config.max_batch_bytes:
        raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"request carries {size} bytes; the batch limit is "
                           f"{node.config.max_batch_bytes} bytes")


def check_replica_fetch(request: rmq_pb2.ReplicaFetchRequest) -> None:
    """A peer's catch-up read: ``queue_dir`` is ``TOPIC~INCARNATION~QUEUE``, offsets >= 0."""
    try:
        topic, incarnation, queue = parse_queue_dir(request.queue_dir)
    except ValueError:
        topic, incarnation, queue = "", "", -1
    if not incarnation or queue < 0:
        raise invalid(f"queue_dir {request.queue_dir!r} is invalid: use TOPIC~INCARNATION~QUEUE "
                      "(a queue's directory name on the nodes)")
    check_topic_name(topic)
    for field in ("offset", "end_offset", "max_bytes"):
        if getattr(request, field) < 0:
            raise invalid(f"{field}={getattr(request, field)}: must be >= 0")


def check_data_group(node, group: int, meta_ok: bool = False) -> None:
    """A raft group number this cluster has (the metadata group 0 only if ``meta_ok``)."""
    known = sorted(node.meta.placement()[1]) or list(range(1, node.config.groups + 1))
    if group == 0 and meta_ok:
        return
    if group not in known:
        allowed = ("0 (metadata) and " if meta_ok else "") + f"data groups {known[0]}..{known[-1]}"
        raise invalid(f"group {group}: this cluster has {allowed}")


_ADDRESS = re.compile(r"^[A-Za-z0-9.\-]+:\d{1,5}$")


def check_node_address(address: str) -> None:
    """A node's gRPC address: HOST:PORT, the port below 65534 (its raft and produce
    ports are the two after it)."""
    if not _ADDRESS.match(address or "") or not 1 <= int(address.rsplit(":", 1)[1]) <= 65533:
        raise invalid(f"node address {address!r}: give HOST:PORT with PORT 1-65533 (the node's gRPC "
                      "port; its raft and produce ports are the next two)")
