"""Key-value semantics on a data group's compact queues (issue 40, RIP-22).

A put is a produce of one keyed message to the key's queue; a delete, of a
tombstone (a null value). A *revision* is the offset that message got: it only
grows for a key (a key always lands in the same queue), and it names the
message, so a get at a revision reads it back. A condition travels with the
produce item (``ProduceItem.condition``) and is decided at apply, against the
queue's key index brought up to the log's end (``kv_index.KvIndex``): every
replica decides from the same log, so all decide alike.

* ``("absent",)``: stored only if the key has no live value;
* ``("revision", N)``: stored only if the key's live value is at revision N;
* ``("expired", N)``: the leader's delete of a value whose TTL ran out, stored
  only if the key's latest message is still that put at revision N.

A value put with a TTL carries its expiry (``EXPIRES_PROPERTY``, ms since the
epoch, from the leader's clock at the produce). Past it the key reads as absent
and a condition sees it absent; the leader then commits a delete conditioned on
that revision (``expired``), so every replica's state says so too. Apply judges
expiry by the entry's store time, never by a replica's own clock.
"""
from __future__ import annotations

import collections
import os
import threading
from dataclasses import dataclass
from typing import Iterator

from ..log.durability import Damaged
from ..log.queue_log import QueueLog
from ..protocol import framing, records
from .kv_index import KeyState, KvIndex

__all__ = ["EXPIRES_PROPERTY", "KV_CONFLICT", "KvEntry", "KvStore", "keyed_rows"]

EXPIRES_PROPERTY = "rmq.kv.expires"
KV_CONFLICT = "kv_conflict"        # a produce result: (KV_CONFLICT, current revision or -1)
_READ_BYTES = 1 << 20
# Entries a group's store keeps after reading them (keys and values, plus an
# estimate of the objects around them): a get of a hot key reads no segment.
VALUE_CACHE_BYTES = 8 << 20
APPENDED_ROWS = 16        # batches of at most this many messages are indexed as they are applied
_ENTRY_OVERHEAD = 200


@dataclass(frozen=True)
class KvEntry:
    key: bytes
    value: bytes | None            # None: a delete (history only)
    revision: int
    store_ts: int
    expires_ms: int = 0


def _expires(props: dict) -> int:
    try:
        return int(props.get(EXPIRES_PROPERTY, 0))
    except ValueError:
        return 0


def _rows(block, count: int) -> list:
    """``records.iter_rows`` of an applied block of few messages; one message (a
    key-value write) read with ``struct`` alone: ``parse``'s numpy calls cost more."""
    if count == 1:
        row = records.row_at(block, 1, records.last_delta(block, 1))
        return [] if row is None else [row]
    return list(records.iter_rows(records.parse(block, count, check=False)))


def keyed_rows(q: QueueLog, start: int, end: int) -> Iterator[tuple[int, bytes, bool, int]]:
    """(offset, key, deleted, expires_ms) of every keyed message of ``q`` in [start, end)."""
    at = max(start, q.earliest)
    while at < end:
        data = q.read(at, _READ_BYTES)
        if not data:
            return
        nxt = at
        for h, cols in framing.iter_blocks(data, deep_check=False):
            nxt = max(nxt, h.last_offset + 1)
            if h.last_offset < at:
                continue
            for delta, key, value, _tags, props, _born in records.iter_rows(cols):
                off = h.base_offset + delta
                if at <= off < end and key is not None:
                    yield off, key, value is None, _expires(props)
        if nxt <= at:
            return
        at = nxt


