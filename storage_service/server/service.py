"""The gRPC servicer: validate, delegate to the node, map errors to status codes.

Every handler runs inside ``_guard``: a ServiceError becomes its status code
(with the leader hint in trailing metadata), anything else is logged and
becomes INTERNAL. No request can take the node down.
"""
from __future__ import annotations

import functools
import logging
import os

import grpc

from ..proto import rmq_pb2, rmq_pb2_grpc
from ..protocol import framing
from ..protocol.fetch_wire import encode_fetch_response
from ..protocol.localread import host_id
from ..protocol.placement import META_GROUP
from ..protocol.tags import filter_batches, parse_tag_expression
from ..statemachine.commands import (AlterTopic, CommitOffsets, CreateTopic, DeleteTopic, Lease,
                                     SetWatermark)
from ..statemachine.meta import FENCED_WATERMARKS, TOPIC_DEFAULTS, queue_growth_error
from .admin_rpc import ClusterAdmin
from .security_rpc import SecurityAdmin
from .dispatch import Parked
from ..protocol.errors import ServiceError, invalid
from .node import StorageNode
from .guard import _guard
from .kv import kv_put, kv_read
from .validate import (LEASE_KINDS, MAX_LEASE_MS, WATERMARK_KINDS, check_config, check_data_group, check_group,
                       check_queue,
                       check_replica_fetch, check_topic_name, validate_produce, validate_spread)

__all__ = ["MessageLogService", "MAX_WAIT_MS"]

log = logging.getLogger(__name__)
ALTERABLE = ("retention_ms", "retention_bytes", "tier", "local_retention_ms", "delete_retention_ms",
             "min_compaction_lag_ms", "compacted_table", "queues")
DEFAULT_FETCH_BYTES = 1 << 20
MAX_FETCH_BYTES = 64 << 20
MAX_WAIT_MS = 30_000


def config_to_pb(cfg: dict) -> rmq_pb2.TopicConfig:
    fields = rmq_pb2.TopicConfig.DESCRIPTOR.fields_by_name
    return rmq_pb2.TopicConfig(**{k: v for k, v in cfg.items() if k in fields})


