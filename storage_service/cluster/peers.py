"""Catch-up from peers: a queue's committed batches, fetched from another replica.

A data group's raft snapshot is a segment manifest, not the payloads; a
replica installing one fetches the batches it lacks from the group's other
replicas (``ReplicaFetch``).
"""
from __future__ import annotations

import logging
import queue
import time
from typing import Callable, Sequence

import grpc

from ..proto import rmq_pb2

__all__ = ["PEER_FETCH_S", "PEER_HEDGE_S", "ask_group", "fetch_range"]

log = logging.getLogger(__name__)

# The whole wait, and how long the leader alone is asked before the other
# replicas are asked too.
PEER_FETCH_S = 30.0
PEER_HEDGE_S = 0.5


def fetch_range(stub: Callable, qname: str, start: int, end: int, peers: Sequence[str],
                leader: str | None) -> bytes:
    """Committed batches [start, end) of queue ``qname`` from any of ``peers`` (gRPC
    addresses; ``stub(address)`` gives a MessageLogStub).

    Runs on the raft thread (a snapshot install), so it must not wait on a
    peer that cannot answer (cut off, paused): while it waits, none of the
    node's groups ticks, and the peers count this node as gone. The group's
    leader is asked first; if it has not answered within ``PEER_HEDGE_S`` the
    other peers are asked too, and the first non-empty answer wins.
    """
    peers = sorted(peers, key=lambda a: a != leader)
    req = rmq_pb2.ReplicaFetchRequest(queue_dir=qname, offset=start, end_offset=end, max_bytes=8 << 20)
    answers: queue.Queue = queue.Queue()
    asked: list = []

    def ask(addresses) -> None:
        for addr in addresses:
            fut = stub(addr).ReplicaFetch.future(req, timeout=PEER_FETCH_S)
            fut.add_done_callback(answers.put)
            asked.append(fut)

    deadline = time.monotonic() + PEER_FETCH_S
    ask(peers[:1])
    answered, last_error = 0, None
    while answered < len(asked):
        hedged = len(asked) == len(peers)
        try:
            fut = answers.get(timeout=max(0.0, deadline - time.monotonic()) if hedged else PEER_HEDGE_S)
        except queue.Empty:
            if hedged:
                break
            ask(peers[len(asked):])                    # the leader is slow: ask the rest too
            continue
        answered += 1
        try:
            batches = fut.result().batches
        except grpc.RpcError as e:
            last_error, batches = e, b""
        if batches:
            for other in asked:
                other.cancel()
            return batches
        ask(peers[len(asked):])                        # no luck there: ask the rest now
    for fut in asked:
        fut.cancel()
    log.warning("catch-up of %s [%d, %d): no peer could serve it (%s)", qname, start, end, last_error)
    return b""


def ask_group(stub: Callable, replicas: Sequence[str], method: str, request, timeout: float = 3.0):
    """(response, address) of ``method(request)`` answered by the leader of a group this node does not host:
    its replicas are asked in turn, and a not-leader answer naming the leader is
    followed. Raises NotLeader (retriable) if none answers within ``timeout``."""
    from ..protocol.errors import LEADER_METADATA_KEY
    from ..protocol.errors import NotLeader

    deadline = time.monotonic() + timeout
    order, tried, last = list(replicas), [], None
    while order and time.monotonic() < deadline:
        addr = order.pop(0)
        tried.append(addr)
        try:
            return getattr(stub(addr), method)(request, timeout=max(0.05, deadline - time.monotonic())), addr
        except grpc.RpcError as e:
            last = e
            hint = dict(e.trailing_metadata() or ()).get(LEADER_METADATA_KEY)
            if hint and hint not in tried:
                order.insert(0, hint)
            elif not order and e.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline:
                time.sleep(0.05)            # an election: ask round again
                order, tried = list(replicas), []
    raise NotLeader(getattr(request, "group", 0), None,
                    f"no replica of the group answered {method} here ({last.details() if last else 'none'})")
