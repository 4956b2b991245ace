"""A ``Client``'s key-value calls on compact topics (issue 40, RIP-22).

A key lives in queue ``crc32(key) % queues``; its *revision* is the offset of
its latest message there, so revisions of a key only grow. Writes are decided
in the queue's raft group (``storage_service/statemachine/kv.py``): a
condition (``if_revision``, ``if_absent``) that fails raises ``KvConflict``
with the key's current revision, and nothing is stored. A write retried after a
lost answer keeps its producer id and sequence, so it is stored once. Reads go
to the queue's leader (linearizable); ``follower_ok=True`` reads any replica's
applied state instead, which may be behind the leader by what it has not
applied yet (a few milliseconds under load; more across a partition).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

from storage_service.proto import rmq_pb2

__all__ = ["KvCalls", "KvEntry"]


@dataclass(frozen=True)
class KvEntry:
    key: bytes
    value: bytes | None          # None: a delete (only in a history)
    revision: int                # the offset of this message in ``queue``
    queue: int
    store_ts: int
    expires_ms: int = 0


def _key(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else bytes(key)


def _entry(e: rmq_pb2.KvEntry) -> KvEntry:
    return KvEntry(e.key, None if e.deleted else e.value, e.revision, e.queue, e.store_timestamp, e.expires_ms)


class KvCalls:
    """Mixed into ``Client`` (its ``call``, ``group_of``, ``describe_topic``, ``_next_sequence``)."""

    def _kv_queue(self, topic: str, key: bytes) -> tuple[int, int]:
        queues = self._kv_queues(topic)
        q = zlib.crc32(key) % queues
        return q, self.group_of(topic, q)

    def _kv_queues(self, topic: str) -> int:
        placed = self._placement.get(topic)
        if placed is None:
            self.describe_topic(topic)
            placed = self._placement[topic]
        return placed[0]

    def _kv_write(self, topic: str, key: bytes, value: bytes | None, if_revision: int | None,
                  if_absent: bool, timeout: float | None, ttl_ms: int = 0) -> int:
        key = _key(key)
        q, group = self._kv_queue(topic, key)
        # The thread's producer id and the queue's next sequence (a thread waits for each
        # write, so they reach the node in order); a retry of this call keeps both.
        pid, seq = self._next_sequence(topic, q, 1)
        req = rmq_pb2.KvPutRequest(topic=topic, key=key, value=value or b"", delete=value is None,
                                   if_absent=if_absent, producer_id=pid, sequence=seq, ttl_ms=ttl_ms)
        if if_revision is not None:
            req.if_revision = if_revision
        return self.call("KvPut", req, group=group, timeout=timeout).revision

    def kv_put(self, topic: str, key: bytes | str, value: bytes, *, if_revision: int | None = None,
               if_absent: bool = False, ttl_ms: int = 0, timeout: float | None = None) -> int:
        """Set ``key`` to ``value``; returns its new revision. ``if_revision``: only if the
        key's live value is at that revision; ``if_absent``: only if it has none
        (else ``KvConflict``). ``ttl_ms``: the value expires that long after the leader
        took it (it reads as absent, then the leader commits its delete)."""
        if value is None:
            raise ValueError("value is None: use kv_delete to delete a key")
        return self._kv_write(topic, key, bytes(value), if_revision, if_absent, timeout, ttl_ms)

    def kv_delete(self, topic: str, key: bytes | str, *, if_revision: int | None = None,
                  timeout: float | None = None) -> int:
        """Delete ``key`` (a tombstone); returns the delete's revision."""
        return self._kv_write(topic, key, None, if_revision, False, timeout)

    def _kv_read(self, topic: str, req: rmq_pb2.KvReadRequest, queue: int, follower_ok: bool):
        req.topic, req.allow_follower = topic, follower_ok
        return self.call("KvRead", req, group=self.group_of(topic, queue)).entries

    def kv_get(self, topic: str, key: bytes | str, *, revision: int | None = None,
               follower_ok: bool = False) -> KvEntry | None:
        """The key's live value (``.value``, ``.revision``), or None; with ``revision``, the
        value it had then (``OutOfRange`` naming the oldest revision kept when that one
        is gone)."""
        key = _key(key)
        q, _ = self._kv_queue(topic, key)
        req = rmq_pb2.KvReadRequest(op=rmq_pb2.KvReadRequest.GET, key=key)
        if revision is not None:
            req.revision = revision
        entries = self._kv_read(topic, req, q, follower_ok)
        return _entry(entries[0]) if entries else None

    def kv_history(self, topic: str, key: bytes | str, *, limit: int = 1000,
                   follower_ok: bool = False) -> list[KvEntry]:
        """The key's revisions still in the log, oldest first (a delete's value is None)."""
        key = _key(key)
        q, _ = self._kv_queue(topic, key)
        req = rmq_pb2.KvReadRequest(op=rmq_pb2.KvReadRequest.HISTORY, key=key, limit=limit)
        return [_entry(e) for e in self._kv_read(topic, req, q, follower_ok)]

    def kv_keys(self, topic: str, prefix: bytes | str = b"", *, page: int = 1000,
                follower_ok: bool = False) -> list[tuple[bytes, int]]:
        """(key, revision) of every live key starting with ``prefix``, in key order
        (each queue is listed by its leader, ``page`` keys per call)."""
        prefix = _key(prefix)
        out = []
        for q in range(self._kv_queues(topic)):
            after = None
            while True:
                req = rmq_pb2.KvReadRequest(op=rmq_pb2.KvReadRequest.KEYS, prefix=prefix, queue=q, limit=page)
                if after is not None:
                    req.after = after
                got = [(e.key, e.revision) for e in self._kv_read(topic, req, q, follower_ok)]
                out += got
                if len(got) < page:
                    break
                after = got[-1][0]
        return sorted(out)