class MessageLogService(ClusterAdmin, SecurityAdmin, rmq_pb2_grpc.MessageLogServicer):
    def __init__(self, node: StorageNode):
        self.node = node
        self._rr = 0

    # ----------------------------------------------------------------- topics
    @_guard
    def CreateTopic(self, request, context):
        c = request.config
        check_config(c)
        cfg = {"name": c.name, "queues": c.queues, "retention_ms": c.retention_ms,
               "retention_bytes": c.retention_bytes, "cleanup_policy": c.cleanup_policy or "delete",
               "tier": c.tier, "local_retention_ms": c.local_retention_ms,
               "delete_retention_ms": (c.delete_retention_ms if c.HasField("delete_retention_ms")
                                       else TOPIC_DEFAULTS["delete_retention_ms"]),
               "min_compaction_lag_ms": c.min_compaction_lag_ms}
        if c.compacted_table:
            cfg["compacted_table"] = c.compacted_table
        self.node.check_queue_budget(cfg["name"], cfg["queues"])
        created = self.node.meta_command(CreateTopic(cfg, self.node.now_ms()))
        return rmq_pb2.CreateTopicResponse(config=config_to_pb(created))

    @_guard
    def AlterTopic(self, request, context):
        check_topic_name(request.name)
        cfg = self.node.topic(request.name)
        changes = {f: getattr(request, f) for f in ALTERABLE if request.HasField(f)}
        if not changes:
            raise invalid(f"nothing to alter: give {', '.join(ALTERABLE[:-1])} or {ALTERABLE[-1]}")
        if "queues" in changes and changes["queues"] <= cfg["queues"]:
            raise invalid(queue_growth_error(cfg["name"], cfg["queues"], changes["queues"]))
        if "queues" in changes and cfg["cleanup_policy"] == "compact":
            # A key's queue is crc32(key) % queues: with more queues its next value would go
            # to another queue than its current one (two live values, a get that misses it).
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"queues={changes['queues']}: topic {cfg['name']!r} has cleanup policy compact, "
                               f"and a key's queue is crc32(key) % queues: growing it would move keys "
                               f"away from their values. Create a new topic with more queues and copy it")
        check_config(config_to_pb({**cfg, **changes}))
        if "queues" in changes:
            self.node.check_queue_budget(cfg["name"], changes["queues"] - cfg["queues"])
        altered = self.node.meta_command(AlterTopic(request.name, changes))
        if "queues" in changes:
            # New queues are usable at once on every node, not only here.
            self.node.wait_meta_applied_everywhere()
        return rmq_pb2.CreateTopicResponse(config=config_to_pb(altered))

    @_guard
    def DeleteTopic(self, request, context):
        check_topic_name(request.name)
        self.node.meta_command(DeleteTopic(request.name))
        self.node.wait_meta_applied_everywhere()     # no node serves the old topic after this
        return rmq_pb2.DeleteTopicResponse()

    @_guard
    def ListTopics(self, request, context):
        # Served by the metadata leader, which has applied every topic change it acknowledged.
        self.node.require_read_leader(META_GROUP)
        topics = [config_to_pb(t) for t in self.node.meta.list_topics()
                  if self._may_describe(context, "topic", t["name"])]
        return rmq_pb2.ListTopicsResponse(topics=topics)

    def _may_describe(self, context, rtype: str, name: str) -> bool:
        """With ACLs on, list only what the caller may describe (as Kafka lists topics)."""
        gate, p = self.node.gate, getattr(context, "principal", None)
        return gate is None or p is None or not gate.config.authorize or gate.allowed(p, "describe", rtype, name)

    @_guard
    def DescribeTopic(self, request, context):
        check_topic_name(request.name)
        self.node.require_read_leader(META_GROUP)
        cfg = self.node.topic(request.name)
        archived = self.node.meta.watermark(cfg["name"], "archive")
        archive_earliest = self.node.meta.watermark(cfg["name"], "archive_earliest")
        compacted = self.node.meta.watermark(cfg["name"], "compaction")
        job, job_expires = self.node.meta.lease(cfg["name"], "tier", self.node.now_ms())
        resp = rmq_pb2.DescribeTopicResponse(config=config_to_pb(cfg), tier_job=job,
                                             tier_job_expires_ms=job_expires)
        stats, leaders = {}, {}
        for g in sorted({self.node.group_of(cfg["name"], q, cfg) for q in range(cfg["queues"])}):
            found, leader = self.node.group_offsets(cfg, g)
            stats.update(found)
            leaders.update(dict.fromkeys(found, leader))
        for q in range(cfg["queues"]):
            earliest, latest, size = stats.get(q, (0, 0, 0))
            resp.queues.add(queue=q, group=self.node.group_of(cfg["name"], q, cfg), earliest=earliest,
                            latest=latest, size_bytes=size, protected_offset=archived.get(q, -1),
                            leader=leaders.get(q, ""), archive_earliest=archive_earliest.get(q, -1),
                            compacted=compacted.get(q, -1))
        return resp

    # ---------------------------------------------------------------- produce
    @_guard
    def Produce(self, request, context):
        if request.queue == -1 and not request.records:
            self._rr += 1
            return self._produce_spread(*validate_spread(self.node, request, self._rr))
        cfg, block, count = validate_produce(self.node, request)
        res = self.node.produce(cfg, request.queue, block, count, request.producer_id, request.sequence)
        return rmq_pb2.ProduceResponse(results=[self._result(request.queue, res)])

    @_guard
    def ProduceBatches(self, request, context):
        return self.produce_batches(request)

    def produce_batches(self, request: rmq_pb2.ProduceBatchesRequest) -> rmq_pb2.ProduceBatchesResponse:
        """Every batch is submitted before any is waited for, so batches of one
        group share a raft entry; each gets its own outcome. Also served on the
        produce port (``produce_port``), which submits a connection's requests in
        the order they came and answers each once it is done."""
        return self.finish_batches(request, self.submit_batches(request))

    def submit_batches(self, request: rmq_pb2.ProduceBatchesRequest) -> list:
        """Each batch validated and handed to its group's committer: ``(group, future)``,
        or the ServiceError it was refused with."""
        if not request.batches:
            raise invalid("batches is empty: give at least one produce batch")
        submitted = []
        for b in request.batches:
            try:
                if b.queue < 0:
                    raise invalid(f"queue {b.queue}: every batch of ProduceBatches needs an explicit queue")
                cfg, block, count = validate_produce(self.node, b)
                submitted.append(self.node.submit_produce(cfg, b.queue, block, count, b.producer_id,
                                                          b.sequence, b.in_order))
            except ServiceError as e:
                submitted.append(e)
        return submitted

    def finish_batches(self, request: rmq_pb2.ProduceBatchesRequest, submitted: list) -> rmq_pb2.ProduceBatchesResponse:
        """The answer to ``submit_batches``'s batches, once each is committed (or failed)."""
        resp = rmq_pb2.ProduceBatchesResponse()
        for b, sub in zip(request.batches, submitted):
            out = resp.outcomes.add()
            try:
                if isinstance(sub, ServiceError):
                    raise sub
                out.result.CopyFrom(self._result(b.queue, self.node.wait_produce(*sub)))
            except ServiceError as e:
                out.code, out.message = e.code.value[0], e.message
                out.leader = getattr(e, "leader", None) or ""
                out.retry_after_ms = getattr(e, "retry_after_ms", 0)
        return resp

    @staticmethod
    def _result(queue, res):
        base, count, ts, dup = res
        return rmq_pb2.ProduceResult(queue=queue, base_offset=base, count=count,
                                     store_timestamp=ts, duplicate=dup)

    def _produce_spread(self, cfg, parts):
        """queue=-1, split by ``validate_spread``: each part produced here, or on its
        group's leader (as records: it is encoded once)."""
        resp = rmq_pb2.ProduceResponse()
        for q, block, count in parts:
            g = self.node.group_of(cfg["name"], q, cfg)
            raft = self.node.groups.get(g)
            if raft is not None and raft.is_leader:
                res = self.node.produce(cfg, q, block, count, "", 0)
                resp.results.append(self._result(q, res))
            else:
                leader = self.node.leader_of(g)
                if leader is None:
                    raise ServiceError(grpc.StatusCode.UNAVAILABLE, f"group {g} has no leader yet")
                fwd = self.node.stub(leader).Produce(rmq_pb2.ProduceRequest(
                    topic=cfg["name"], queue=q, records=block, count=count), timeout=30)
                resp.results.extend(fwd.results)
        return resp

    # --------------------------------------------------------- key-value
    @_guard
    def KvPut(self, request, context):
        return kv_put(self.node, request)

    @_guard
    def KvRead(self, request, context):
        return kv_read(self.node, request)

    # ------------------------------------------------------------------ fetch
    @_guard
    def Fetch(self, request, context):
        check_topic_name(request.topic)
        cfg = self.node.topic(request.topic, queue=request.queue)
        check_queue(cfg, request.queue)
        if request.offset < 0:
            raise invalid(f"offset {request.offset} is negative: offsets start at 0")
        if request.max_bytes < 0 or request.max_messages < 0 or request.wait_ms < 0:
            raise invalid("max_bytes, max_messages and wait_ms must be >= 0")
        try:
            wanted = parse_tag_expression(request.tags)
        except ValueError as e:
            raise invalid(str(e)) from None
        if not request.allow_follower:       # confirmed before the log is looked at
            self.node.require_read_leader(self.node.group_of(cfg["name"], request.queue, cfg))
        g, ql = self.node.queue_log(cfg, request.queue)
        earliest = ql.earliest if ql else 0
        latest = ql.next_offset if ql else 0
        if request.offset < earliest or request.offset > latest:
            raise ServiceError(grpc.StatusCode.OUT_OF_RANGE,
                               f"offset {request.offset} is out of range for {cfg['name']}/{request.queue}: "
                               f"earliest={earliest} latest={latest}")
        if request.offset == latest and request.wait_ms and getattr(context, "may_park", False):
            # Waits without a thread (dispatch.py); then this runs once more and reads.
            return Parked(functools.partial(self.node.park_fetch, cfg, request.queue, request.offset),
                          min(request.wait_ms, MAX_WAIT_MS) / 1000,
                          functools.partial(self._nothing_new, ql, request.offset))
        batches = b""
        max_bytes = min(request.max_bytes or DEFAULT_FETCH_BYTES, MAX_FETCH_BYTES)
        try:
            if (ql is not None and request.local_host and request.local_host == host_id()
                    and wanted is None and not request.max_messages):
                # A client on this host reads the segment itself (storage_service.localread).
                span = ql.locate(request.offset, max_bytes)
                if span is not None:
                    if self.node.metrics is not None:
                        self.node.metrics.fetched(span.next_offset - request.offset, span.length)
                    return encode_fetch_response(b"", span.next_offset, ql.earliest, ql.next_offset,
                                                 self.node.config.address, span)
            if ql is not None:
                batches = ql.read_view(request.offset, max_bytes)
        except framing.CorruptBatch as e:        # bit rot here: a healthy replica's copy (repair.py)
            batches = self.node.healed_read(os.path.basename(ql.path), request.offset, max_bytes, e)
        if ql is not None:
            batches = self._cap_messages(batches, request.offset, request.max_messages)
            earliest, latest = ql.earliest, ql.next_offset
        nxt = framing.next_offset(batches, request.offset)
        batches = filter_batches(batches, wanted)
        if self.node.metrics is not None:
            self.node.metrics.fetched(nxt - request.offset, len(batches))
        # Encoded here, not through a FetchResponse object: see fetchwire.
        return encode_fetch_response(batches, nxt, earliest, latest, self.node.config.address)

    def _nothing_new(self, ql, offset: int) -> bytes:
        """The answer to a long poll whose wait ended with no record at ``offset``."""
        earliest, latest = (ql.earliest, ql.next_offset) if ql is not None else (0, 0)
        return encode_fetch_response(b"", offset, earliest, latest, self.node.config.address)

    @staticmethod
    def _cap_messages(batches: bytes | memoryview, offset: int, max_messages: int) -> bytes | memoryview:
        if not max_messages:
            return batches
        keep = 0
        for h in framing.iter_batches(batches, verify=False):
            if keep and h.base_offset - offset >= max_messages:
                break
            keep = h.position + h.size
        return batches[:keep]

    # ---------------------------------------------------------------- offsets
    @_guard
    def Offsets(self, request, context):
        check_topic_name(request.topic)
        cfg = self.node.topic(request.topic)
        if request.group:
            check_data_group(self.node, request.group)
            self.node.require_read_leader(request.group)
        resp = rmq_pb2.OffsetsResponse()
        groups = [request.group] if request.group else sorted(
            {self.node.group_of(cfg["name"], q, cfg) for q in range(cfg["queues"])})
        found = {}
        for g in groups:
            found.update(self.node.group_offsets(cfg, g)[0])
        for q in sorted(found):
            earliest, latest, size = found[q]
            resp.queues.add(queue=q, earliest=earliest, latest=latest, size_bytes=size)
        return resp

    @_guard
    def OffsetForTimestamp(self, request, context):
        check_topic_name(request.topic)
        cfg = self.node.topic(request.topic, queue=request.queue)
        check_queue(cfg, request.queue)
        if request.timestamp < 0:
            raise invalid(f"timestamp {request.timestamp} is negative: use ms since the epoch")
        self.node.require_read_leader(self.node.group_of(cfg["name"], request.queue, cfg))
        _, ql = self.node.queue_log(cfg, request.queue)
        off = ql.offset_for_timestamp(request.timestamp) if ql else 0
        return rmq_pb2.OffsetForTimestampResponse(offset=off)

    def _check_group_topic(self, group: str, topic: str, queues=()) -> dict:
        check_group(group)
        check_topic_name(topic)
        return self.node.topic(topic, queue=max(queues, default=-1))

    @_guard
    def CommitOffsets(self, request, context):
        cfg = self._check_group_topic(request.consumer_group, request.topic, request.offsets.keys())
        for q, off in request.offsets.items():
            check_queue(cfg, q)
            if off < 0:
                raise invalid(f"offset {off} for queue {q} is negative")
        self.node.meta_command(CommitOffsets(request.consumer_group, request.topic, dict(request.offsets)))
        return rmq_pb2.CommitOffsetsResponse()

    @_guard
    def GetCommittedOffsets(self, request, context):
        self._check_group_topic(request.consumer_group, request.topic)
        self.node.require_read_leader(META_GROUP)       # read-your-commits
        return rmq_pb2.GetCommittedOffsetsResponse(
            offsets=self.node.meta.committed(request.consumer_group, request.topic))

    @_guard
    def ListConsumerGroups(self, request, context):
        check_topic_name(request.topic)
        self.node.topic(request.topic)
        return rmq_pb2.ListConsumerGroupsResponse(groups=[
            g for g in self.node.meta.groups_for(request.topic) if self._may_describe(context, "group", g)])

    @_guard
    def SetWatermark(self, request, context):
        check_topic_name(request.topic)
        cfg = self.node.topic(request.topic, queue=max(request.offsets.keys(), default=-1))
        if request.kind not in WATERMARK_KINDS:
            raise invalid(f"kind={request.kind!r}: allowed {', '.join(WATERMARK_KINDS)}")
        for q, off in request.offsets.items():
            check_queue(cfg, q)
            if off < 0:
                raise invalid(f"watermark {off} for queue {q} is negative")
        token = None
        if request.kind in FENCED_WATERMARKS:
            if request.lease_token <= 0:
                lease = FENCED_WATERMARKS[request.kind]
                raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                                   f"watermark {request.kind} of topic {request.topic!r}: give lease_token, "
                                   f"the token of the topic's {lease} lease (Lease answers it): only the "
                                   f"job holding it moves this watermark (retention and compaction drop "
                                   "hot data below it)")
            token = request.lease_token
        self.node.meta_command(SetWatermark(request.topic, request.kind, dict(request.offsets), token))
        return rmq_pb2.SetWatermarkResponse()

    @_guard
    def Lease(self, request, context):
        check_topic_name(request.topic)
        self.node.topic(request.topic)
        if request.kind not in LEASE_KINDS:
            raise invalid(f"kind={request.kind!r}: allowed {', '.join(LEASE_KINDS)}")
        if not 1 <= len(request.owner) <= 4096:
            raise invalid(f"owner has {len(request.owner)} characters: give 1-4096")
        if not 0 <= request.ttl_ms <= MAX_LEASE_MS:
            raise invalid(f"ttl_ms={request.ttl_ms}: use 1-{MAX_LEASE_MS} to take or renew, "
                          "0 to release")
        granted, holder, expires, token = self.node.meta_command(
            Lease(request.topic, request.kind, request.owner, request.ttl_ms, self.node.now_ms()))
        return rmq_pb2.LeaseResponse(granted=granted, holder=holder, expires_ms=expires, token=token)

    # ----------------------------------------------------------------- status
    @_guard
    def ClusterStatus(self, request, context):
        self.node.check_member()
        # groups: the founding count (clients place pre-wave-2 topics by its hash);
        # groups added since are in the placement.
        resp = rmq_pb2.ClusterStatusResponse(groups=self.node.config.groups)
        nodes, replicas = self.node.meta.placement()
        for g in sorted(replicas):
            resp.placement.add(group=g, replicas=replicas[g])
        for addr, rec in sorted(nodes.items(), key=lambda kv: kv[1].get("id", 0)):
            resp.members.add(address=addr, node_id=rec.get("id", 0), state=rec.get("state", ""),
                             since_ms=rec.get("since_ms", 0), rack=rec.get("rack", ""))
        resp.controller = self.node.controller.doing
        resp.rebalance_asked, resp.rebalance_done = self.node.meta.rebalance, self.node.meta.rebalanced
        if not self._may_describe(context, "cluster", ""):
            return resp          # any client routes by the placement; the nodes' details need describe
        known = self.node.cluster_nodes()
        for addr in known:
            if addr == self.node.config.address:
                resp.nodes.append(self.node.local_status())
                continue
            try:
                resp.nodes.append(self.node.stub(addr).GetNodeStatus(rmq_pb2.NodeStatusRequest(), timeout=1.0))
            except grpc.RpcError:
                resp.nodes.add(address=addr, node_id=nodes.get(addr, {}).get("id", known.index(addr)),
                               reachable=False)
        return resp

    @_guard
    def GetNodeStatus(self, request, context):
        return self.node.local_status()

    @_guard
    def Health(self, request, context):
        with_leader = sum(1 for g in self.node.groups if self.node.leader_of(g))
        removed = self.node.meta.node_state(self.node.config.address) == "removed"
        placed = bool(self.node.meta.replicas)          # the cluster's placement, applied here
        total = sum(st.queues.total() for st in list(self.node.states.values()))
        closed = sum(len(st.queues.closed_names()) for st in list(self.node.states.values()))
        return rmq_pb2.HealthResponse(serving=(with_leader == len(self.node.groups) and placed and not removed
                                               and self.node.ports_up),
                                      groups_with_leader=with_leader, groups_total=len(self.node.groups),
                                      queues_open=total - closed, queues_total=total)

    @_guard
    def ReplicaFetch(self, request, context):
        check_replica_fetch(request)
        try:
            data = self.node.replica_read(request.queue_dir, request.offset, request.end_offset,
                                          min(request.max_bytes or DEFAULT_FETCH_BYTES, MAX_FETCH_BYTES))
        except framing.CorruptBatch as e:        # ask another replica; this one repairs its copy
            self.node.queue_repair(request.queue_dir)
            raise ServiceError(grpc.StatusCode.UNAVAILABLE,
                               f"{request.queue_dir} offset {request.offset}: this replica's copy is corrupt "
                               f"({e}); being repaired") from e
        return rmq_pb2.ReplicaFetchResponse(batches=data, next_offset=framing.next_offset(data, request.offset))