class _Recent:
    """Entries read lately, by (queue, revision), least recently used dropped first.

    A revision names one message for good: offsets are never reused within a
    queue's incarnation (the queue's name carries it), and a replica's log holds
    committed entries only, which a repair or a snapshot replaces with the same
    ones. So an entry kept here never goes stale; only retention removes it from
    the log, and ``read`` checks the queue's bounds before it looks here.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def _size(e: KvEntry) -> int:
        return len(e.key) + len(e.value or b"") + _ENTRY_OVERHEAD

    def get(self, name: str, revision: int) -> KvEntry | None:
        with self._lock:
            e = self._entries.get((name, revision))
            if e is not None:
                self._entries.move_to_end((name, revision))
            return e

    def put(self, name: str, e: KvEntry) -> None:
        size = self._size(e)
        if size > self.max_bytes // 8:
            return                              # a big value would push out many small ones
        with self._lock:
            if (name, e.revision) in self._entries:
                return
            self._entries[(name, e.revision)] = e
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self._bytes -= self._size(old)

    def drop(self, name: str) -> None:
        with self._lock:
            for k in [k for k in self._entries if k[0] == name]:
                self._bytes -= self._size(self._entries.pop(k))


class KvStore:
    """The key-value view of one data group's queues (module doc)."""

    def __init__(self, root: str, queue, on_damaged=None):
        """``queue(name)``: the group's QueueLog of that name, or None. ``on_damaged(name)``:
        called when the queue's copy fails its check while being indexed (repair it)."""
        self.index = KvIndex(os.path.join(root, "kv-index.sqlite3"))
        self._queue = queue
        self._on_damaged = on_damaged
        self._recent = _Recent(VALUE_CACHE_BYTES)

    def _current(self, name: str, q: QueueLog) -> None:
        """Index ``name`` up to its log's end. The log's bounds are read under the index
        lock: read before it, an end another thread indexed past meanwhile would look
        like an index ahead of its log, and the queue would be read again from the start."""
        with self.index.lock:
            end = q.next_offset
            try:
                self.index.catch_up(name, q.earliest, end, lambda start: keyed_rows(q, start, end))
            except framing.CorruptBatch as e:
                # Deciding on what the index would miss could make this replica
                # disagree with the others: nothing is decided until the copy is whole.
                self._damaged(name, e)

    def _damaged(self, name: str, err: framing.CorruptBatch):
        if self._on_damaged is not None:
            self._on_damaged(name)
        raise Damaged(name, str(err)) from err

    # ------------------------------------------------------------ apply
    def decide(self, name: str, q: QueueLog, condition: tuple, block: bytes, count: int,
               ts: int) -> tuple | None:
        """None if a conditional write may be stored at store time ``ts``, else
        ``(KV_CONFLICT, current revision or -1)``."""
        key = _rows(block, count)[0][1]
        self._current(name, q)
        st = self.index.state(name, key) if key is not None else None
        live = st is not None and st.live(ts)
        if condition[0] == "expired":        # the leader's delete of a value whose TTL ran out
            ok = st is not None and not st.deleted and st.revision == condition[1]
        elif condition[0] == "absent":
            ok = not live
        else:
            ok = live and st.revision == condition[1]
        return None if ok else (KV_CONFLICT, st.revision if live else -1)

    def appended(self, name: str, q: QueueLog, base: int, count: int, block: bytes) -> None:
        """A batch was appended to ``name`` at ``base`` (apply): its keyed rows go to the
        index from the block in hand when the index is current to ``base``, so the next
        condition or get reads no log. Small batches only (a key-value write is one
        message): a big producer batch to a compact topic is indexed when next used."""
        if count > APPENDED_ROWS:
            return
        self.index.extend(name, q.earliest, base, lambda: [
            (base + delta, key, value is None, _expires(props))
            for delta, key, value, _tags, props, _born in _rows(block, count) if key is not None], base + count)

    # ------------------------------------------------------------- reads
    def state(self, name: str, key: bytes) -> KeyState | None:
        q = self._queue(name)
        if q is None:
            return None
        self._current(name, q)
        return self.index.state(name, key)

    def read(self, name: str, revision: int) -> KvEntry | None:
        """The message at ``revision`` (an offset) of queue ``name``, if it is still there."""
        q = self._queue(name)
        if q is None or revision < q.earliest or revision >= q.next_offset:
            return None
        e = self._recent.get(name, revision)
        if e is None:
            e = self._read(name, q, revision)
            if e is not None:
                self._recent.put(name, e)
        return e

    def _read(self, name: str, q: QueueLog, revision: int) -> KvEntry | None:
        # The one batch holding the revision (max_bytes 1: not a megabyte parsed per get),
        # found by its neighbours' headers when that is sure, else read batch by batch.
        try:
            batch = q.batch_holding(revision)
            if batch is not None:                  # CRC-checked: one row read with struct
                h = framing.header_at(batch, 0)
                try:
                    row = records.row_at(framing.records_of(batch, h), h.count, revision - h.base_offset)
                except ValueError:
                    pass                           # sections that do not add up: the careful parse says why
                else:
                    if row is None or row[1] is None:
                        return None
                    return KvEntry(row[1], row[2], revision, h.store_ts, _expires(row[4]))
            for off, ts, key, value, _tags, props, _born in framing.iter_records_from(q.read(revision, 1),
                                                                                     revision):
                if off != revision or key is None:
                    return None
                return KvEntry(key, value, off, ts, _expires(props))
        except framing.CorruptBatch as e:
            self._damaged(name, e)
        return None

    def get(self, name: str, key: bytes, now_ms: int, revision: int | None = None) -> KvEntry | None:
        """The key's live value (or its value at ``revision``, which must be one of its
        revisions still in the log: ``KeyError`` naming the oldest kept otherwise)."""
        if revision is None:
            st = self.state(name, key)
            if st is None or not st.live(now_ms):
                return None
            return self.read(name, st.revision)
        e = self.read(name, revision)
        if e is None or e.key != key:
            self.state(name, key)
            oldest = self.index.oldest_revision(name, key)
            raise KeyError(f"revision {revision} of key {key!r} is not in the log (compacted, cut by retention "
                           f"or never one of its revisions); the oldest revision kept is "
                           f"{'none' if oldest is None else oldest}")
        return e

    def history(self, name: str, key: bytes, limit: int = 1000) -> list[KvEntry]:
        self.state(name, key)
        out = []
        for rev, _dead in self.index.history(name, key, limit):
            e = self.read(name, rev)
            if e is not None:
                out.append(e)
        return out

    def keys(self, name: str, prefix: bytes, after: bytes | None, limit: int,
             now_ms: int) -> tuple[list[tuple[bytes, int]], int]:
        """Live keys (``KvIndex.keys``) and the log end they reflect."""
        q = self._queue(name)
        if q is None:
            return [], 0
        with self.index.lock:
            self._current(name, q)
            return self.index.keys(name, prefix, after, limit, now_ms), self.index.indexed_to(name) or 0

    # ----------------------------------------------------- log changes
    def dropped(self, name: str) -> None:
        self.index.forget(name)
        self._recent.drop(name)

    def truncated(self, name: str, earliest: int) -> None:
        self.index.drop_revisions_below(name, earliest)

    def close(self) -> None:
        self.index.close()
