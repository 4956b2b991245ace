"""What the status page shows (``GET /v1/status``): nodes, raft groups and their
leaders, topics with their lag, and the tiering and compaction jobs running.

Computed by the node asked, from its metadata replica (a follower's is a
moment behind the leader's: fine for a page that refreshes itself) and each
group's offsets (its own replica's, or the leader's, asked over gRPC; a group
that does not answer is asked once per view and shown as unreachable). At most
``MAX_TOPICS`` topics, by name; ``topics_total`` says how many there are. A
view is reused for ``FRESH_SECONDS`` (every open page asks every 2 s). On a
node with ACLs a caller sees the topics and consumer groups it may describe.
"""
from __future__ import annotations

import threading
import time

import grpc

from ..proto import rmq_pb2
from ..protocol.placement import META_GROUP
from ..server.dispatch import SyncContext
from ..protocol.errors import ServiceError

__all__ = ["cluster_view", "MAX_TOPICS"]

MAX_TOPICS = 100
FRESH_SECONDS = 1.0
JOBS = (("tier", "tiering"), ("compact", "compaction"))
_cache: dict[int, tuple[float, dict]] = {}     # id(node) -> (when, view)
_cache_lock = threading.Lock()


def cluster_view(may, service, node) -> dict:
    """The status view as a caller that ``may(resource type, name)`` describe sees it."""
    with _cache_lock:                  # one computation at a time, shared by the pages open
        when, view = _cache.get(id(node), (0.0, None))
        if view is None or time.monotonic() - when > FRESH_SECONDS:
            view = _view(service, node)
            _cache[id(node)] = (time.monotonic(), view)
    topics = [dict(t, consumer_groups={g: n for g, n in t["consumer_groups"].items() if may("group", g)})
              for t in view["topics"] if may("topic", t["name"])]
    out = {k: v for k, v in view.items() if k != "all_topics"}
    out.update(topics=topics, topics_total=sum(1 for name in view["all_topics"] if may("topic", name)),
               jobs=[j for j in view["jobs"] if may("topic", j["topic"])])
    return out


def _view(service, node) -> dict:
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
    unreachable: set[int] = set()
    return {"node": node.config.address, "time_ms": int(time.time() * 1000), "nodes": nodes,
            "groups": [groups[g] for g in sorted(groups)], "all_topics": [t["name"] for t in topics],
            "topics": [_topic(node, cfg, unreachable) for cfg in topics[:MAX_TOPICS]],
            "jobs": [{"kind": kind, "topic": cfg["name"], "holder": holder, "expires_ms": expires}
                     for cfg in topics for lease, kind in JOBS
                     for holder, expires in [node.meta.lease(cfg["name"], lease, now_ms)] if holder]}


def _group(g: int, replicas: list[str]) -> dict:
    return {"group": g, "role": "metadata" if g == META_GROUP else "data", "replicas": replicas,
            "leader": "", "term": 0, "commit_index": 0}


def _topic(node, cfg: dict, unreachable: set[int]) -> dict:
    name, meta = cfg["name"], node.meta
    stats, unknown = {}, []
    for g in sorted({node.group_of(name, q, cfg) for q in range(cfg["queues"])}):
        if g in unreachable:
            unknown.append(g)
            continue
        try:
            stats.update(node.group_offsets(cfg, g)[0])
        except (ServiceError, grpc.RpcError):      # no leader right now: shown as unknown
            unknown.append(g)
            unreachable.add(g)
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
