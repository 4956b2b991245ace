"""A node's upkeep of its replicas: retention and compaction passes (a mixin of
``StorageNode``; the leader of a group proposes truncations and drops, every
replica compacts its own copy)."""
from __future__ import annotations

import logging

from ..log.compaction import CompactionPolicy, cleanable_end, compact_queue
from ..log.retention import SegmentInfo, retention_cutoff
from ..protocol import records
from ..statemachine.commands import Drop, Truncate
from ..statemachine.data import parse_queue_dir
from ..statemachine.kv import KV_CONFLICT

__all__ = ["Upkeep", "expire_keys"]

log = logging.getLogger(__name__)


class Upkeep:
    def _background(self) -> None:
        while not self._stopping.wait(self.config.retention_interval):
            try:
                self.enforce_retention()
            except Exception:
                log.exception("retention pass failed")
            if self.disk.low():             # compaction writes new files before it frees any
                self.hand_over_when_full()
                continue
            try:
                self.compact_queues()
            except Exception:
                log.exception("compaction pass failed")
            try:
                expire_keys(self)            # TTLs run out: committed deletes (expire_keys, below)
            except Exception:
                log.exception("key expiry pass failed")

    def hand_over_when_full(self) -> int:
        """Below the disk reserve: hand each data group this node leads to the voter
        furthest along (one with room takes entries; a full one does not, and the
        hand-over waits for the target to have everything, so it fails and the next
        pass tries again). Returns the groups handed over."""
        moved = 0
        for g, raft in list(self.groups.items()):
            if not g or not raft.is_leader:
                continue
            match = dict(raft.match_index)
            voters = [n for n in raft.peers if n in match]
            if not voters:
                continue
            target = max(voters, key=lambda n: match[n])
            address = target.address if hasattr(target, "address") else str(target)
            if raft.transfer_to(address, timeout=2.0):
                moved += 1
                log.warning("group %d: leadership handed to %s (%s)", g, address,
                            self.disk.describe(self.config.address))
        return moved

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """On groups this node leads: propose prefix truncation and queue drops."""
        now_ms = now_ms or self.now_ms()
        proposed = 0
        live = _live_topics(self.meta)
        for g, st in self.states.items():
            raft = self.groups[g]
            if not raft.is_leader:
                continue
            for name, ql in list(st.queues.items()):
                cut_at = name.rindex("~") + 1
                cfg = live.get(name[:cut_at])
                if cfg is None:
                    if self.meta.is_deleted(parse_queue_dir(name)[1]):
                        self._commit(raft, Drop(name).encode())
                        proposed += 1
                    continue
                if len(ql.segments) < 2:
                    continue            # the active segment is never cut (retention.py)
                cut = self._cutoff(cfg, int(name[cut_at:]), ql, now_ms)
                if cut > ql.earliest:
                    self._commit(raft, Truncate(name, cut).encode())
                    proposed += 1
        return proposed

    def compact_queues(self, now_ms: int | None = None) -> int:
        """On every replica: drop superseded records of ``compact`` topics (see compaction.py).

        A queue is looked at again only when its cleanable end moved or a
        kept tombstone's delete-retention ran out. Returns records dropped.
        """
        now_ms = now_ms or self.now_ms()
        dropped = 0
        compact = {prefix: cfg for prefix, cfg in _live_topics(self.meta).items()
                   if cfg["cleanup_policy"] == "compact"}
        if not compact:
            return 0
        marks: dict[str, dict[int, int]] = {}      # a topic's watermarks, copied once a pass
        for st in self.states.values():
            for name, ql in list(st.queues.items()):
                cut_at = name.rindex("~") + 1
                cfg = compact.get(name[:cut_at])
                if cfg is None:
                    continue
                topic, q = cfg["name"], int(name[cut_at:])
                if topic not in marks:
                    marks[topic] = self.meta.watermark(topic, "compaction")
                policy = CompactionPolicy(marks[topic].get(q, 0), now_ms,
                                          cfg["delete_retention_ms"], cfg["min_compaction_lag_ms"])
                end = cleanable_end(ql, policy)
                settings = (end, policy.delete_retention_ms)
                last = self._compacted.get(name)
                if last is not None and last[0] == settings and not (
                        last[1].next_tombstone_expiry_ms and last[1].next_tombstone_expiry_ms <= now_ms):
                    continue
                res = compact_queue(ql, policy, end)
                self._compacted[name] = (settings, res)
                # (the key index is left as it is: compaction keeps every key's latest
                # record and its tombstone, so no decision changes; history skips the
                # revisions that went)
                dropped += res.records_dropped
        return dropped

    def _cutoff(self, cfg: dict, q: int, ql, now_ms: int) -> int:
        if cfg["cleanup_policy"] == "compact":
            return ql.earliest      # kept by key, not by age or size (Kafka's cleanup.policy=compact)
        with ql.lock:
            segs = [SegmentInfo(s.base, s.next_offset, s.size, s.last_ts) for s in ql.segments]
        tiered = bool(cfg.get("tier"))
        protected = self.meta.watermark(cfg["name"], "archive").get(q, 0) if tiered else None
        time_ms = (cfg.get("local_retention_ms") or cfg["retention_ms"]) if tiered else cfg["retention_ms"]
        return retention_cutoff(segs, now_ms, time_ms, cfg["retention_bytes"], protected)


def _live_topics(meta) -> dict[str, dict]:
    """Each topic's config by the prefix of its queues' directory names (``TOPIC~INCARNATION~``),
    read once a pass: a pass visits every queue of the node (100,000 and more), and a
    queue of a deleted or recreated topic matches none."""
    return {f"{cfg['name']}~{cfg['incarnation']}~": cfg for cfg in meta.list_topics()}


def expire_keys(node, limit: int = 1000) -> int:
    """On the data groups this node leads: commit a delete of every key whose TTL ran
    out, conditioned on the revision that expired (a newer put stays). Returns how
    many were deleted."""
    now, deleted = node.now_ms(), 0
    for g, st in list(node.states.items()):
        raft, store = node.groups.get(g), st.kv_if_open
        if store is None or raft is None or not raft.is_leader:
            continue
        for name, key, rev in store.index.expired(now, limit):
            topic, inc, queue = parse_queue_dir(name)
            cfg = node.meta.topic(topic)
            if cfg is None or cfg["incarnation"] != inc:
                continue
            block = records.encode([None], [key])
            g2, fut = node.submit_produce(cfg, queue, block, 1, "", 0, condition=("expired", rev))
            if node.wait_produce(g2, fut)[0] != KV_CONFLICT:
                deleted += 1
    return deleted
