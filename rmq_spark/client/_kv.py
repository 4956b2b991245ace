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

import queue as queue_mod
import threading
import zlib
from dataclasses import dataclass
from typing import Iterator

from storage_service.proto import rmq_pb2

__all__ = ["KvCalls", "KvEntry", "KvEvent"]

WATCH_WAIT_MS = 1000            # each queue's long poll while a watch waits for changes


@dataclass(frozen=True)
class KvEntry:
    key: bytes
    value: bytes | None          # None: a delete (only in a history)
    revision: int                # the offset of this message in ``queue``
    queue: int
    store_ts: int
    expires_ms: int = 0


@dataclass(frozen=True)
class KvEvent:
    """A watch's event: ``value`` None is a delete; ``snapshot`` marks the values a
    watch started with (before the changes)."""
    key: bytes
    value: bytes | None
    revision: int
    queue: int
    snapshot: bool = False


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

    # ------------------------------------------------------------------ watch
    def kv_watch(self, topic: str, prefix: bytes | str = b"", *, from_revision: int | None = None,
                 follower_ok: bool = False) -> Iterator[KvEvent]:
        """Changes to keys starting with ``prefix``, as they are committed, with no gaps.

        Without ``from_revision`` it starts with a snapshot (every live key, as
        events with ``snapshot=True``), then the changes after it; with it, every
        change at that revision or later, in every queue (a revision is an offset:
        ``OutOfRange`` names the oldest one kept where retention cut the log there).
        Per key, events come in revision order and none twice. A thread per queue
        long-polls its leader; closing the iterator (or leaving a ``for``) stops them.
        """
        prefix = _key(prefix)
        queues = self._kv_queues(topic)
        starts, snapshot = [], []
        for q in range(queues):
            if from_revision is None:
                entries, end = self._kv_snapshot(topic, q, prefix, follower_ok)
                snapshot += [KvEvent(e.key, e.value, e.revision, q, True) for e in entries]
                starts.append(end)
            else:
                starts.append(from_revision)
        events: queue_mod.Queue = queue_mod.Queue(10_000)
        stop = threading.Event()
        threads = [threading.Thread(target=self._kv_follow, args=(topic, q, starts[q], prefix, events, stop),
                                    name=f"kv-watch-{topic}-{q}", daemon=True) for q in range(queues)]
        last: dict[bytes, int] = {}
        try:
            for ev in sorted(snapshot, key=lambda e: e.key):
                last[ev.key] = ev.revision
                yield ev
            for t in threads:
                t.start()
            while True:
                ev = events.get()
                if isinstance(ev, BaseException):
                    raise ev
                if ev.revision <= last.get(ev.key, -1):
                    continue                 # the snapshot had it already (a later page's newer value)
                last[ev.key] = ev.revision
                yield ev
        finally:
            stop.set()

    def _kv_snapshot(self, topic: str, q: int, prefix: bytes, follower_ok: bool, page: int = 1000):
        """A queue's live keys with their values, and the log end the first page reflects
        (later pages may be newer: the watch's per-key revision check drops repeats)."""
        out, after, end = [], None, None
        while True:
            req = rmq_pb2.KvReadRequest(op=rmq_pb2.KvReadRequest.KEYS, prefix=prefix, queue=q, limit=page,
                                        values=True, topic=topic, allow_follower=follower_ok)
            if after is not None:
                req.after = after
            resp = self.call("KvRead", req, group=self.group_of(topic, q))
            end = resp.end if end is None else end
            out += [_entry(e) for e in resp.entries]
            if len(resp.entries) < page:
                return out, end
            after = resp.entries[-1].key

    def _kv_follow(self, topic: str, q: int, offset: int, prefix: bytes, events, stop) -> None:
        try:
            while not stop.is_set():
                res = self.fetch(topic, q, offset, wait_ms=WATCH_WAIT_MS)
                for r in res.records:
                    if r.key is not None and r.key.startswith(prefix):
                        events.put(KvEvent(r.key, r.value, r.offset, q))
                offset = max(offset, res.next_offset)
        except BaseException as e:     # noqa: BLE001 - handed to the watching thread
            if not stop.is_set():
                events.put(e)
