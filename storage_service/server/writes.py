"""A node's write path (``node.StorageNode``): a command proposed to a raft group this
node leads, and the wait for its commit; a produce through the group's committer
(group commit), refused at once when the node's disk is low or the group's backlog
is full, with its outcome (or OutOfOrder, or not-leader when the leadership is lost
while it waits: the outcome is then unknown, and a retry with the same producer id
and sequence stores it once).
"""
from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import Callable

import grpc

from ..metrics import NodeMetrics
from ..protocol.placement import META_GROUP, grpc_address
from ..raft.group import RaftGroup
from ..raft.groupcommit import MAX_ENTRY_ITEMS, CommitFailed
from ..statemachine.commands import MetaCommand, Produce, ProduceItem
from ..statemachine.data import OUT_OF_ORDER, queue_dir
from ..protocol.errors import Backlog, NodeFull, NotLeader, OutOfOrder, ServiceError

# Produce batches a group takes to commit later: 16 entries' worth (``MAX_ENTRY_ITEMS``).
# The byte limit (--max-commit-backlog) lets through tens of thousands of small batches,
# each to apply on the node's raft thread: more than it does within a client's attempt
# (5 s) when they create their queues, so the attempts timed out, came again and queued
# the same batches behind themselves (issue 39.5, one producer to 30,000 fresh queues).
MAX_BACKLOG_ITEMS = 16 * MAX_ENTRY_ITEMS

__all__ = ["NodeWrites", "produce_entry"]


# A waiting write looks at its group's leadership after 0.05 s, then at doubling intervals
# of at most 0.25 s. Every 0.05 s throughout, 48 producers' calls (~0.6 s each on 2 cores)
# woke ~1,000 times a second a node only to look (issue 39.3).
AWAIT_FIRST_S = 0.05
AWAIT_MAX_S = 0.25


def _settled(fut: Future, timeout: float) -> bool:
    try:
        fut.exception(timeout)
        return True
    except FutureTimeout:
        return False


class NodeWrites:
    """Mixed into ``StorageNode`` (its ``config``, ``groups``, ``committers``, ``disk``,
    ``metrics``, ``require_leader``, ``leader_of``, ``group_of``, ``now_ms``)."""

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
                       seq: int, in_order: bool = False, condition: tuple | None = None) -> tuple[int, Future]:
        """Hand a validated block to the group's committer; ``wait_produce`` gets the result.
        A group whose waiting batches reached ``max_commit_backlog`` bytes, or
        ``MAX_BACKLOG_ITEMS`` batches, refuses it (Backlog)."""
        g = self.group_of(cfg["name"], queue, cfg)
        raft = self.require_leader(g)
        if self.disk.low():
            raise NodeFull(self.disk.describe(self.config.address))
        short = raft.replicas_without_room()
        if short:
            self._require_room_on_a_majority(g, raft, short)
        committer = self.committers[g]
        waiting = committer.waiting_bytes()
        refusal = None
        if waiting + len(block) > self.config.max_commit_backlog and waiting:
            refusal = Backlog(g, waiting, self.config.max_commit_backlog)
        elif (batches := committer.waiting_items()) >= MAX_BACKLOG_ITEMS:
            refusal = Backlog(g, batches, MAX_BACKLOG_ITEMS, items=True)
        if refusal is not None:
            if self.metrics is not None:
                self.metrics.backlog_refusals.inc()
            raise refusal
        item = ProduceItem(queue_dir(cfg["name"], cfg["incarnation"], queue), producer, seq,
                           self.now_ms(), count, block, in_order and bool(producer), condition)
        fut = committer.submit(item, len(block))
        if self.metrics is not None:
            fut.add_done_callback(functools.partial(_count_produced, self.metrics, len(block)))
        return g, fut

    @staticmethod
    def _require_room_on_a_majority(g: int, raft: RaftGroup, short: dict) -> None:
        """NodeFull when the followers that said they are below their disk reserve
        leave fewer replicas than a majority to take a write: it could not commit,
        and would only wait in this leader's journal (and memory) for its timeout."""
        replicas = len(raft.peers) + 1
        if replicas - len(short) > replicas // 2:
            return
        said = "; ".join(f"node {grpc_address(a)}: {why}" for a, why in sorted(short.items()))
        raise NodeFull(f"group {g}: {len(short)} of its {replicas} replicas take no new entries, "
                       f"leaving no majority to commit a write ({said}); produce is refused "
                       "until space is freed there")

    def _await(self, raft: RaftGroup, wait: Callable[[float], bool]) -> bool:
        """``wait(t)`` in slices until it is True (done) or commit_timeout passes (False).

        Gives up early, raising NotLeader, when this node stops leading the
        group (pysyncobj steps a leader down when no majority answered it for
        an election timeout): the entry may still commit under the next
        leader, so the caller is told the outcome is unknown.
        """
        deadline = time.monotonic() + self.config.commit_timeout
        slice_ = AWAIT_FIRST_S
        while True:
            left = deadline - time.monotonic()
            if wait(max(0.0, min(left, slice_))):
                return True
            slice_ = min(slice_ * 2, AWAIT_MAX_S)
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
            return self.produce_result(g, fut.result(0))
        except FutureTimeout:
            raise ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"group {g}: produce not committed within {self.config.commit_timeout}s "
                               "(outcome unknown; retry with the same producer id and sequence)") from None
        except CommitFailed as e:
            raise NotLeader(g, self.leader_of(g)) from e

    @staticmethod
    def produce_result(g: int, res: tuple) -> tuple:
        """An applied batch's result (base, count, store ts, duplicate); OutOfOrder for
        an in-order batch refused in apply."""
        if res and res[0] == OUT_OF_ORDER:
            _, expected, producer, seq = res
            raise OutOfOrder(g, producer, seq, expected)
        return res


def _count_produced(metrics: NodeMetrics, nbytes: int, fut: Future) -> None:
    if not fut.cancelled() and fut.exception() is None:
        res = fut.result()
        if isinstance(res[0], str):          # refused at apply (out of order, a key-value conflict)
            return
        _, count, _, duplicate = res
        if not duplicate:
            metrics.produced(count, nbytes)


def produce_entry(items: list[ProduceItem]) -> tuple:
    """The raft entry of produce items drained together (group commit)."""
    return Produce(tuple(items)).encode()
