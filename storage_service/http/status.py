"""What the status page shows (``GET /v1/status``): nodes, raft groups and their
leaders, topics with their lag, and the tiering and compaction jobs running.

Computed by the node asked, from its metadata replica (a follower's is a
moment behind the leader's: fine for a page that refreshes itself) and each
group's offsets (its own replica's, or the leader's, asked over gRPC). At most
``MAX_TOPICS`` topics, by name; ``topics_total`` says how many there are.
"""
from __future__ import annotations

import time

import grpc

from ..proto import rmq_pb2
from ..protocol.placement import META_GROUP
from ..server.dispatch import SyncContext
from ..server.errors import ServiceError

__all__ = ["cluster_view", "MAX_TOPICS"]

MAX_TOPICS = 100
JOBS = (("tier", "tiering"), ("compact", "compaction"))


def cluster_view(service, node) -> dict:
    st = service.ClusterStatus.__wrapped__(service, rmq_pb2.ClusterStatusRequest(), SyncContext())
    members = {m.address: m.state for m in st.members}
    nodes, groups = [], {}
    for p in st.placement:
        groups[p.group] = _group(p.group, list(p.replicas))
    for n in st.nodes:
        leads = sorted(g.group for g in n.groups if g.leader and g.leader == n.address)
        nodes.append({"address": n.address, "node_id": n.node_id, "http": n.http, "reachable": n.reachable,
                      "membership": members.get(n.address, "active"), "leads": leads,
                      "groups": sorted(g.group for g in n.groups), "queues": sum(g.queues for g in n.groups),
                      "bytes": sum(g.bytes for g in n.groups), "open_files": n.open_files,
                      "parked_fetches": n.parked_fetches})
        for g in n.groups:
            view = groups.setdefault(g.group, _group(g.group, list(g.replicas)))
            if g.leader == n.address:
                view.update(leader=n.address, term=g.term, commit_index=g.commit_index)
    topics = node.meta.list_topics()
    now_ms = node.now_ms()
    return {"node": node.config.address, "time_ms": int(time.time() * 1000), "nodes": nodes,
            "groups": [groups[g] for g in sorted(groups)], "topics_total": len(topics),
            "topics": [_topic(node, cfg, now_ms) for cfg in topics[:MAX_TOPICS]],
            "jobs": [{"kind": kind, "topic": cfg["name"], "holder": holder, "expires_ms": expires}
                     for cfg in topics for lease, kind in JOBS
                     for holder, expires in [node.meta.lease(cfg["name"], lease, now_ms)] if holder]}


def _group(g: int, replicas: list[str]) -> dict:
    return {"group": g, "role": "metadata" if g == META_GROUP else "data", "replicas": replicas,
            "leader": "", "term": 0, "commit_index": 0}


def _topic(node, cfg: dict, now_ms: int) -> dict:
    name, meta = cfg["name"], node.meta
    stats, unknown = {}, []
    for g in sorted({node.group_of(name, q, cfg) for q in range(cfg["queues"])}):
        try:
            stats.update(node.group_offsets(cfg, g)[0])
        except (ServiceError, grpc.RpcError):      # no leader right now: shown as unknown
            unknown.append(g)
    qs = [(q,) + stats[q] for q in sorted(stats)]
    view = {"name": name, "queues": cfg["queues"], "cleanup_policy": cfg["cleanup_policy"], "tier": cfg["tier"],
            "messages": sum(latest - earliest for _, earliest, latest, _ in qs),
            "latest_offset_sum": sum(latest for _, _, latest, _ in qs),
            "bytes": sum(size for *_, size in qs), "groups_unreachable": unknown, "consumer_groups": {}}
    for cg in meta.groups_for(name):
        c = meta.committed(cg, name)
        view["consumer_groups"][cg] = sum(latest - c.get(q, earliest) for q, earliest, latest, _ in qs)
    for kind, mark, on in (("tiering", "archive", bool(cfg["tier"]) and cfg["cleanup_policy"] != "compact"),
                           ("compaction", "compaction", cfg["cleanup_policy"] == "compact")):
        if on:
            done = meta.watermark(name, mark)
            view[f"{kind}_lag"] = sum(max(0, latest - max(done.get(q, 0), earliest))
                                      for q, earliest, latest, _ in qs)
    return view
