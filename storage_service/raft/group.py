"""One raft group: a pysyncobj SyncObj with our journal, fsync and tick loop.

What this subclass changes in pysyncobj 0.3.17, and why:

* Journal: pysyncobj's mmap journal is replaced by ``DurableJournal``. A
  follower's success reply (``__sendNextNodeIdx``) goes out only once the
  entries it covers are synced, and a leader counts its own copy towards a
  commit only once synced (``capped_match_index``). On a ``RaftLoop`` the
  syncs run on the loop's syncer thread; a group ticked alone syncs inline.
* Stale appends: pysyncobj's follower truncates its log after ``prevLogIdx``
  on *every* append_entries, even when the message is an old, shorter copy
  of what it already holds (a delayed "reset" makes the leader re-send an old
  range). The follower then drops entries it had acknowledged, the leader may
  already count them as committed, and if the leader dies in that window a
  committed entry is lost. ``_reconcile_append`` (appends.py) applies the raft rule
  instead: skip entries already held with the same term, truncate only at a
  real conflict, never because a message is short.
* Snapshots: the state machine provides ``snapshot() -> bytes`` and
  ``restore(bytes, index, leader)``; a data group's snapshot is a segment
  manifest, never the message payloads.
* Wire: ``transport.FastTcpConnection`` replaces pysyncobj's quadratic buffers
  and zlib/protocol-2 pickle framing. On a node's ``RaftLoop`` all groups
  share the node's one raft port and one connection per peer
  (``mux.MuxTransport`` over the loop's ``RaftHub``).
* Ticks: ``autoTick`` is off so the journal can be swapped before the first
  tick; our thread ticks: a node's ``RaftLoop`` (one thread and one poller
  for all its groups), or a thread of the group's own when built alone.
  Appends go out as soon as a command is queued (``appendEntriesUseBatch=False``:
  pysyncobj wakes its poller through a pipe), so short commit latency does
  not need a busy tick.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from pysyncobj import SyncObjConf, replicated
from pysyncobj.monotonic import monotonic as _monotonic

from . import membership, transport
from ._pysyncobj import FOLLOWER, LEADER, Engine, built_on, command_bytes
from .election import LeaseElection
from .membership import Membership
from ..log.diskspace import DiskSpace, Shortage
from ..log.durability import Damaged
from .appends import NO_ROOM_PAUSE, FollowerAppends
from .journal import DurableJournal
from .loop import RaftLoop, capped_match_index, loop_poller
from .mux import MuxTransport
from .snapshots import SnapshotFiles

__all__ = ["RaftGroup", "RaftLoop", "RaftTiming", "StateMachine", "capped_match_index"]

log = logging.getLogger(__name__)


transport.install()   # see storage_service/raft/transport.py


class StateMachine(Protocol):
    def apply(self, raft_index: int, cmd: tuple): ...
    def snapshot(self) -> bytes: ...
    def restore(self, data: bytes, index: int, leader: str | None, own: bool = False) -> None: ...


@dataclass(frozen=True)
class RaftTiming:
    tick: float = 0.1                # max poll wait; commands wake the loop at once
    # Heartbeat period. Commit indexes reach followers with the next append, or
    # alone ``commit_notice`` after the apply, so this is only liveness: 0.1 s
    # leaves 6-15 heartbeats per election timeout, and an idle node ticks half as
    # often as at 0.05 s (~0.025 instead of ~0.05 CPU s per node-second with 5 groups).
    append_period: float = 0.1
    # A leader tells its followers a new commit index this long after it applied
    # the entry, unless an append (a new entry, a heartbeat) carried it before
    # (``RaftGroup.on_apply_entries``). Followers' applied state, which follower
    # reads serve, trails the leader's by at most about this much more.
    commit_notice: float = 0.005
    min_timeout: float = 0.6         # election timeout range
    max_timeout: float = 1.5
    compaction_entries: int = 2000   # snapshot after this many entries ...
    compaction_bytes: int = 64 << 20  # ... or this much journal
    compaction_seconds: float = 60.0


class RaftGroup(FollowerAppends, SnapshotFiles, Membership, LeaseElection, Engine):
    def __init__(self, group_id: int, self_addr: str, peers: list[str], data_dir: str,
                 state: StateMachine, fsync: str = "always", timing: RaftTiming = RaftTiming(),
                 loop: RaftLoop | None = None, members_index: int = 0, preferred: bool = False,
                 disk: DiskSpace | None = None):
        """``peers``: the group's voters (raft addresses) as of raft index
        ``members_index`` (0: a founding replica); kept in the replica's
        ``members`` file when it is created, and ignored once it has one.
        ``preferred``: this replica should lead (the first of the group's recorded
        replicas): at start it stands for election first (election.py).
        ``disk``: the node's free-space watch; below its reserve this replica takes
        no new entries (``log/diskspace.py``)."""
        self.group_id = group_id
        self.tick_wanted = True          # the loop ticks this group at its next turn (tick_due)
        self._last_tick = 0.0
        self.disk = disk
        self.shortages = 0               # applies put off for want of space or descriptors
        self.damaged_put_offs = 0        # applies put off until a damaged queue is repaired
        self.refused_appends = 0         # appends not taken for want of space
        self._no_room_until: dict = {}   # leader: follower node -> monotonic time its pause ends
        self._no_room_why: dict = {}     # leader: follower node -> the shortfall it reported
        self._no_room_said = 0.0         # follower: when it last told the leader it has no room
        self._warned = 0.0
        self.state = state
        self.timing = timing
        self.stale_appends = 0
        self.snapshot_skips = 0
        self.snapshots_written = 0      # since start (metrics)
        self.snapshot_index = 0         # the last entry the latest snapshot covers
        os.makedirs(data_dir, exist_ok=True)
        conf = SyncObjConf(
            autoTick=False, journalFile=None,
            # Listen on this node's own address only (pysyncobj binds 0.0.0.0 without it).
            bindAddress=self_addr,
            fullDumpFile=os.path.join(data_dir, "snapshot"),
            serializer=self._write_snapshot, deserializer=self._read_snapshot,
            appendEntriesPeriod=timing.append_period,
            raftMinTimeout=timing.min_timeout, raftMaxTimeout=timing.max_timeout,
            connectionTimeout=max(3.5, timing.max_timeout), connectionRetryTime=0.5,
            logCompactionMinEntries=timing.compaction_entries,
            logCompactionMinTime=timing.compaction_seconds,
            appendEntriesBatchSizeBytes=64 << 20, sendBufferSize=1 << 20, recvBufferSize=1 << 20,
            commandsQueueSize=100_000,
            # Replicas are added and removed one at a time (membership.py keeps
            # the configuration durable; the placement controller drives it).
            dynamicMembershipChange=True,
            # Check-quorum: a leader no majority answered for the longest election
            # timeout steps down (pysyncobj's default, 30 s, kept a cut-off leader
            # taking writes). Not the shortest: on a loaded host a follower's loop
            # was seen held up 0.5-0.57 s (two CPU burners beside the partition test),
            # and with one follower cut off, 0.6 s deposed healthy leaders. Reads do
            # not depend on it: the lease (election.py) ends 0.48 s after the last
            # majority's echo, whatever this says.
            leaderFallbackTimeout=timing.max_timeout,
            onStateChanged=self._state_changed,
            # Send appends as soon as a command is queued (pysyncobj then wakes
            # its poller through a pipe) instead of waiting for the next
            # heartbeat: group commit already makes the entries big.
            appendEntriesUseBatch=False)
        self._committer = None
        self.commit_notice_due: float | None = None   # leader: when to send the commit index alone
        self._loop = loop
        self._transfer = None            # (target raft address, deadline, sent) while handing over
        # The replica's initial members, recorded when it was created: a restart
        # (and membership.py) starts from them, not from the caller's list.
        recorded = membership.read_members(data_dir)
        if recorded is None:
            membership.write_members(data_dir, peers, members_index)
            recorded = (list(peers), members_index)
        self.initial_members, self.members_index = set(recorded[0]), recorded[1]
        others = [p for p in recorded[0] if p != self_addr]
        kwargs = {}
        if loop is not None and loop.hub is not None:
            kwargs["transportClass"] = functools.partial(MuxTransport, loop.hub, group_id)
        with built_on(None if loop is None else functools.partial(loop_poller, loop)):
            super().__init__(self_addr, others, conf, **kwargs)
        self._init_election(timing.min_timeout, preferred)
        self._apply_id = self.method_id("apply_command")
        self._install_journal(DurableJournal(os.path.join(data_dir, "raft"), fsync))
        self._load_members()
        self._running = True
        if loop is None:
            self._thread = threading.Thread(target=self._tick_loop, name=f"raft-{group_id}", daemon=True)
            self._thread.start()
        else:
            self._thread = None
            loop.add(self)

    _STATES = ("follower", "candidate", "leader")

    def _state_changed(self, old: int, new: int) -> None:
        """pysyncobj's state callback (tick thread): leadership changes in the node's log."""
        log.info("group %d: %s -> %s in term %d", self.group_id, self._STATES[old], self._STATES[new],
                 self.raftCurrentTerm)
        if old == LEADER and new == FOLLOWER:       # check-quorum: how long each follower was silent
            now = _monotonic()
            log.info("group %d: stepped down: last reply %s", self.group_id,
                     ", ".join(f"{getattr(n, 'address', n)} {now - t:.2f} s ago"
                               for n, t in self.response_times().items()))

    # ------------------------------------------------------------- journal
    def _install_journal(self, journal: DurableJournal) -> None:
        """Swap in the durable journal and reload raft's persistent state from it."""
        self.install_log(journal)
        self.journal = journal

    def on_commands(self, base):
        if self._transfer is not None and self._transfer_step():
            return                       # new entries wait while leadership moves (membership.py)
        if self._committer is not None:
            self._committer.drain()      # group commit: queued produce calls -> one entry
        base()
        if self._loop is None or not self.peers:
            self.journal.sync()     # alone, the leader's copy is the commit: synced at once
        elif self.journal.durable_idx < self.journal.last_idx:
            # The loop's syncer makes them durable; until then _onTick does not
            # count this node's own copy towards a commit.
            self._loop.request_sync(self)

    def on_tick(self, base):
        if not self._election_tick():
            base = self._timer_held(base)     # pysyncobj stands only after a won pre-vote
        j = self.journal
        if self._loop is None or j.durable_idx >= j.last_idx or not self.is_leading():
            return base()
        real = self.match_index
        voters = self.peers
        counted = dict(real)
        counted.update(capped_match_index({n: i for n, i in real.items() if n in voters}, j.durable_idx))
        before = dict(counted)
        self.match_index = counted
        try:
            return base()
        finally:
            self.match_index = real
            for node, idx in counted.items():      # what the tick itself wrote
                if before.get(node) != idx:
                    real[node] = idx
            for node in set(before) - set(counted):
                real.pop(node, None)

    def _warn(self, what: str) -> None:
        now = time.monotonic()
        if now - self._warned >= 10:
            self._warned = now
            log.warning("group %d: %s", self.group_id, what)

    def on_apply_entries(self, base):
        waiting = self.waiting_commit()
        # The few commands awaiting their commit, not a walk over every index to apply
        # (after a restart that is the whole journal, on every tick until applied).
        applied = self.raftLastApplied
        due = {i: callbacks for i, callbacks in waiting.items() if i > applied}
        try:
            need_send = base()
        except (Shortage, Damaged) as e:
            # Not applied, not skipped: the entry is applied again next tick (its items
            # already written answer as before: DataState._apply_item), once space or
            # descriptors are there, or the damaged copy it needed is repaired.
            # pysyncobj took the entry's callbacks before it applied it: they go
            # back, so its producers get their answers.
            for i, callbacks in due.items():
                if i > self.raftLastApplied and i not in waiting:
                    waiting[i] = callbacks
            if isinstance(e, Damaged):
                self.damaged_put_offs += 1
            else:
                self.shortages += 1
                if self.disk is not None:
                    self.disk.met_shortage()
            self._warn(f"applying entry {self.raftLastApplied + 1} put off: {e}")
            return self._commit_notice(False)
        return self._commit_notice(need_send)

    def _commit_notice(self, applied: bool) -> bool:
        """Whether this tick should send appends to tell followers the commit index.

        pysyncobj sends an append after every apply only for that: two messages
        and two replies an entry, and a tick on each follower. The next append
        carries the commit index anyway, so the leader waits up to
        ``timing.commit_notice`` for one (an entry proposed meanwhile, a
        heartbeat: ``on_send_appends`` clears the wait) and sends the commit
        index alone only when none came. Under load entries follow each other
        and no commit-only append is sent; a lone write's followers learn its
        commit ``commit_notice`` later.
        """
        if not self.is_leading():
            self.commit_notice_due = None
            return applied
        if not self.peers:
            return False                    # no follower to tell
        now = time.monotonic()
        if applied and self.commit_notice_due is None and \
                not (self._committer is not None and self._committer.will_propose()):
            self.commit_notice_due = now + self.timing.commit_notice
        if self.commit_notice_due is not None and now >= self.commit_notice_due:
            self.commit_notice_due = None   # (sent now; or, transport not ready, with the next heartbeat)
            return True
        return False

    def on_send_appends(self, base):
        try:
            return super().on_send_appends(base)
        finally:
            self.commit_notice_due = None   # every connected follower got the commit index

    def on_reply(self, node, reset=False, nextNodeIdx=None, success=False):
        if not success:
            self.send_lease_ack(node, self.raftCurrentTerm)
            return self.base_reply(node, reset, nextNodeIdx, success)
        # durable before the leader may count it
        if nextNodeIdx is None:
            nextNodeIdx = self.journal.last_idx + 1
        if self._loop is not None and self._loop.running:
            # Sent once durable (at once when the disk is quick and the syncer idle); a
            # lease stamp goes ahead alone if that takes long (loop.LEASE_ACK_AFTER).
            self._loop.defer_ack(self, node, reset, nextNodeIdx)
            return
        self.journal.sync()
        self.send_success(node, reset, nextNodeIdx, self.raftCurrentTerm)

    def send_success(self, node, reset: bool, next_idx: int, term: int) -> None:
        """pysyncobj's success reply, plus the term it was earned in.

        pysyncobj's reply carries no term, so a reply delayed past an election
        could make the new term's leader count entries of an old term that
        this follower holds at the same indexes. Leaders drop a reply of
        another term (``_on_ack``); a node without the field is taken as before.
        """
        self.raft_send(node, {"type": "next_node_idx", "next_node_idx": next_idx, "reset": reset,
                              "success": True, "term": term, "lt": self.echo_for(term)})

    # -------------------------------------------------------- stale appends
    def on_message(self, node, message):
        try:
            return self._on_message(node, message)
        finally:
            if not self._quiet(message):
                self.tick_wanted = True

    def _quiet(self, message) -> bool:
        """A message after which a tick has nothing to do: a heartbeat, or a follower's
        ack, that leaves nothing to commit or apply (``tick_due``)."""
        kind = message.get("type")
        if kind == "append_entries":
            if message.get("entries") or "transmission" in message or message.get("serialized") is not None:
                return False
        elif kind != "next_node_idx" or not message.get("success") or message.get("reset"):
            return False
        return self.raftCommitIndex <= self.raftLastApplied and \
            (not self.is_leading() or self.raftCommitIndex >= self.last_log_index())

    def _on_message(self, node, message):
        if self._election_message(node, message):
            return       # lease, stickiness, pre-vote (election.py)
        if message.get("type") == "next_node_idx" and message.get("term", self.raftCurrentTerm) != self.raftCurrentTerm:
            return       # a reply earned in another term says nothing about this term's entries
        if message.get("type") == "next_node_idx" and message.get("success") and not message.get("reset"):
            return self._on_ack(node, message)
        if message.get("type") == "no_room":
            if message.get("term") == self.raftCurrentTerm:
                self._no_room_until[node] = time.monotonic() + NO_ROOM_PAUSE
                self._no_room_why[node] = message.get("why") or "its disk is below its reserve"
            return
        if message.get("type") == "append_entries" and message["term"] >= self.raftCurrentTerm:
            if self.disk is not None and self.disk.low():
                if message.get("entries"):
                    message = self._no_room(node, message)
                    if message is None:
                        return
                else:
                    self._still_no_room(node, message)
            if "prevLogIdx" in message and "transmission" not in message:
                message = self._reconcile_append(node, message)
            elif message.get("serialized") is not None:
                message = self._install_snapshot(node, message)
            elif "prevLogIdx" not in message:
                # pysyncobj's leader sends this while a snapshot's data is not ready
                # ("serialized": None); its follower then takes the commit index up to
                # its own last entry, never checked against the leader's log, and
                # applies entries of an old term that were never committed. Raft
                # commits only up to the last entry known to match the leader's.
                message = self._heartbeat(message, self.raftCommitIndex)
            if message is None:
                return
        self.deliver(node, message)

    def _on_ack(self, node, message) -> None:
        """A follower's success reply, without moving the leader's next index back.

        pysyncobj sets the next index to just past the acknowledged entry even
        when later entries are already on their way, so the next append
        (then sent after every apply, for the commit index) carried those entries
        again: with two entries in flight about every second entry went out
        twice, 100 KiB+ each, and the follower answered both copies.
        """
        sent = self.next_index.get(node)
        self.deliver(node, message)
        if sent is not None and self.next_index.get(node, sent) < sent:
            self.next_index[node] = sent

    # ---------------------------------------------------------------- apply
    @replicated
    def apply_command(self, cmd):
        return self.state.apply(self.raftLastApplied + 1, cmd)

    def submit(self, cmd, callback: Callable) -> None:
        """Queue a command; ``callback(result, fail_reason)`` runs on the tick thread."""
        self.apply_command(cmd, callback=callback)

    def set_committer(self, committer) -> None:
        """``committer.drain()`` runs on the tick thread before commands are appended."""
        self._committer = committer

    def propose(self, cmd, callback: Callable) -> None:
        """``submit`` for the tick thread itself: the command is appended in this very
        tick, so pysyncobj's poller need not be woken through its pipe."""
        self.queue_command(command_bytes(self._apply_id, cmd), callback)

    # ------------------------------------------------------------ tick loop
    def _tick_loop(self) -> None:
        while self._running:
            if not self.tick(self.timing.tick):
                time.sleep(self.timing.tick)

    def want_tick(self) -> None:
        self.tick_wanted = True

    def tick_due(self, now: float, period: float) -> bool:
        """Whether the loop should tick this group now (``loop.RaftLoop``): a message
        that left work, a wake-up or an event of its own descriptors came, or the
        timers are due: ``period`` passed (half of it on a leader, whose heartbeats
        go every ``append_period``)."""
        poller = self.engine_poller()
        due = self.commit_notice_due
        if self.tick_wanted or getattr(poller, "active", True) or (due is not None and now >= due) or \
                now - self._last_tick >= (period / 2 if self.is_leading() else period):
            self.tick_wanted = False
            poller.active = False
            self._last_tick = now
            return True
        return False

    def tick(self, wait: float) -> bool:
        """One raft tick (waiting up to ``wait`` for socket events); False if it failed."""
        if not self._running:
            return True
        try:
            self.do_tick(wait)
            if self.journal.size_bytes > self.timing.compaction_bytes:
                self.forceLogCompaction()
            return True
        except Exception:
            log.exception("group %d: tick failed", self.group_id)
            return False
        finally:
            # A due notice this tick did not settle (it failed, or never reached the
            # apply) must not make the loop tick the group at once, again and again.
            due = self.commit_notice_due
            if due is not None and time.monotonic() >= due:
                self.commit_notice_due = None

    # --------------------------------------------------------------- status
    @property
    def is_leader(self) -> bool:
        return self.is_leading()

    @property
    def leader_raft_address(self) -> str | None:
        return self.leader_hint      # named only while heard from (election.py)

    def stop(self) -> None:
        self._running = False
        if self._loop is not None:
            self._loop.stop()      # the node stops all its groups together
        else:
            self._thread.join(timeout=5)
        self._destroy()

    def close(self) -> None:
        """Stop this group alone, its node's loop going on (a replica moved away).
        Runs on the loop thread (``RaftLoop.call``)."""
        self._running = False
        if self._loop is not None:
            self._loop.remove(self)
        self._destroy()

    def _destroy(self) -> None:
        try:
            self.destroy_engine()
        finally:
            self.journal._destroy()
            self.state.close()
