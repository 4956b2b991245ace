"""A ``Client``'s calls that are not the data path: topics, offsets and consumer
groups, watermarks and leases, cluster status and commands (``rmq topic``,
``rmq offsets``, ``rmq cluster``)."""
from __future__ import annotations

from storage_service.proto import rmq_pb2
from storage_service.protocol.placement import META_GROUP

from ._messages import topic_config
from ._types import QueueOffsets

__all__ = ["AdminCalls"]


class AdminCalls:
    """Mixed into ``Client`` (its ``call``, ``group_of`` and ``_note_placement``)."""

    # -------------------------------------------------------------- topics
    def create_topic(self, name: str, queues: int = 4, retention_ms: int = 0,
                     retention_bytes: int = 0, cleanup_policy: str = "delete", tier: str = "",
                     local_retention_ms: int = 0, delete_retention_ms: int | None = None,
                     min_compaction_lag_ms: int = 0) -> dict:
        """Create a topic. ``delete_retention_ms`` (None = 24 h) and
        ``min_compaction_lag_ms`` apply to ``cleanup_policy="compact"``: how long
        a tombstone stays readable, and how long a record is never compacted."""
        cfg = rmq_pb2.TopicConfig(name=name, queues=queues, retention_ms=retention_ms,
                                  retention_bytes=retention_bytes, cleanup_policy=cleanup_policy,
                                  tier=tier, local_retention_ms=local_retention_ms,
                                  delete_retention_ms=delete_retention_ms,
                                  min_compaction_lag_ms=min_compaction_lag_ms)
        resp = self.call("CreateTopic", rmq_pb2.CreateTopicRequest(config=cfg), group=META_GROUP)
        return self._note_placement(topic_config(resp.config))

    def alter_topic(self, name: str, retention_ms: int | None = None, retention_bytes: int | None = None,
                    tier: str | None = None, local_retention_ms: int | None = None,
                    queues: int | None = None, delete_retention_ms: int | None = None,
                    min_compaction_lag_ms: int | None = None, compacted_table: str | None = None) -> dict:
        """Change retention, tiering or compaction settings of an existing topic, or
        grow its queue count (None leaves a field as is). ``tier`` (``delta:PATH`` or
        ``parquet:PATH``) is a delete topic's archive; ``compacted_table``
        (``delta:PATH``) a compact topic's table. ``queues`` may only grow; the new queues start
        empty at offset 0 and existing queues keep their data and raft group."""
        req = rmq_pb2.AlterTopicRequest(name=name)
        for field, value in (("retention_ms", retention_ms), ("retention_bytes", retention_bytes),
                             ("tier", tier), ("local_retention_ms", local_retention_ms),
                             ("queues", queues), ("delete_retention_ms", delete_retention_ms),
                             ("min_compaction_lag_ms", min_compaction_lag_ms),
                             ("compacted_table", compacted_table)):
            if value is not None:
                setattr(req, field, value)
        return self._note_placement(topic_config(self.call("AlterTopic", req, group=META_GROUP).config))

    def delete_topic(self, name: str) -> None:
        self.call("DeleteTopic", rmq_pb2.DeleteTopicRequest(name=name), group=META_GROUP)
        self._placement.pop(name, None)

    def list_topics(self) -> list[dict]:
        return [topic_config(t) for t in self.call("ListTopics", rmq_pb2.ListTopicsRequest(),
                                                      group=META_GROUP).topics]

    def describe_topic(self, name: str) -> dict:
        # The metadata leader has applied every topic change it acknowledged.
        resp = self.call("DescribeTopic", rmq_pb2.DescribeTopicRequest(name=name), group=META_GROUP)
        d = self._note_placement(topic_config(resp.config))
        d["queue_info"] = [dict(queue=q.queue, group=q.group, earliest=q.earliest, latest=q.latest,
                                size_bytes=q.size_bytes, archived=q.protected_offset, leader=q.leader,
                                archive_earliest=q.archive_earliest, compacted=q.compacted)
                           for q in resp.queues]
        d["tier_job"], d["tier_job_expires_ms"] = resp.tier_job, resp.tier_job_expires_ms
        return d

    # ------------------------------------------------------------- offsets
    def offsets(self, topic: str) -> list[QueueOffsets]:
        """Earliest/latest per queue, each answered by its group's leader (read-your-writes)."""
        queues = self.call("Offsets", rmq_pb2.OffsetsRequest(topic=topic)).queues
        out: dict[int, QueueOffsets] = {}
        for g in sorted({self.group_of(topic, q.queue) for q in queues}):
            resp = self.call("Offsets", rmq_pb2.OffsetsRequest(topic=topic, group=g), group=g)
            out.update({q.queue: QueueOffsets(q.queue, q.earliest, q.latest) for q in resp.queues})
        return [out[q] for q in sorted(out)]

    def offset_for_timestamp(self, topic: str, queue: int, timestamp_ms: int) -> int:
        req = rmq_pb2.OffsetForTimestampRequest(topic=topic, queue=queue, timestamp=timestamp_ms)
        return self.call("OffsetForTimestamp", req, group=self.group_of(topic, queue)).offset

    def commit_offsets(self, consumer_group: str, topic: str, offsets: dict[int, int]) -> None:
        req = rmq_pb2.CommitOffsetsRequest(consumer_group=consumer_group, topic=topic, offsets=offsets)
        self.call("CommitOffsets", req, group=META_GROUP)

    def committed_offsets(self, consumer_group: str, topic: str) -> dict[int, int]:
        req = rmq_pb2.GetCommittedOffsetsRequest(consumer_group=consumer_group, topic=topic)
        return dict(self.call("GetCommittedOffsets", req, group=META_GROUP).offsets)

    def consumer_groups(self, topic: str) -> list[str]:
        return list(self.call("ListConsumerGroups", rmq_pb2.ListConsumerGroupsRequest(topic=topic)).groups)

    def set_watermark(self, topic: str, kind: str, offsets: dict[int, int], lease_token: int = 0) -> None:
        """Move a watermark forward. ``archive`` and ``archive_earliest`` (retention deletes hot
        data below ``archive``) move only with the token of the topic's current tier lease."""
        req = rmq_pb2.SetWatermarkRequest(topic=topic, kind=kind, offsets=offsets, lease_token=lease_token)
        self.call("SetWatermark", req, group=META_GROUP)

    def lease(self, topic: str, kind: str, owner: str, ttl_ms: int) -> tuple[bool, str, int, int]:
        """Take or renew ``owner``'s lease on (topic, kind) for ``ttl_ms`` (0 releases it).

        Returns (granted, holder, expires_ms, token): granted is False while another
        owner's lease runs, and then holder/expires_ms name it. ``token`` is the
        holder's fencing token: it stays while one owner renews, and a new owner
        gets a new one; watermark moves carry it. Retrying is safe.
        """
        r = self.call("Lease", rmq_pb2.LeaseRequest(topic=topic, kind=kind, owner=owner, ttl_ms=ttl_ms),
                      group=META_GROUP)
        return r.granted, r.holder, r.expires_ms, r.token

    # -------------------------------------------------------------- status
    def cluster_status(self, address: str | None = None) -> dict:
        """Every node's status (as the answering node reached them) and the data groups'
        placement as its metadata replica records it; ``address`` pins the node asked."""
        resp = self.call("ClusterStatus", rmq_pb2.ClusterStatusRequest(), address=address,
                         group=None if address else META_GROUP)
        nodes = []
        racks = {m.address: m.rack for m in resp.members}     # a node that did not answer: as recorded
        for n in resp.nodes:
            nodes.append(dict(address=n.address, node_id=n.node_id, pid=n.pid, reachable=n.reachable,
                              open_files=n.open_files, parked_fetches=n.parked_fetches, http=n.http,
                              rack=n.rack or racks.get(n.address, ""),
                              groups=[dict(group=g.group, leader=g.leader, commit_index=g.commit_index,
                                           applied_index=g.applied_index, term=g.term,
                                           raft_log_entries=g.raft_log_entries, queues=g.queues,
                                           bytes=g.bytes, replicas=list(g.replicas)) for g in n.groups]))
        return {"groups": resp.groups, "nodes": nodes,
                "placement": {p.group: list(p.replicas) for p in resp.placement},
                "members": [dict(address=m.address, node_id=m.node_id, state=m.state, since_ms=m.since_ms,
                                 rack=m.rack) for m in resp.members],
                "controller": resp.controller, "rebalance_asked": resp.rebalance_asked,
                "rebalance_done": resp.rebalance_done}

    def cluster_command(self, action: str, node: str = "", group: int = 0, to: str = "",
                        ignore_racks: bool = False) -> str:
        """``rebalance``; ``decommission`` ``node`` (its address as cluster status shows
        it); ``move`` ``node``'s replica of data group ``group`` to node ``to``: recorded
        by the metadata leader, carried out by its controller."""
        req = rmq_pb2.ClusterCommandRequest(action=action, node=node, group=group, to=to,
                                            ignore_racks=ignore_racks)
        return self.call("ClusterCommand", req, group=META_GROUP).message

    def health(self, address: str | None = None, timeout: float = 5.0) -> dict:
        r = self.call("Health", rmq_pb2.HealthRequest(), address=address, timeout=timeout)
        return dict(serving=r.serving, groups_with_leader=r.groups_with_leader, groups_total=r.groups_total)
