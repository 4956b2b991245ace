"""One thread and one poller for every raft group of a node, and the syncer beside it.

With a thread per group, each of a node's G+1 groups wakes on its own, and
every wake-up is a GIL hand-over and a context switch; on two cores under
produce load that cost more than the raft work itself. A ``RaftLoop`` polls
once for all its groups' sockets and pipes, then ticks each group. Journal
syncs run on the loop's syncer thread, or on the loop thread itself while the
syncer is idle and syncs are quick and small (``request_sync``), and a
follower's success reply waits here (``defer_ack``) until the entries it
covers are durable.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future
from typing import Callable, Protocol

from pysyncobj.poller import PollPoller

from ..log.durability import fatal
from .journal import DurableJournal
from .mux import RaftHub

__all__ = ["RaftLoop", "capped_match_index", "loop_poller"]

log = logging.getLogger(__name__)
# Seconds between two polls past which the loop reads its sockets again before any
# group ticks (the poll itself waits up to ``tick``; a tick of every group is ms).
LATE = 0.25
WARN_LATE = 0.3      # a hold-up this long is logged
# A journal sync runs on the loop thread itself while the syncer has nothing to do and
# recent syncs took less than this (a quick disk): handing it to the syncer and waking
# the loop after cost ~4 thread switches (GIL hand-overs) each, more than the sync.
INLINE_SYNC_S = 0.0005
INLINE_SYNC_BYTES = 64 << 10     # ... and it has at most this much to write back
# A follower's success reply held for a sync carries the leader's lease stamp back
# (election.py). Held longer than this (a slow disk), the stamp goes ahead alone (a
# lease_ack), so the leader keeps its lease (0.48 s past a stamp) whatever the disk.
# Not at once: a quick sync's reply carries it a few ms later anyway, and an ack
# sent for every held reply was a message, and a leader tick, an entry for nothing.
LEASE_ACK_AFTER = 0.05


class LoopGroup(Protocol):
    """What the loop needs of a group (``group.RaftGroup``)."""
    group_id: int
    journal: DurableJournal
    raftCurrentTerm: int
    commit_notice_due: float | None    # when the group wants a tick to send its commit index

    def tick(self, wait: float) -> bool: ...
    def tick_due(self, now: float, period: float) -> bool: ...
    def want_tick(self) -> None: ...
    def wake(self) -> None: ...
    def send_success(self, node, reset: bool, next_idx: int, term: int) -> None: ...
    def send_lease_ack(self, node, term: int) -> None: ...


def capped_match_index(match: dict, durable_idx: int) -> dict:
    """Followers' match indexes as the leader may count them while its own
    journal is durable only up to ``durable_idx``.

    pysyncobj counts the leader's copy of every entry towards a commit. For an
    entry past ``durable_idx`` that copy could still vanish with the page
    cache, so a majority must come from followers alone. Capping the most
    advanced follower at ``durable_idx`` does exactly that: up to
    ``durable_idx`` every follower counts as before; past it, the leader's
    count of 1 stands in for the capped follower, so only the other
    followers' copies are counted, plus that one (a real, durable copy).
    """
    counted = dict(match)
    if counted:
        top = max(counted, key=counted.get)
        counted[top] = min(counted[top], durable_idx)
    return counted


class _LoopPoller:
    """What one group of a RaftLoop sees as its poller: subscriptions go to the
    loop's poller; ``poll`` does nothing (the loop polls once for all groups).
    ``active``: an event of the group's own descriptors (its wake-up pipe, its
    sockets without a hub) came since the loop last ticked the group."""

    def __init__(self, poller: PollPoller):
        self._poller = poller
        self.active = True

    def subscribe(self, descr, callback, eventMask):
        def guarded(fd, event):
            self.active = True
            # One group's failing handler must not skip the other groups'
            # events of this poll (they would wait for the next one).
            try:
                callback(fd, event)
            except Exception:
                log.exception("raft loop: event handler failed")
        self._poller.subscribe(descr, guarded, eventMask)

    def unsubscribe(self, descr):
        self._poller.unsubscribe(descr)

    def poll(self, timeout):
        pass


class RaftLoop:
    """One thread that ticks every raft group of a node.

    With a thread per group, each of a node's G+1 groups wakes on its own, and
    every wake-up is a GIL hand-over and a context switch; on two cores under
    produce load that cost more than the raft work itself. Here the groups
    share one poller: the thread polls once for all their sockets and pipes,
    then runs each group's tick without waiting.
    """

    def __init__(self, tick: float = 0.1, name: str = "raft", listen: str | None = None,
                 connection_timeout: float = 3.5, tls=None, sync_threads: int = 1):
        """``listen``: the node's raft address; its groups then share one port and one
        connection per peer (``mux.RaftHub``). Without it each group runs
        pysyncobj's own TCP transport on its own address. ``tls``: the hub's
        ``tls_wire.RaftTls`` (only nodes of the cluster may connect).
        ``sync_threads``: journal syncs of different groups that may run at once
        (``--journal-sync-threads``); a group's own syncs never overlap."""
        if sync_threads < 1:
            raise ValueError(f"sync_threads {sync_threads}: at least 1")
        self.tick = tick
        self.timer_period = tick / 2     # the poll's longest wait (a leader's timer period)
        self.poller = PollPoller()
        self.hub = RaftHub(listen, self.poller, timeout=connection_timeout, tls=tls) if listen else None
        self.groups: list["LoopGroup"] = []
        # Journal syncs run on a thread of their own: waiting for the disk on
        # the raft thread held up every group of the node (under produce load
        # about 30% of its time went to fdatasync). Only a quick, small sync
        # while the syncer is idle runs here (request_sync). Success replies
        # wait here until their entries are durable.
        self._to_sync: collections.deque = collections.deque()
        self._sync_wanted = threading.Condition()
        self._acks: list[tuple] = []
        self._syncing = 0                # syncs under way on the syncer threads
        self._in_sync: set = set()       # their groups (a group is synced by one thread at a time)
        self._sync_s = INLINE_SYNC_S     # a running mean of how long syncs take (either thread)
        self._last_sync_s = INLINE_SYNC_S   # and the latest one
        self._calls: collections.deque = collections.deque()    # (fn, Future) to run on the loop thread
        self._running = True
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._syncers = [threading.Thread(target=self._sync_journals, name=f"{name}-sync" + (f"-{k}" if k else ""),
                                          daemon=True) for k in range(sync_threads)]

    def add(self, group: "LoopGroup") -> None:
        self.groups.append(group)

    def remove(self, group: "LoopGroup") -> None:
        """Stop ticking ``group`` (loop thread, or before the loop starts)."""
        self.groups = [g for g in self.groups if g is not group]
        self._acks = [a for a in self._acks if a[0] is not group]
        with self._sync_wanted:
            if group in self._to_sync:
                self._to_sync.remove(group)

    def call(self, fn: Callable, timeout: float = 30.0):
        """Run ``fn()`` on the loop thread (it owns the poller and the raft port) and
        return its result; inline if the loop is not running."""
        if not self._thread.is_alive() or threading.current_thread() is self._thread:
            return fn()
        fut: Future = Future()
        self._calls.append((fn, fut))
        return fut.result(timeout)

    def _run_calls(self) -> None:
        while self._calls:
            fn, fut = self._calls.popleft()
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)
            for g in self.groups:       # whatever it changed is seen at once
                g.want_tick()

    def start(self) -> None:
        self._thread.start()
        for t in self._syncers:
            t.start()

    @property
    def running(self) -> bool:
        return self._running

    @property
    def stopped(self) -> bool:
        """The loop's thread has exited (``stop`` gives it 5 s): nothing ticks any more."""
        return not self._thread.is_alive()

    # -------------------------------------------------------------- syncs
    def request_sync(self, group: "LoopGroup") -> None:
        """Sync the group's journal soon, then wake the loop (loop thread); at once, on
        this thread, while the syncer is idle and syncs are quick (``INLINE_SYNC_S``):
        a disk that slows down moves the syncs back to the syncer."""
        # The queue before the count: a syncer counts itself before it takes a group
        # off the queue, so read in this order the two are never both seen empty
        # while a sync is under way.
        if max(self._sync_s, self._last_sync_s) < INLINE_SYNC_S and not self._to_sync \
                and not self._syncing and group.journal.unsynced_bytes <= INLINE_SYNC_BYTES \
                and threading.current_thread() is self._thread:
            self._sync(group)
            return
        with self._sync_wanted:
            if group not in self._to_sync:
                self._to_sync.append(group)
                self._sync_wanted.notify()

    def defer_ack(self, group: "LoopGroup", node, reset: bool, next_idx: int) -> None:
        """Send a follower's success reply once the entries it covers are durable (loop
        thread); its lease stamp alone if that takes over ``LEASE_ACK_AFTER``."""
        self._acks.append((group, node, reset, next_idx, group.journal.truncations, group.raftCurrentTerm,
                           time.monotonic() + LEASE_ACK_AFTER))
        if group.journal.durable_idx < next_idx - 1:
            self.request_sync(group)

    def _send_ready_acks(self, now: float | None = None) -> None:
        if not self._acks:
            return
        now = time.monotonic() if now is None else now
        waiting = []
        for ack in self._acks:
            g, node, reset, next_idx, truncations, term, lease_due = ack
            if g.journal.truncations != truncations or g.raftCurrentTerm != term:
                # The entries it covers were dropped, or a newer term began
                # (a leader of that term must not count it): replies are
                # cumulative, the next one covers what this one would have.
                continue
            if g.journal.durable_idx >= next_idx - 1:
                g.send_success(node, reset, next_idx, term)
                continue
            if lease_due is not None and now >= lease_due:
                g.send_lease_ack(node, term)         # the sync is slow: the stamp goes ahead
                ack = ack[:6] + (None,)
            waiting.append(ack)
        self._acks = waiting

    def _sync_journals(self) -> None:
        """A syncer thread: takes the first waiting group no other syncer is syncing
        (with several threads, a slow sync of one group holds up no other group)."""
        while self._running:
            with self._sync_wanted:
                group = self._next_to_sync()
                while group is None and self._running:
                    self._sync_wanted.wait(self.tick)
                    group = self._next_to_sync()
                if group is None:
                    continue
                self._syncing += 1       # before the pop: the loop thread never sees neither
                self._to_sync.remove(group)
                self._in_sync.add(group)
            try:
                self._sync(group)
            finally:
                with self._sync_wanted:
                    self._in_sync.discard(group)
                    self._syncing -= 1
                    if group in self._to_sync:   # asked again meanwhile: another syncer may take it
                        self._sync_wanted.notify()
            try:
                group.wake()
            except Exception:            # a full wake-up pipe: the loop is awake anyway
                pass

    def _next_to_sync(self) -> "LoopGroup | None":
        """The first group waiting for a sync that no syncer is syncing (``_sync_wanted`` held)."""
        for group in self._to_sync:
            if group not in self._in_sync:
                return group
        return None

    def _sync(self, group: "LoopGroup") -> None:
        t0 = time.perf_counter()
        try:
            group.journal.sync_behind()
        except OSError as e:
            fatal(f"group {group.group_id}: journal sync failed ({e})")
        except Exception as e:           # a syncer must not end quietly: acks would wait forever
            log.exception("group %s: journal sync raised", group.group_id)
            fatal(f"group {group.group_id}: journal sync raised {type(e).__name__}: {e}")
        self._last_sync_s = took = time.perf_counter() - t0
        self._sync_s += (took - self._sync_s) / 8

    # --------------------------------------------------------------- loop
    def _run(self) -> None:
        polled = time.monotonic()
        while self._running:
            self._run_calls()
            if self.hub is not None:
                try:
                    self.hub.tick()
                except Exception:
                    log.exception("raft loop: hub tick failed")
            late = time.monotonic() - polled
            if late > max(LATE, 2 * self.tick):
                self._held_up(late)
            now = time.monotonic()
            for g in self.groups:
                if g.tick_due(now, self.tick):
                    g.tick(0.0)
            ticked = time.monotonic()
            if ticked - now > WARN_LATE:
                self._ticks_held_up(ticked - now)
            wait, now = self.timer_period, time.monotonic()
            for g in self.groups:
                due = g.commit_notice_due
                if due is not None:
                    wait = min(wait, max(0.0, due - now))
            try:
                self._send_ready_acks()
                self.poller.poll(wait)
                polled = time.monotonic()
                self._send_ready_acks()
            except Exception:
                log.exception("raft loop: poll failed")
                time.sleep(self.tick)

    def _held_up(self, late: float) -> None:
        """The loop did not read its sockets for ``late`` seconds (a snapshot install
        fetching from peers, a stalled disk write, a starved CPU): read what arrived
        before any group ticks, so a leader counts the replies that wait in its
        sockets before its check-quorum judges its followers silent."""
        if late > WARN_LATE:
            log.warning("raft loop: held up for %.2f s; replies and heartbeats of every group of "
                        "this node waited as long", late)
        try:
            self.poller.poll(0)
        except Exception:
            log.exception("raft loop: poll failed")

    def _ticks_held_up(self, took: float) -> None:
        """The groups' ticks took ``took`` seconds: applying entries (a new queue's files,
        an eviction's syncs; issue 39.5) or a snapshot. No socket was read meanwhile,
        so every group's heartbeats waited as long (the next poll reads them before
        any group ticks again)."""
        log.warning("raft loop: the groups' ticks took %.2f s; replies and heartbeats of every "
                    "group of this node waited as long", took)

    def stop(self) -> None:
        self._running = False
        with self._sync_wanted:
            self._sync_wanted.notify_all()
        deadline = time.monotonic() + 5      # one wait for all: each syncer may be in a hung fdatasync
        for t in (self._thread, *self._syncers):
            if t.is_alive() and t is not threading.current_thread():
                t.join(timeout=max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Close the raft port (after ``stop`` and the groups' destroy)."""
        if self.hub is not None:
            self.hub.close()


def loop_poller(loop: RaftLoop) -> _LoopPoller:
    """The poller a group of ``loop`` is built with (pysyncobj's ``createPoller``)."""
    return _LoopPoller(loop.poller)
