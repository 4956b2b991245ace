"""A storage node: G data raft groups + the metadata group, and their plumbing.

The node owns the raft groups and the background loops (retention, cleanup of
deleted topics). The gRPC servicer (``service.py``) validates requests and
calls the methods here; nothing outside a raft apply changes replicated state.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import grpc

from ..log.dirlock import DirectoryLock
from ..log.diskspace import DiskSpace
from ..log.handles import OpenFiles, open_files_limit
from ..metrics import NodeMetrics
from ..proto import rmq_pb2, rmq_pb2_grpc
from ..protocol import framing
from ..protocol.placement import GRPC_OPTIONS, META_GROUP, cluster_address, group_of, grpc_address, raft_address
from ..protocol.tls import TlsFiles, channel_credentials
from ..raft.group import RaftGroup, RaftLoop, RaftTiming
from ..raft.groupcommit import GroupCommitter
from ..raft.tls_wire import RaftTls
from ..statemachine.data import DataState, parse_queue_dir, queue_dir
from ..statemachine.meta import MetaState
from ..security.authz import Gate
from ..cluster.controller import Controller
from ..protocol.errors import NotLeader, ServiceError, not_found
from ..cluster.hosting import hosted_on_disk, initial_layout, joined_groups, record_join
from ..cluster.peers import ask_group, fetch_range
from ..security.meta_sync import MetaSync, security_config
from ..cluster.repair import Repair
from ..cluster.replicas import ReplicaSet
from ..cluster.upkeep import Upkeep
from .writes import NodeWrites, produce_entry

__all__ = ["NodeConfig", "StorageNode"]

log = logging.getLogger(__name__)
STOP_THREADS_S = 3.0       # how long a stop waits for its background threads, all together


# How long a leader read waits for the leader's lease to be confirmed (a new
# leader's first heartbeat round trip) before it answers not-leader.
READ_LEASE_WAIT = 0.3


@dataclass(frozen=True)
class NodeConfig:
    node_id: int
    addresses: tuple[str, ...]          # gRPC address of every node; index = node id
    groups: int
    data_dir: str
    fsync: str = "always"
    sync_threads: int = 1               # journal syncs of different groups at once (--journal-sync-threads)
    rack: str = ""                      # its rack (cluster/racks.py); "" shares the rack of all such nodes
    max_message_bytes: int = 4 << 20
    max_batch_bytes: int = 16 << 20
    max_batch_messages: int = 100_000
    max_commit_backlog: int = 64 << 20     # per group: produce bytes waiting to be committed
    segment_bytes: int = 64 << 20
    retention_interval: float = 5.0
    segment_sync_interval: float = 0.25
    commit_timeout: float = 10.0
    max_open_files: int = 0             # segment files held open; 0: half the process's fd limit
    max_queues: int = 200_000           # queues in the cluster
    replication: int = 3                # replicas of each data group (at most one per node)
    repair_after: float = 300.0         # a node down this long has its replicas re-created elsewhere
    max_requests: int = 512             # handlers running or queued (server/dispatch.py)
    max_parked_fetches: int = 20_000    # long-polling fetches waiting for data, holding no thread
    min_free_bytes: int = 64 << 20      # below this free in data_dir: no new data (log/diskspace.py)
    scrub_interval: float = 21_600.0    # seconds between scrub passes over every segment (0: off)
    scrub_bytes_per_s: int = 32 << 20   # what a scrub reads per second at most
    join: tuple[str, ...] = ()          # a new node: nodes of the running cluster to join through
    timing: RaftTiming = field(default_factory=RaftTiming)
    tls: TlsFiles | None = None         # TLS on the gRPC and produce ports, and to peers (security/)
    tls_client_cert: bool = False       # clients must present a certificate of the cluster's CA
    node_names: tuple[str, ...] = ()    # TLS: certificate common names of the cluster's nodes
                                        # (default: this node's own certificate's)
    authorize: bool = False             # credentials required, ACLs enforced (security/authz.py)
    token_secret_file: str | None = None  # signs and checks bearer tokens (security/tokens.py)
    superusers: tuple[str, ...] = ()    # principals allowed everything
    data_umask: int = 0o077             # the data directory's mode is 0777 & ~this (0700: the node's
                                        # user only; rmq-storage node also sets it as its umask)
    http: bool = True                   # serve the HTTP port, gRPC port + 4 (storage_service/http)
    metrics: bool = True                # count requests for /metrics (--no-metrics: off)
    metrics_max_queue_series: int = 30_000   # per-queue series exported while they number at most this

    @property
    def address(self) -> str:
        return self.addresses[self.node_id]


class StorageNode(NodeWrites, ReplicaSet, Upkeep, Repair, MetaSync):
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
        # One stub per peer: building one makes a callable per RPC (33), and the
        # controller asks every node's status each pass.
        self._stubs: dict[str, rmq_pb2_grpc.MessageLogStub] = {}
        self._channels_lock = threading.Lock()
        # TLS to peers: read once at start (a file rotated later must not fail a peer call)
        self._peer_credentials = None if config.tls is None else channel_credentials(config.tls)
        self.security = security_config(config)
        self.gate = Gate(self.security, self.meta, self.meta_sync) if self.security.active else None
        self._meta_synced = self._meta_sync_failed = 0.0
        self._meta_sync_lock = threading.Lock()
        self.files = OpenFiles(open_files_limit(config.max_open_files))
        self.metrics = NodeMetrics() if config.metrics else None
        self.http_address = ""           # set once the HTTP port is served (app.serve)
        # every port of the node bound (app.serve): Health says serving only then. The
        # gRPC server answers first, and a caller told "ready" (LocalCluster.wait_ready,
        # `rmq-storage local`) went to the HTTP port before it was bound (refused).
        self.ports_up = False
        os.makedirs(config.data_dir, exist_ok=True)
        # Whoever cannot enter the data directory reads no segment, journal or
        # snapshot in it, whatever their own modes (files made before included).
        os.chmod(config.data_dir, 0o700 | (0o777 & ~config.data_umask))
        self.disk = DiskSpace(config.data_dir, config.min_free_bytes)
        self.raft_loop = RaftLoop(config.timing.tick, name=f"raft-node-{config.node_id}",
                                  listen=raft_address(config.address),
                                  connection_timeout=max(3.5, config.timing.max_timeout),
                                  sync_threads=config.sync_threads,
                                  tls=None if config.tls is None else
                                  RaftTls(config.tls, self.security.node_names))
        # The placement this node starts from, until the metadata group's record
        # is applied here (hosting.py): which data groups it hosts and where the others are.
        meta_members, meta_index = config.addresses, 0
        if config.join:
            self.layout = {}         # a joining node holds what the controller gives it
            if not os.path.isdir(os.path.join(config.data_dir, f"group-{META_GROUP}")):
                meta_members, meta_index = self._join_cluster(config.join)
            self.config = config = dataclasses.replace(config, groups=joined_groups(config.data_dir))
            self.meta.groups = config.groups
        else:
            self.layout = initial_layout(config.addresses, config.groups, config.replication, config.data_dir)
        self.groups[META_GROUP] = self._raft(META_GROUP, self.meta, meta_members, meta_index)
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
        self._drop_lock = threading.Lock()
        self._placer = threading.Thread(target=self._reconcile, name="placement", daemon=True)
        self._placer.start()
        self.controller = Controller(self, repair_after=config.repair_after)
        self._controller = threading.Thread(target=self.controller.run, args=(self._stopping,),
                                            name="controller", daemon=True)
        self._controller.start()
        self._start_repair()
        threading.Thread(target=self._open_queues_behind, name="open-queues", daemon=True).start()

    def _open_queues_behind(self, step: int = 500) -> None:
        """Open the queues found on disk at start that nothing has used yet, a few
        hundred at a time, while the node serves (``statemachine/queue_logs.py``)."""
        total = sum(st.queues.total() for st in list(self.states.values()))
        left, said = None, time.monotonic()
        while not self._stopping.is_set() and left != 0:
            left = sum(st.queues.open_some(step) for st in list(self.states.values()))
            if left and time.monotonic() - said > 5:
                log.info("opening queues %d/%d", total - left, total)
                said = time.monotonic()
            self._stopping.wait(0.005)      # serving comes first
        if total:
            log.info("opening queues %d/%d: done (%d opened in the background)", total, total,
                     sum(st.queues.opened_behind for st in list(self.states.values())))

    def _join_cluster(self, seeds) -> tuple[list[str], int]:
        """Ask the running cluster (through ``seeds``) to take this node in; the
        metadata group's voters (this node included) as of the index they hold from."""
        deadline = time.monotonic() + 60
        while True:
            try:
                resp, via = ask_group(self.stub, list(seeds), "JoinCluster",
                                      rmq_pb2.JoinClusterRequest(address=self.config.address), timeout=20)
                break
            except NotLeader as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not join the cluster through {', '.join(seeds)}: {e.message}")
                time.sleep(1)
        log.info("joined the cluster through %s: metadata voters %s as of index %d", via,
                 list(resp.members), resp.members_index)
        record_join(self.config.data_dir, resp.groups)
        return list(resp.members), resp.members_index

    def _raft(self, g: int, state, members, members_index: int = 0) -> RaftGroup:
        c = self.config
        laid_out = (self.meta.replicas_of(g) or self.layout.get(g) or list(members)) if g else list(members)
        raft = RaftGroup(g, raft_address(c.address), [raft_address(a) for a in members],
                         os.path.join(c.data_dir, f"group-{g}"), state, c.fsync, c.timing,
                         loop=self.raft_loop, members_index=members_index,
                         preferred=bool(laid_out) and laid_out[0] == c.address,
                         disk=self.disk if g else None)
        if self.metrics is not None:
            raft.journal.observe_fsync = self.metrics.fsync_observer(g)
        return raft

    def _open_group(self, g: int, members, members_index: int = 0) -> None:
        """Open this node's replica of data group ``g``, or create it, empty, with
        ``members`` (gRPC addresses) its voters as of raft index ``members_index``."""
        c = self.config
        st = DataState(os.path.join(c.data_dir, f"group-{g}", "queues"), fsync=c.fsync == "always",
                       segment_bytes=c.segment_bytes, files=self.files)
        st.fetch_range = self.fetch_from_peers
        st.queues.on_open = self.check_opened
        st.on_damaged = self.check_damaged
        raft = self._raft(g, st, members, members_index)
        # Copies, not updates: other threads iterate these maps while a replica is added.
        self.committers = {**self.committers,
                           g: GroupCommitter(raft, produce_entry, max_entry_bytes=c.max_batch_bytes * 2)}
        self.states = {**self.states, g: st}
        self.groups = {**self.groups, g: raft}

    def now_ms(self) -> int:
        """The cluster's time (``RaftHub.cluster_time_ms``: the median of the nodes'
        wall clocks): store timestamps, retention and leases follow it, so one node's
        clock stepping back or forward does not move them."""
        hub = self.raft_loop.hub
        return hub.cluster_time_ms() if hub is not None else int(time.time() * 1000)

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
        cluster past ``max_queues``. On three nodes every node holds a replica of
        every queue, so the limit is what one node's memory and files take (README:
        many queues); on more nodes a node holds about RF/N of them."""
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
        self.check_member()
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
        pending = [a for a in self.cluster_nodes() if a != self.config.address]
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

    def park_fetch(self, cfg: dict, queue: int, offset: int, wake):
        """Have ``wake()`` called once the queue holds a record at ``offset`` (or goes
        away); a cancel function, or None when it holds one already (``DataState.park``)."""
        g = self.group_of(cfg["name"], queue, cfg)
        self.hosted(g)
        return self.states[g].park(queue_dir(cfg["name"], cfg["incarnation"], queue), offset, wake)

    # ------------------------------------------------------------ peer access
    def stub(self, address: str) -> rmq_pb2_grpc.MessageLogStub:
        """A peer's service; with TLS on its cluster port, as this node (its certificate)."""
        stub = self._stubs.get(address)
        if stub is not None:
            return stub
        with self._channels_lock:
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = (
                    grpc.insecure_channel(address, options=GRPC_OPTIONS) if self.config.tls is None
                    else grpc.secure_channel(cluster_address(address), self._peer_credentials,
                                             options=GRPC_OPTIONS))
            stub = self._stubs[address] = rmq_pb2_grpc.MessageLogStub(ch)
        return stub

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
        The same pass (under any ``--fsync``) writes each group's key index rows
        held in memory past ``kv_index.FLUSH_SECONDS`` to SQLite.
        """
        while not self._stopping.wait(self.config.segment_sync_interval):
            for st in list(self.states.values()):
                if self.config.fsync == "always":
                    st.sync_behind()
                try:
                    st.flush_kv_index()      # (also: key index rows held in memory, kv_index.py)
                except Exception as e:       # (sqlite3.Error: the rows are read from the log again)
                    log.warning("group data %s: key index rows not written (%s)", st.root, e)

    # ----------------------------------------------------------------- status
    def local_status(self) -> rmq_pb2.NodeStatus:
        me = self.meta.placement()[0].get(self.config.address, {})
        st = rmq_pb2.NodeStatus(address=self.config.address, node_id=me.get("id", self.config.node_id),
                                pid=os.getpid(), reachable=True, open_files=self.files.count,
                                parked_fetches=sum(st.parked_count() for st in list(self.states.values())),
                                http=self.http_address, rack=self.config.rack)
        for g, raft in sorted(self.groups.items()):
            data = self.states.get(g)
            # bytes: of the open queues (those not opened since the start are not counted),
            # kept as they change (tally.ByteCount), not summed over every queue here
            st.groups.add(group=g, leader=self.leader_of(g) or "", commit_index=raft.raftCommitIndex,
                          applied_index=raft.raftLastApplied, term=raft.raftCurrentTerm,
                          raft_log_entries=len(raft.journal), queues=data.queues.total() if data else 0,
                          bytes=data.sizes.total if data else 0,
                          replicas=[grpc_address(m) for m in raft.members])
        return st

    def stop(self) -> None:
        t0 = time.monotonic()
        self._stopping.set()
        # No proposal into stopped groups: the background threads end first, within a
        # budget shared by all of them (a controller pass waiting on peers that are
        # stopping too must not hold up the snapshot a graceful stop is for).
        for t in (self._bg, self._flusher, self._placer, self._controller):
            t.join(timeout=max(0.0, t0 + STOP_THREADS_S - time.monotonic()))
            if t.is_alive():
                log.warning("stopping: thread %s still running %.1f s after the stop began; going on",
                            t.name, time.monotonic() - t0)
        for c in self.committers.values():
            c.stop()
        self.raft_loop.stop()
        if not self.raft_loop.stopped:
            log.warning("stopping: the raft loop did not stop; no snapshot at stop (the restart replays "
                        "the journals)")
        written = []
        for g, raft in self.groups.items() if self.raft_loop.stopped else ():
            try:
                if raft.snapshot_at_stop():          # the restart replays nothing (snapshots.py)
                    written.append(g)
            except Exception:
                log.exception("group %d: snapshot at stop failed (the restart replays its journal)", g)
        log.info("stopping: snapshots of groups %s written, %.1f s after the stop began", written,
                 time.monotonic() - t0)
        for raft in self.groups.values():
            raft.stop()
        self.raft_loop.close()
        with self._channels_lock:
            for ch in self._channels.values():
                ch.close()
            self._stubs.clear()
        self._dir_lock.release()
