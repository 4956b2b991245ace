"""The replicated state machine of the metadata raft group (no network here).

Holds topic configs, consumer-group offsets, per-queue watermarks (archive
and compaction) and job leases. It is small, so its snapshot is the whole state as JSON.
Apply never raises: a rejected command returns ``("error", code, message)``
so every replica reaches the same verdict.
"""
from __future__ import annotations

import json
import threading
import uuid

from ..protocol.placement import assign_groups, group_of
from .commands import (AlterTopic, ChangeAcls, CommitOffsets, CreateTopic, DeleteTopic, Lease, RequestRebalance,
                       SetNode, SetPlacement, SetRack, SetPrincipal, SetReplicas, SetWatermark, UnknownCommand,
                       decode_command)
from .security import SecurityState

__all__ = ["FENCED_WATERMARKS", "MetaState", "NODE_STATES", "TOPIC_DEFAULTS", "normalized", "queue_growth_error"]

# A node's states in the cluster's record: taking replicas; being emptied by
# ``rmq cluster decommission`` (no new replicas, its replicas move away); out
# of the cluster (it holds nothing and may be stopped).
NODE_STATES = ("active", "leaving", "removed")
MAX_RACK_CHARS = 64

# Watermarks only the topic's job of a kind moves, under its lease (watermark kind ->
# lease kind): retention deletes hot data below ``archive``; compaction drops values
# below ``compaction`` that a newer one of the key replaces.
FENCED_WATERMARKS = {"archive": "tier", "archive_earliest": "tier", "compaction": "compact"}

TOPIC_DEFAULTS = {
    "queues": 4, "retention_ms": 7 * 86400_000, "retention_bytes": 0,
    "cleanup_policy": "delete", "tier": "", "local_retention_ms": 0,
    "delete_retention_ms": 86400_000, "min_compaction_lag_ms": 0, "compacted_table": "",
}


def normalized(cfg: dict) -> dict:
    """A topic config with every setting, in this version's fields.

    Wave 1 kept a compact topic's table in ``tier`` (``rmq compact`` wrote it
    there); it is ``compacted_table`` now, and ``tier`` is for delete topics
    only. Applied to configs from snapshots and to every create and alter,
    so each replica (and a replay of an old journal) converts alike.
    """
    full = {**TOPIC_DEFAULTS, **cfg}
    if full["cleanup_policy"] == "compact" and full["tier"]:
        full["compacted_table"] = full["compacted_table"] or full["tier"]
        full["tier"] = ""
    return full


def queue_growth_error(name: str, have: int, want: int) -> str:
    return (f"queues={want}: topic {name!r} has {have} queues and a queue count can only grow "
            f"(give more than {have})")


