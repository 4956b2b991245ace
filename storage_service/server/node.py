"""A storage node: G data raft groups + the metadata group, and their plumbing.

The node owns the raft groups and the background loops (retention, cleanup of
deleted topics). The gRPC servicer (``service.py``) validates requests and
calls the methods here; nothing outside a raft apply changes replicated state.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Callable

import grpc

from ..log.compaction import CompactionPolicy, cleanable_end, compact_queue
from ..log.dirlock import DirectoryLock
from ..log.handles import OpenFiles, open_files_limit
from ..log.retention import SegmentInfo, retention_cutoff
from ..proto import rmq_pb2, rmq_pb2_grpc
from ..protocol import framing
from ..protocol.placement import GRPC_OPTIONS, META_GROUP, group_of, grpc_address, raft_address
from ..raft.group import RaftGroup, RaftLoop, RaftTiming
from ..raft.groupcommit import CommitFailed, GroupCommitter
from ..statemachine.commands import Drop, MetaCommand, Produce, ProduceItem, SetPlacement, Truncate
from ..statemachine.data import DataState, parse_queue_dir, queue_dir
from ..statemachine.meta import MetaState
from .errors import NotLeader, ServiceError, not_found
from .hosting import hosted_on_disk, initial_layout
from .peers import ask_group, fetch_range

__all__ = ["NodeConfig", "StorageNode"]

log = logging.getLogger(__name__)


# How long a leader read waits for the leader's lease to be confirmed (a new
# leader's first heartbeat round trip) before it answers not-leader.
READ_LEASE_WAIT = 0.3


def _settled(fut: Future, timeout: float) -> bool:
    try:
        fut.exception(timeout)
        return True
    except FutureTimeout:
        return False


@dataclass(frozen=True)
class NodeConfig:
    node_id: int
    addresses: tuple[str, ...]          # gRPC address of every node; index = node id
    groups: int
    data_dir: str
    fsync: str = "always"
    max_message_bytes: int = 4 << 20
    max_batch_bytes: int = 16 << 20
    max_batch_messages: int = 100_000
    segment_bytes: int = 64 << 20
    retention_interval: float = 5.0
    segment_sync_interval: float = 0.25
    commit_timeout: float = 10.0
    max_open_files: int = 0             # segment files held open; 0: half the process's fd limit
    max_queues: int = 200_000           # queues in the cluster
    replication: int = 3                # replicas of each data group (at most one per node)
    timing: RaftTiming = field(default_factory=RaftTiming)

    @property
    def address(self) -> str:
        return self.addresses[self.node_id]


class StorageNode:
    def __init__(self, config: NodeConfig):
        """Raises ``DirectoryInUse`` (and changes nothing) while another process holds ``data_dir``."""
        self.config = config
        self._dir_lock = DirectoryLock(config.data_dir).acquire()
        try:
            self._start()
        except BaseException:
            self._dir_lock.release()
            raise

    def _start(self) -> None:
        config = self.config
        self.started = time.time()
        self.meta = MetaState(config.groups)
        self.groups: dict[int, RaftGroup] = {}
        self.states: dict[int, DataState] = {}
        self.committers: dict[int, GroupCommitter] = {}
        self._channels: dict[str, grpc.Channel] = {}
        self._channels_lock = threading.Lock()
        self.files = OpenFiles(open_files_limit(config.max_open_files))
        self.raft_loop = RaftLoop(config.timing.tick, name=f"raft-node-{config.node_id}",
                                  listen=raft_address(config.address),
                                  connection_timeout=max(3.5, config.timing.max_timeout))
        # The placement this node starts from, until the metadata group's record
        # is applied here (hosting.py): which data groups it hosts and where the others are.
        self.layout = initial_layout(config.addresses, config.groups, config.replication, config.data_dir)
        self.groups[META_GROUP] = self._raft(META_GROUP, self.meta, config.addresses)
        for g in hosted_on_disk(config.data_dir) or [g for g, r in self.layout.items() if config.address in r]:
            self._open_group(g, self.layout.get(g, config.addresses))
        self.raft_loop.start()
        # queue dir -> ((cleanable end, delete retention), CompactionResult) of its last pass
        self._compacted: dict = {}
        self._stopping = threading.Event()   # wakes the background threads at stop
        self._bg = threading.Thread(target=self._background, name="retention", daemon=True)
        self._bg.start()
        self._flusher = threading.Thread(target=self._flush_segments, name="segment-sync", daemon=True)
        self._flusher.start()
        self._placer = threading.Thread(target=self._reconcile, name="placement", daemon=True)
        self._placer.start()

    def _raft(self, g: int, state, members) -> RaftGroup:
        c = self.config
        return RaftGroup(g, raft_address(c.address), [raft_address(a) for a in members],
                         os.path.join(c.data_dir, f"group-{g}"), state, c.fsync, c.timing,
                         loop=self.raft_loop)

    def _open_group(self, g: int, members) -> None:
        """Open (or create, empty, with ``members``) this node's replica of data group ``g``."""
        c = self.config
        st = DataState(os.path.join(c.data_dir, f"group-{g}", "queues"), fsync=c.fsync == "always",
                       segment_bytes=c.segment_bytes, files=self.files)
        st.fetch_range = self.fetch_from_peers
        raft = self._raft(g, st, members)
        # Copies, not updates: other threads iterate these maps while a replica is added.
        self.committers = {**self.committers,
                           g: GroupCommitter(raft, _produce_entry, max_entry_bytes=c.max_batch_bytes * 2)}
        self.states = {**self.states, g: st}
        self.groups = {**self.groups, g: raft}

    # -------------------------------------------------------------- placement
    def replicas_of(self, group: int) -> list[str]:
        """gRPC addresses of the group's replicas: as the metadata group recorded them,
        else as this node started with them."""
        if group == META_GROUP:
            return list(self.config.addresses)
        return self.meta.replicas_of(group) or list(self.layout.get(group, ()))

    def hosted(self, group: int) -> RaftGroup:
        """This node's replica of ``group``; NotLeader naming one that has it if there is none here."""
        raft = self.groups.get(group)
        if raft is None:
            others = self.replicas_of(group)
            raise NotLeader(group, others[0] if others else None,
                            f"node {self.config.address} holds no replica of group {group}")
        return raft

    def _reconcile(self) -> None:
        """Placement, every second: record the starting placement once (on the
        metadata leader), and open replicas the record gives this node that it lacks."""
        while not self._stopping.wait(1.0):
            try:
                self._record_initial_placement()
                for g, replicas in self.meta.placement()[1].items():
                    if self.config.address in replicas and g not in self.groups:
                        log.info("opening a replica of group %d (placement %s)", g, replicas)
                        self.raft_loop.call(lambda g=g, r=replicas: self._open_group(g, r))
            except NotLeader:
                pass
            except Exception:
                log.exception("placement pass failed")

    def _record_initial_placement(self) -> None:
        if self.meta.replicas or not self.groups[META_GROUP].is_leader:
            return
        self.meta_command(SetPlacement(tuple(self.config.addresses), self.layout, init=True))

    # ------------------------------------------------------------ leadership
    def leader_of(self, group: int) -> str | None:
        raft = self.groups.get(group)
        addr = raft.leader_raft_address if raft is not None else None
        return grpc_address(addr) if addr else None

    def require_leader(self, group: int) -> RaftGroup:
        raft = self.hosted(group)
        if not raft.is_leader:
            raise NotLeader(group, self.leader_of(group))
        return raft

    def require_read_leader(self, group: int, wait: float = READ_LEASE_WAIT) -> RaftGroup:
        """The group's raft if this node may answer a read as its leader.

        A leader read is linearizable: it answers only while its lease runs
        (``storage_service/raft/election.py``: no other node can have been
        elected) and once its own term's first entry is applied. A new leader
        gets both within a heartbeat round trip, so the wait is short; a leader
        cut off from its peers answers not-leader once the lease is out.
        """
        raft = self.require_leader(group)
        deadline = time.monotonic() + wait
        while not raft.read_ready():
            if not raft.is_leader:
                raise NotLeader(group, self.leader_of(group))
            if time.monotonic() >= deadline:
                raise NotLeader(group, None, "its leader lease is not confirmed (no majority of the "
                                             "group answered it lately); a read here could be stale")
            time.sleep(0.005)
        return raft

    def check_queue_budget(self, topic: str, adding: int) -> None:
        """RESOURCE_EXHAUSTED, changing nothing, if ``adding`` queues would take the
        cluster past ``max_queues``. Every node holds a replica of every queue, so
        the limit is what one node's memory and files take (README: many queues)."""
        have = self.meta.total_queues()
        if have + adding > self.config.max_queues:
            raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"topic {topic!r}: {adding} more queues would make {have + adding} in the "
                               f"cluster; the limit is {self.config.max_queues} (rmq-storage "
                               "--max-queues); delete topics or raise the limit")

    def group_of(self, topic: str, queue: int, cfg: dict | None = None) -> int:
        """The data group of a queue: recorded in the topic's config (``cfg``, else the
        local metadata replica's), or the hash placement of an older topic."""
        if cfg is None:
            cfg = self.meta.topic(topic) or {}
        return group_of(topic, queue, self.config.groups, cfg.get("queue_groups") or ())

    # ----------------------------------------------------------------- topics
    def topic(self, name: str, wait: float = 1.0, queue: int = -1) -> dict:
        """Topic config from the local metadata replica (waits briefly for a lagging one).

        ``queue`` past the replica's queue count also waits (up to 0.5 s): the
        topic may have just grown and this replica not applied it yet. The
        caller still checks the queue against the config returned.
        """
        deadline = time.monotonic() + wait
        grow_deadline = time.monotonic() + min(wait, 0.5)
        while True:
            cfg = self.meta.topic(name)
            if cfg is not None and (queue < cfg["queues"] or time.monotonic() >= grow_deadline):
                return cfg
            if time.monotonic() >= deadline:
                raise not_found(f"topic {name!r} does not exist")
            time.sleep(0.01)

    def wait_meta_applied_everywhere(self, timeout: float = 2.0) -> bool:
        """Wait until every reachable node applied the metadata entries applied here.

        Best effort (a node that is down catches up when it returns, and
        ``topic(name, queue=...)`` covers a short lag); True if all did.
        """
        target = self.groups[META_GROUP].raftLastApplied
        deadline = time.monotonic() + timeout
        pending = [a for a in self.config.addresses if a != self.config.address]
        while pending and time.monotonic() < deadline:
            still = []
            for addr in pending:
                try:
                    st = self.stub(addr).GetNodeStatus(rmq_pb2.NodeStatusRequest(),
                                                       timeout=max(0.05, deadline - time.monotonic()))
                    meta = next(g for g in st.groups if g.group == META_GROUP)
                    if meta.applied_index < target:
                        still.append(addr)
                except grpc.RpcError:
                    pass       # unreachable: it catches up when it is back
            pending = still
            if pending:
                time.sleep(0.01)
        return not pending

    def queue_log(self, cfg: dict, queue: int, create: bool = False):
        g = self.group_of(cfg["name"], queue, cfg)
        self.hosted(g)
        return g, self.states[g].queue(queue_dir(cfg["name"], cfg["incarnation"], queue), create)

    def group_offsets(self, cfg: dict, g: int) -> tuple[dict[int, tuple[int, int, int]], str]:
        """queue -> (earliest, latest, size_bytes) of the topic's queues in group ``g``,
        and the node that answered: this node's replica if it has one, else the
        group's leader (asked through its replicas)."""
        name = cfg["name"]
        queues = [q for q in range(cfg["queues"]) if self.group_of(name, q, cfg) == g]
        if g in self.groups:
            out = {}
            for q in queues:
                ql = self.states[g].queue(queue_dir(name, cfg["incarnation"], q))
                out[q] = (ql.earliest, ql.next_offset, ql.size_bytes) if ql else (0, 0, 0)
            return out, self.leader_of(g) or ""
        resp, addr = ask_group(self.stub, self.replicas_of(g), "Offsets",
                               rmq_pb2.OffsetsRequest(topic=name, group=g))
        return {o.queue: (o.earliest, o.latest, o.size_bytes) for o in resp.queues}, addr

    def wait_for_data(self, cfg: dict, queue: int, offset: int, timeout: float):
        """The queue's log once it holds a record at ``offset``, or after ``timeout`` s."""
        g = self.group_of(cfg["name"], queue, cfg)
        self.hosted(g)
        return self.states[g].wait_for_queue(queue_dir(cfg["name"], cfg["incarnation"], queue), offset, timeout)

    def meta_command(self, cmd: MetaCommand):
        """Commit a metadata command through this node (the metadata leader); its value."""
        raft = self.require_leader(META_GROUP)
        result = self._commit(raft, cmd.encode())
        if result[0] == "error":
            raise ServiceError(getattr(grpc.StatusCode, result[1]), result[2])
        return result[1]

    def _commit(self, raft: RaftGroup, cmd: tuple):
        done = threading.Event()
        box: list = []

        def cb(res, err):
            box.append((res, err))
            done.set()

        raft.submit(cmd, cb)
        if not self._await(raft, done.wait):
            raise ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"group {raft.group_id}: no commit within {self.config.commit_timeout}s")
        res, err = box[0]
        if err != 0:
            raise NotLeader(raft.group_id, self.leader_of(raft.group_id)) from CommitFailed(err)
        return res

    # ---------------------------------------------------------------- produce
    def produce(self, cfg: dict, queue: int, block: bytes, count: int, producer: str, seq: int):
        """Replicate one validated records block to a queue; returns (base, count, ts, dup)."""
        return self.wait_produce(*self.submit_produce(cfg, queue, block, count, producer, seq))

    def submit_produce(self, cfg: dict, queue: int, block: bytes, count: int, producer: str,
                       seq: int) -> tuple[int, Future]:
        """Hand a validated block to the group's committer; ``wait_produce`` gets the result."""
        g = self.group_of(cfg["name"], queue, cfg)
        self.require_leader(g)
        item = ProduceItem(queue_dir(cfg["name"], cfg["incarnation"], queue), producer, seq,
                           int(time.time() * 1000), count, block)
        return g, self.committers[g].submit(item, len(block))

    def _await(self, raft: RaftGroup, wait: Callable[[float], bool]) -> bool:
        """``wait(t)`` in slices until it is True (done) or commit_timeout passes (False).

        Gives up early, raising NotLeader, when this node stops leading the
        group (pysyncobj steps a leader down when no majority answered it for
        an election timeout): the entry may still commit under the next
        leader, so the caller is told the outcome is unknown.
        """
        deadline = time.monotonic() + self.config.commit_timeout
        while True:
            left = deadline - time.monotonic()
            if wait(max(0.0, min(left, 0.05))):
                return True
            if left <= 0:
                return False
            if not raft.is_leader and not wait(0):     # done meanwhile: that is the outcome
                raise NotLeader(raft.group_id, self.leader_of(raft.group_id),
                                "lost the leadership while the write was pending; the outcome is "
                                "unknown: retry (with the same producer id and sequence)")

    def wait_produce(self, g: int, fut: Future):
        try:
            if not self._await(self.groups[g], lambda t: _settled(fut, t)):
                raise FutureTimeout
            return fut.result(0)
        except FutureTimeout:
            raise ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"group {g}: produce not committed within {self.config.commit_timeout}s "
                               "(outcome unknown; retry with the same producer id and sequence)") from None
        except CommitFailed as e:
            raise NotLeader(g, self.leader_of(g)) from e

    # ------------------------------------------------------------ peer access
    def stub(self, address: str) -> rmq_pb2_grpc.MessageLogStub:
        with self._channels_lock:
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        return rmq_pb2_grpc.MessageLogStub(ch)

    def fetch_from_peers(self, qname: str, start: int, end: int) -> bytes:
        """Committed batches [start, end) of a queue from a replica that has them (peers.py)."""
        topic, _, q = parse_queue_dir(qname)
        g = self.group_of(topic, q)
        peers = [a for a in self.replicas_of(g) if a != self.config.address]
        return fetch_range(self.stub, qname, start, end, peers, self.leader_of(g))

    def replica_read(self, qname: str, start: int, end: int, max_bytes: int) -> bytes:
        ql = next((q for st in self.states.values() if (q := st.queue(qname)) is not None), None)
        if ql is None:
            return b""
        data = ql.read(start, max_bytes)
        keep = 0
        for h in framing.iter_batches(data, verify=False):
            # The first batch goes even when it starts at or past end: on a
            # compacted queue the records in [start, end) may all be gone.
            if keep and h.base_offset >= end:
                break
            keep = h.position + h.size
        return data[:keep]

    # ------------------------------------------------------------- background
    def _flush_segments(self) -> None:
        """Sync segment files every ``segment_sync_interval`` off the raft thread.

        Segments are written by apply without a sync (the raft journal holds
        the entries); a raft snapshot must first sync them all, on the node's
        raft thread. Left to pile up between snapshots, that was 60-180 ms per
        snapshot (tens of MB) during which no group of the node made progress.
        """
        if self.config.fsync != "always":
            return
        while not self._stopping.wait(self.config.segment_sync_interval):
            for st in list(self.states.values()):
                st.sync_behind()

    def _background(self) -> None:
        while not self._stopping.wait(self.config.retention_interval):
            try:
                self.enforce_retention()
            except Exception:
                log.exception("retention pass failed")
            try:
                self.compact_queues()
            except Exception:
                log.exception("compaction pass failed")

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """On groups this node leads: propose prefix truncation and queue drops."""
        now_ms = now_ms or int(time.time() * 1000)
        proposed = 0
        for g, st in self.states.items():
            raft = self.groups[g]
            if not raft.is_leader:
                continue
            for name, ql in list(st.queues.items()):
                topic, inc, q = parse_queue_dir(name)
                cfg = self.meta.topic(topic)
                if cfg is None or cfg["incarnation"] != inc:
                    if self.meta.is_deleted(inc):
                        self._commit(raft, Drop(name).encode())
                        proposed += 1
                    continue
                cut = self._cutoff(cfg, q, ql, now_ms)
                if cut > ql.earliest:
                    self._commit(raft, Truncate(name, cut).encode())
                    proposed += 1
        return proposed

    def compact_queues(self, now_ms: int | None = None) -> int:
        """On every replica: drop superseded records of ``compact`` topics (see compaction.py).

        A queue is looked at again only when its cleanable end moved or a
        kept tombstone's delete-retention ran out. Returns records dropped.
        """
        now_ms = now_ms or int(time.time() * 1000)
        dropped = 0
        for st in self.states.values():
            for name, ql in list(st.queues.items()):
                topic, inc, q = parse_queue_dir(name)
                cfg = self.meta.topic(topic)
                if cfg is None or cfg["incarnation"] != inc or cfg["cleanup_policy"] != "compact":
                    continue
                policy = CompactionPolicy(self.meta.watermark(topic, "compaction").get(q, 0), now_ms,
                                          cfg["delete_retention_ms"], cfg["min_compaction_lag_ms"])
                end = cleanable_end(ql, policy)
                settings = (end, policy.delete_retention_ms)
                last = self._compacted.get(name)
                if last is not None and last[0] == settings and not (
                        last[1].next_tombstone_expiry_ms and last[1].next_tombstone_expiry_ms <= now_ms):
                    continue
                res = compact_queue(ql, policy, end)
                self._compacted[name] = (settings, res)
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

    # ----------------------------------------------------------------- status
    def local_status(self) -> rmq_pb2.NodeStatus:
        st = rmq_pb2.NodeStatus(address=self.config.address, node_id=self.config.node_id,
                                pid=os.getpid(), reachable=True, open_files=self.files.count)
        for g, raft in sorted(self.groups.items()):
            queues = list(self.states[g].queues.values()) if g in self.states else []
            st.groups.add(group=g, leader=self.leader_of(g) or "", commit_index=raft.raftCommitIndex,
                          applied_index=raft.raftLastApplied, term=raft.raftCurrentTerm,
                          raft_log_entries=len(raft.journal), queues=len(queues),
                          bytes=sum(q.size_bytes for q in queues),
                          replicas=[grpc_address(m) for m in raft.members])
        return st

    def stop(self) -> None:
        self._stopping.set()
        for t in (self._bg, self._flusher, self._placer):   # no proposal into stopped groups
            t.join(timeout=5)
        for c in self.committers.values():
            c.stop()
        self.raft_loop.stop()
        for raft in self.groups.values():
            raft.stop()
        self.raft_loop.close()
        with self._channels_lock:
            for ch in self._channels.values():
                ch.close()
        self._dir_lock.release()


def _produce_entry(items: list[ProduceItem]) -> tuple:
    """The raft entry of produce items drained together (group commit)."""
    return Produce(tuple(items)).encode()