class MetaState:
    def __init__(self, groups: int = 0):
        """``groups``: the cluster's data groups, to which new queues are assigned
        (``placement.assign_groups``); 0 records no placement (hash placement)."""
        self.groups = groups
        self.topics: dict[str, dict] = {}
        self.offsets: dict[str, dict[str, dict[str, int]]] = {}      # group -> topic -> {q: off}
        self.watermarks: dict[str, dict[str, dict[str, int]]] = {}   # topic -> kind -> {q: off}
        self.deleted: dict[str, str] = {}   # incarnation -> topic name, for queue cleanup
        # topic -> kind -> [owner, expires_ms, token]; the token is the raft index of the
        # entry that gave the lease to its owner: it changes whenever the holder does
        self.leases: dict[str, dict[str, list]] = {}
        # The placement role (RIP-20's nameserver): the cluster's nodes (gRPC
        # address -> {"state": ...}) and each data group's replicas.
        self.nodes: dict[str, dict] = {}
        self.replicas: dict[int, list[str]] = {}
        self.rebalance = 0      # raft index of the last rebalance asked for (0: none)
        self.rebalanced = 0     # ... and of the last one the controller finished
        # Data groups added as the cluster grew -> their founding replicas (the
        # configuration at index 0 of the group's log, raft/membership.py).
        self.founding: dict[int, list[str]] = {}
        self.density = 0.0      # data replicas per node at the cluster's first start
        self.security = SecurityState()     # principals and ACLs (statemachine/security.py)
        self.lock = threading.Lock()

    def apply(self, raft_index: int, raw: tuple):
        """Apply one committed entry (the replicated tuple); returns ("ok", value) or
        ("error", status code name, message)."""
        try:
            cmd = decode_command(raw)
        except UnknownCommand as e:
            return ("error", "INVALID_ARGUMENT", str(e))
        handler = self._HANDLERS.get(type(cmd))
        if handler is None:
            return ("error", "INVALID_ARGUMENT", f"command {cmd.KIND!r} is not for the metadata group")
        with self.lock:
            return handler(self, raft_index, cmd)

    def _create_topic(self, raft_index: int, cmd: CreateTopic):
        cfg, created_ms = cmd.config, cmd.created_ms
        name = cfg["name"]
        if name in self.topics:
            return ("error", "ALREADY_EXISTS", f"topic {name!r} already exists")
        full = normalized(cfg)
        # Derived from the raft index so every replica computes the same id.
        full["incarnation"] = uuid.uuid5(uuid.NAMESPACE_OID, f"{name}@{raft_index}").hex[:12]
        full["created_ms"] = created_ms
        if self.groups:
            full["queue_groups"] = assign_groups(self._queues_per_group(), self.data_groups(), full["queues"])
        self.topics[name] = full
        return ("ok", full)

    def _queues_per_group(self) -> dict[int, int]:
        """group -> queues it holds, of every topic (recorded or hash placement)."""
        load: dict[int, int] = {}
        for name, cfg in self.topics.items():
            assigned = cfg.get("queue_groups") or ()
            for q in range(cfg["queues"]):
                g = group_of(name, q, self.groups, assigned)
                load[g] = load.get(g, 0) + 1
        return load

    def _alter_topic(self, raft_index: int, cmd: AlterTopic):
        name, changes = cmd.name, cmd.changes
        if name not in self.topics:
            return ("error", "NOT_FOUND", f"topic {name!r} does not exist")
        have, want = self.topics[name]["queues"], changes.get("queues")
        if want is not None and want <= have:
            # Checked here too: two concurrent alters may both pass the servicer.
            return ("error", "INVALID_ARGUMENT", queue_growth_error(name, have, want))
        cfg = {**self.topics[name], **changes}
        if want is not None and cfg.get("queue_groups"):
            # New queues of a topic with recorded placement go to the least loaded groups.
            cfg["queue_groups"] = cfg["queue_groups"] + assign_groups(
                self._queues_per_group(), self.data_groups() or max(cfg["queue_groups"]), want - have)
        if cfg["cleanup_policy"] == "compact" and "tier" in changes:
            # Wave 1 kept a compact topic's table in tier: an alter of it (replayed
            # from an old journal) sets the table, last one wins, as in a snapshot.
            cfg["compacted_table"] = changes["tier"]
        self.topics[name] = normalized(cfg)
        return ("ok", self.topics[name])

    def _delete_topic(self, raft_index: int, cmd: DeleteTopic):
        name = cmd.name
        cfg = self.topics.pop(name, None)
        if cfg is None:
            return ("error", "NOT_FOUND", f"topic {name!r} does not exist")
        self.watermarks.pop(name, None)
        self.leases.pop(name, None)
        self.deleted[cfg["incarnation"]] = name
        for topics in self.offsets.values():
            topics.pop(name, None)
        return ("ok", cfg)

    def _missing(self, topic: str) -> tuple | None:
        return None if topic in self.topics else ("error", "NOT_FOUND", f"topic {topic!r} does not exist")

    def _commit_offsets(self, raft_index: int, cmd: CommitOffsets):
        if missing := self._missing(cmd.topic):
            return missing
        cur = self.offsets.setdefault(cmd.consumer_group, {}).setdefault(cmd.topic, {})
        cur.update({str(q): int(o) for q, o in cmd.offsets.items()})
        return ("ok", None)

    def _set_watermark(self, raft_index: int, cmd: SetWatermark):
        if missing := self._missing(cmd.topic):
            return missing
        if cmd.kind in FENCED_WATERMARKS and cmd.lease_token is not None:
            lease = FENCED_WATERMARKS[cmd.kind]
            cur = self.leases.get(cmd.topic, {}).get(lease)
            if cur is None or len(cur) < 3 or cur[2] != cmd.lease_token:
                held = f"the current one is token {cur[2]}, held by {cur[0]}" if cur and len(cur) > 2 \
                    else f"the topic has no {lease} lease now"
                return ("error", "FAILED_PRECONDITION",
                        f"watermark {cmd.kind} of topic {cmd.topic!r}: lease token {cmd.lease_token} is not "
                        f"the topic's {lease} lease ({held}): only the job holding it moves this "
                        "watermark")
        cur = self.watermarks.setdefault(cmd.topic, {}).setdefault(cmd.kind, {})
        for q, o in cmd.offsets.items():   # watermarks only move forward
            cur[str(q)] = max(int(o), cur.get(str(q), -1))
        return ("ok", None)

    def _lease(self, raft_index: int, cmd: Lease):
        """Take, renew (ttl_ms > 0) or release (0) ``owner``'s lease; ("ok", (granted,
        holder, expires_ms, token)). A lease held by another owner is taken only once it
        lapsed; the token stays with one owner (renewed, lapsed or released) and changes
        with a new owner."""
        if missing := self._missing(cmd.topic):
            return missing
        topic, kind, owner, ttl_ms, now_ms = cmd.topic, cmd.kind, cmd.owner, cmd.ttl_ms, cmd.now_ms
        leases = self.leases.setdefault(topic, {})
        cur = leases.get(kind)
        free = cur is None or cur[0] == owner or cur[1] <= now_ms
        if not free:
            return ("ok", (False, cur[0], cur[1], cur[2] if len(cur) > 2 else 0))
        if ttl_ms == 0:
            # Released, but the token stays with its owner until another owner takes
            # the lease: a job restarted on the same checkpoint keeps its token (its
            # Delta fence, rmq_spark/tiering/_fence.py, is then still the newest).
            if cur is not None and len(cur) > 2:
                leases[kind] = [cur[0], 0, cur[2]]
            return ("ok", (True, "", 0, 0))
        token = cur[2] if cur is not None and cur[0] == owner and len(cur) > 2 else raft_index
        leases[kind] = [owner, now_ms + ttl_ms, token]
        return ("ok", (True, owner, now_ms + ttl_ms, token))

    def _set_placement(self, raft_index: int, cmd: SetPlacement):
        if cmd.init and self.replicas:
            return ("ok", False)         # recorded already: the first one stands
        for address in cmd.nodes:
            self._node_record(address)
        self.replicas = {int(g): list(r) for g, r in cmd.replicas.items()}
        if cmd.nodes:
            self.density = sum(len(r) for r in self.replicas.values()) / len(cmd.nodes)
        return ("ok", True)

    def data_groups(self) -> int:
        """How many data groups there are (1..N): recorded, else the founding count."""
        return max(self.replicas, default=0) or self.groups

    def _node_record(self, address: str) -> dict:
        rec = self.nodes.get(address)
        if rec is None:
            rec = self.nodes[address] = {"state": "active", "id": 1 + max(
                (n.get("id", -1) for n in self.nodes.values()), default=-1)}
        return rec

    def _set_replicas(self, raft_index: int, cmd: SetReplicas):
        cur = self.replicas.get(cmd.group)
        if cur is None and cmd.group != 1 + max(self.replicas, default=0):
            return ("error", "NOT_FOUND", f"group {cmd.group} does not exist (groups are 1..{len(self.replicas)})")
        if cur is not None and list(cmd.expect) != cur:
            return ("error", "ABORTED", f"group {cmd.group}: replicas are {cur}, not {list(cmd.expect)} "
                                        "(changed meanwhile)")
        if len(set(cmd.replicas)) != len(cmd.replicas) or not cmd.replicas:
            return ("error", "INVALID_ARGUMENT", f"group {cmd.group}: replicas {list(cmd.replicas)} must be "
                                                 "distinct nodes, at least one")
        if cur is None:                   # a new group: its replicas found it
            self.founding[cmd.group] = list(cmd.replicas)
        self.replicas[cmd.group] = list(cmd.replicas)
        return ("ok", list(cmd.replicas))

    def _set_node(self, raft_index: int, cmd: SetNode):
        if cmd.state not in NODE_STATES:
            return ("error", "INVALID_ARGUMENT", f"node state {cmd.state!r}: allowed {', '.join(NODE_STATES)}")
        if cmd.address not in self.nodes and cmd.state != "active":
            return ("error", "NOT_FOUND", f"node {cmd.address} is not in the cluster "
                                          f"(nodes: {', '.join(sorted(self.nodes)) or 'none'})")
        rec = self._node_record(cmd.address)
        rec["state"] = cmd.state
        rec["since_ms"] = cmd.now_ms
        rec["index"] = raft_index
        return ("ok", dict(rec))

    def _set_rack(self, raft_index: int, cmd: SetRack):
        if cmd.address not in self.nodes:
            return ("error", "NOT_FOUND", f"node {cmd.address} is not in the cluster "
                                          f"(nodes: {', '.join(sorted(self.nodes)) or 'none'})")
        if len(cmd.rack) > MAX_RACK_CHARS:
            return ("error", "INVALID_ARGUMENT", f"rack name of {len(cmd.rack)} characters: "
                                                 f"at most {MAX_RACK_CHARS}")
        self.nodes[cmd.address]["rack"] = cmd.rack
        return ("ok", cmd.rack)

    def _request_rebalance(self, raft_index: int, cmd: RequestRebalance):
        if cmd.done:
            self.rebalanced = max(self.rebalanced, cmd.done)
            return ("ok", cmd.done)
        self.rebalance = raft_index
        return ("ok", raft_index)

    _HANDLERS = {CreateTopic: _create_topic, AlterTopic: _alter_topic, DeleteTopic: _delete_topic,
                 CommitOffsets: _commit_offsets, SetWatermark: _set_watermark, Lease: _lease,
                 SetPlacement: _set_placement, SetReplicas: _set_replicas, SetNode: _set_node, SetRack: _set_rack,
                 RequestRebalance: _request_rebalance,
                 SetPrincipal: lambda self, i, cmd: self.security.set_principal(i, cmd),
                 ChangeAcls: lambda self, i, cmd: self.security.change_acls(i, cmd)}

    # ---------------------------------------------------------------- queries
    def list_topics(self) -> list[dict]:
        """Every topic's config, by name."""
        with self.lock:
            return [dict(t) for _, t in sorted(self.topics.items())]

    def topic(self, name: str) -> dict | None:
        with self.lock:
            t = self.topics.get(name)
            return dict(t) if t else None

    def committed(self, group: str, topic: str) -> dict[int, int]:
        with self.lock:
            return {int(q): o for q, o in self.offsets.get(group, {}).get(topic, {}).items()}

    def groups_for(self, topic: str) -> list[str]:
        with self.lock:
            return sorted(g for g, t in self.offsets.items() if topic in t)

    def is_deleted(self, incarnation: str) -> bool:
        with self.lock:
            return incarnation in self.deleted

    def watermark(self, topic: str, kind: str) -> dict[int, int]:
        with self.lock:
            return {int(q): o for q, o in self.watermarks.get(topic, {}).get(kind, {}).items()}

    def total_queues(self) -> int:
        with self.lock:
            return sum(t["queues"] for t in self.topics.values())

    def placement(self) -> tuple[dict[str, dict], dict[int, list[str]]]:
        """(nodes, data group -> replicas) as recorded; empty before the first record."""
        with self.lock:
            return ({a: dict(v) for a, v in self.nodes.items()},
                    {g: list(r) for g, r in self.replicas.items()})

    def node_state(self, address: str) -> str:
        """A node's recorded state ("" if it is not recorded)."""
        with self.lock:
            return self.nodes.get(address, {}).get("state", "")

    def founding_replicas(self, group: int) -> list[str]:
        """The replicas a data group added as the cluster grew started with ([] otherwise)."""
        with self.lock:
            return list(self.founding.get(group, ()))

    def replicas_of(self, group: int) -> list[str]:
        with self.lock:
            return list(self.replicas.get(group, ()))

    def lease(self, topic: str, kind: str, now_ms: int) -> tuple[str, int]:
        """(owner, expires_ms) of a lease still running at ``now_ms``, else ("", 0)."""
        with self.lock:
            cur = self.leases.get(topic, {}).get(kind)
            return (cur[0], cur[1]) if cur and cur[1] > now_ms else ("", 0)

    # --------------------------------------------------------------- snapshot
    def snapshot(self) -> bytes:
        with self.lock:
            return json.dumps({"topics": self.topics, "offsets": self.offsets,
                               "watermarks": self.watermarks, "deleted": self.deleted,
                               "leases": self.leases, "nodes": self.nodes,
                               "replicas": {str(g): r for g, r in self.replicas.items()},
                               "rebalance": self.rebalance, "rebalanced": self.rebalanced,
                               "founding": {str(g): r for g, r in self.founding.items()},
                               "density": self.density, "security": self.security.to_json()}).encode()

    def restore(self, data: bytes, index: int, leader: str | None, own: bool = False) -> None:
        d = json.loads(data)
        with self.lock:
            # Defaults first: a topic snapshotted before a setting existed gets its default.
            self.topics = {n: normalized(t) for n, t in d["topics"].items()}
            self.offsets, self.watermarks = d["offsets"], d["watermarks"]
            self.deleted = d.get("deleted", {})
            self.leases = d.get("leases", {})
            self.nodes = d.get("nodes", {})
            self.replicas = {int(g): r for g, r in d.get("replicas", {}).items()}
            self.rebalance = d.get("rebalance", 0)
            self.rebalanced = d.get("rebalanced", 0)
            self.founding = {int(g): r for g, r in d.get("founding", {}).items()}
            self.density = d.get("density", 0.0)
            self.security.load(d.get("security"))

    def close(self) -> None:
        pass
