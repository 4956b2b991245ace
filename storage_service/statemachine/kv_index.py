"""A data group's key index: key -> revision for its compact topics' queues (issue 40, RIP-22).

Key-value state is read off the log. A key always lands in the same queue
(``crc32(key) % queues``); its *revision* is the offset of the last message
with that key in that queue, its value that message's value, and a null value
(a tombstone) deletes it. So the state is a function of the queue's log, and
every replica, holding the same log, decides a compare-and-set the same way.
Revisions of a key only grow (offsets do), and a revision names one message:
``get`` at a revision reads it.

The index is derived data, kept on disk in SQLite (Python's own ``sqlite3``:
a B-tree file that needs no server and no new dependency; WAL with
``synchronous=NORMAL``: a commit is not synced, and a crash may lose the last
ones but never leaves the file inconsistent). ``queues.next`` says up to
which offset a queue's log is indexed, and ``catch_up``, before every
key-value decision or read of the queue, brings its rows in line with the
log: behind (appends since, or index commits lost with the page cache), it
reads the log from ``next``; ahead (log pages lost instead) or cut by
retention, it drops the queue's rows and reads its whole log again. A file
that cannot be opened is rebuilt the same way, queue by queue, when used.

Tables: ``keys`` (the latest revision per key, live or deleted, and when a
TTL makes it expire), ``revs`` (every revision still in the log: a key's
history) and ``queues``.

Rows indexed since the last write to SQLite wait in memory (at most
``FLUSH_ROWS``): a compare-and-set is decided on every replica right after
the append before it, and one SQLite transaction per decision (three
B-tree pages written to the WAL) cost more than the rest of the decision.
``state`` reads them first; every other read, and ``close``, writes them
first, and so does the node's segment-sync thread once they have waited
``FLUSH_SECONDS`` (``flush_held``). They are derived like the rest: lost in
a crash, they are read from the log again (``queues.next`` only moves with
them). The bound on their age matters: compaction leaves the index alone,
and a tombstone past its topic's ``delete_retention_ms`` may leave the log;
an index that lost its row (and read the log again after it was gone)
would take the key for live. SQLite's own unsynced commits carry the same
risk for a power loss, within the kernel's writeback delay.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Iterator

__all__ = ["FLUSH_ROWS", "KeyState", "KvIndex", "prefix_end"]

log = logging.getLogger(__name__)
FLUSH_ROWS = 1024           # rows held in memory before they are written to SQLite
FLUSH_SECONDS = 1.0         # ... or for this long (``flush_held``, from the node's segment-sync thread)
LOG_ROWS = 1000             # a catch-up reading at least this many messages is logged

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queues (q TEXT PRIMARY KEY, next INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS keys (q TEXT NOT NULL, key BLOB NOT NULL, rev INTEGER NOT NULL,
    dead INTEGER NOT NULL, expires INTEGER NOT NULL, PRIMARY KEY (q, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS revs (q TEXT NOT NULL, key BLOB NOT NULL, rev INTEGER NOT NULL,
    dead INTEGER NOT NULL, PRIMARY KEY (q, key, rev)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS expiring ON keys (expires) WHERE expires > 0 AND dead = 0;
"""


@dataclass(frozen=True)
class KeyState:
    """A key's latest message: its revision, whether it is a delete, and its expiry
    (ms since the epoch, 0: none)."""
    revision: int
    deleted: bool
    expires_ms: int

    def live(self, now_ms: int) -> bool:
        return not self.deleted and not (self.expires_ms and self.expires_ms <= now_ms)


def prefix_end(prefix: bytes) -> bytes | None:
    """The first key after every key starting with ``prefix`` (None: no end)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


class KvIndex:
    """The key index of one data group (module doc). Written by apply (one thread);
    read by request threads: SQLite serialises them on one connection."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.RLock()
        self.lock = self._lock              # held across calls that must see one state
        self._db = self._connect()
        self._earliest: dict[str, int] = {}   # each queue's start when its rows were last cut to it
        self._ends: dict[str, int] = {}       # each queue's log end its rows were last brought to
        self._next: dict[str, int] = {}       # where each queue's rows end, SQLite's and memory's (a cache)
        # queue -> [{key: (rev, dead, expires)}, [(rev, key, dead)], next]: rows not in SQLite yet
        self._unflushed: dict[str, list] = {}
        self._unflushed_rows = 0              # how many (revs)
        self._held_since: float | None = None   # monotonic time the oldest held row came

    def _connect(self) -> sqlite3.Connection:
        for attempt in (0, 1):
            try:
                db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(_SCHEMA)
                db.execute("SELECT count(*) FROM queues").fetchone()
                return db
            except sqlite3.DatabaseError as e:
                if attempt:
                    raise
                log.warning("key index %s unreadable (%s): rebuilding it from the log", self.path, e)
                for suffix in ("", "-wal", "-shm"):
                    try:
                        os.unlink(self.path + suffix)
                    except FileNotFoundError:
                        pass
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ writes
    def record(self, q: str, rows: Iterable[tuple[int, bytes, bool, int]], next_offset: int) -> None:
        """Index an append to queue ``q``: ``(offset, key, deleted, expires_ms)`` per keyed
        message, the log now ending at ``next_offset`` (held in memory: module doc)."""
        with self._lock:
            held = self._unflushed.setdefault(q, [{}, [], 0])
            if self._held_since is None:
                self._held_since = time.monotonic()
            for off, key, dead, expires in rows:
                had = held[0].get(key)
                if had is None or off > had[0]:
                    held[0][key] = (off, dead, expires)
                held[1].append((off, key, dead))
                self._unflushed_rows += 1
                if self._unflushed_rows >= FLUSH_ROWS:      # (a whole log indexed again: in pieces)
                    held[2] = off + 1                        # indexed up to here
                    self.flush()
                    held = self._unflushed.setdefault(q, [{}, [], 0])
            held[2] = next_offset
            self._next[q] = next_offset

    def flush_held(self, older_than: float | None = None) -> None:
        """``flush`` if the oldest row held has waited ``older_than`` (``FLUSH_SECONDS``) seconds."""
        wait = FLUSH_SECONDS if older_than is None else older_than
        with self._lock:
            if self._held_since is not None and time.monotonic() - self._held_since >= wait:
                self.flush()

    def flush(self) -> None:
        """Write the rows held in memory to SQLite, in one transaction. If that fails
        they are dropped (with the offsets they reached: read from the log again at
        the next use), so a failing disk does not pile them up, and the error raised."""
        with self._lock:
            if not self._unflushed:
                self._held_since = None
                return
            db = self._db
            db.execute("BEGIN")
            try:
                for q, (latest, revs, next_offset) in self._unflushed.items():
                    db.executemany(
                        "INSERT INTO keys (q, key, rev, dead, expires) VALUES (?, ?, ?, ?, ?) "
                        "ON CONFLICT (q, key) DO UPDATE SET rev = excluded.rev, dead = excluded.dead, "
                        "expires = excluded.expires WHERE excluded.rev > keys.rev",
                        [(q, key, off, int(dead), expires) for key, (off, dead, expires) in latest.items()])
                    db.executemany("INSERT OR IGNORE INTO revs (q, key, rev, dead) VALUES (?, ?, ?, ?)",
                                   [(q, key, off, int(dead)) for off, key, dead in revs])
                    db.execute("INSERT INTO queues (q, next) VALUES (?, ?) ON CONFLICT (q) DO UPDATE "
                               "SET next = excluded.next", (q, next_offset))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:        # (SQLite may have rolled back already: disk full, I/O)
                    db.execute("ROLLBACK")
                for q in self._unflushed:
                    self._next.pop(q, None)
                    self._ends.pop(q, None)
                raise
            finally:
                self._unflushed.clear()
                self._unflushed_rows = 0
                self._held_since = None

    def indexed_to(self, q: str) -> int | None:
        with self._lock:
            if q in self._next:
                return self._next[q]
            row = self._db.execute("SELECT next FROM queues WHERE q = ?", (q,)).fetchone()
            if row is not None:
                self._next[q] = row[0]
        return None if row is None else row[0]

    def catch_up(self, q: str, earliest: int, next_offset: int,
                 scan: "callable[[int], Iterator[tuple[int, bytes, bool, int]]]") -> int:
        """Bring ``q``'s rows in line with its log ``[earliest, next_offset)``; ``scan(start)``
        yields its keyed messages from ``start``. Returns how many messages were read."""
        with self._lock:
            if self._ends.get(q) == next_offset and self._earliest.get(q) == earliest:
                return 0                  # nothing appended or cut since (no query per get)
            at = self.indexed_to(q)
            if at is not None and self._earliest.get(q) != earliest:
                self.drop_revisions_below(q, earliest)     # retention cut it meanwhile (closed, or a peer's)
                self._earliest[q] = earliest
            if at == next_offset:
                self._ends[q] = next_offset
                return 0
            if at is None or at > next_offset or at < earliest:
                self.forget(q)
                at = earliest
                self._earliest[q] = earliest
            rows = list(scan(at))
            self.record(q, rows, next_offset)
            self._ends[q] = next_offset
            if len(rows) >= LOG_ROWS or (rows and at == earliest):
                log.info("key index: queue %s indexed from offset %d (%d keyed messages)", q, at, len(rows))
            return len(rows)

    def extend(self, q: str, earliest: int, start: int,
               rows: "callable[[], Iterable[tuple[int, bytes, bool, int]]]", next_offset: int) -> bool:
        """Index an append of ``[start, next_offset)`` from its rows in hand (``rows()``,
        called only then), if the rows already reach exactly ``start`` of this log
        (``catch_up`` brought them there or an ``extend`` did): what ``catch_up`` would
        read back from the log. False (nothing done) otherwise: the next use catches up
        from the log."""
        with self._lock:
            if self._ends.get(q) != start or self._earliest.get(q) != earliest:
                return False
            self.record(q, rows(), next_offset)
            self._ends[q] = next_offset
            return True

    def forget(self, q: str) -> None:
        """Drop a queue's rows (a dropped queue, or one to index again)."""
        with self._lock:
            held = self._unflushed.pop(q, None)
            if held is not None:
                self._unflushed_rows -= len(held[1])
            self._next.pop(q, None)
            db = self._db
            db.execute("BEGIN")
            try:
                for table in ("keys", "revs", "queues"):
                    db.execute(f"DELETE FROM {table} WHERE q = ?", (q,))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            finally:
                self._ends.pop(q, None)

    def drop_revisions_below(self, q: str, earliest: int) -> None:
        """Retention moved the queue's start: revisions below it are gone from the log."""
        with self._lock:
            self.flush()
            self._db.execute("DELETE FROM revs WHERE q = ? AND rev < ?", (q, earliest))
            self._db.execute("DELETE FROM keys WHERE q = ? AND rev < ?", (q, earliest))

    # ------------------------------------------------------------- reads
    def state(self, q: str, key: bytes) -> KeyState | None:
        with self._lock:
            held = self._unflushed.get(q)
            if held is not None and key in held[0]:
                rev, dead, expires = held[0][key]
                return KeyState(rev, bool(dead), expires)
            row = self._db.execute("SELECT rev, dead, expires FROM keys WHERE q = ? AND key = ?",
                                   (q, key)).fetchone()
        return None if row is None else KeyState(row[0], bool(row[1]), row[2])

    def history(self, q: str, key: bytes, limit: int = 1000) -> list[tuple[int, bool]]:
        """(revision, deleted) of the key's revisions still in the log, oldest first."""
        with self._lock:
            self.flush()
            return [(r, bool(d)) for r, d in self._db.execute(
                "SELECT rev, dead FROM revs WHERE q = ? AND key = ? ORDER BY rev LIMIT ?", (q, key, limit))]

    def oldest_revision(self, q: str, key: bytes) -> int | None:
        with self._lock:
            self.flush()
            row = self._db.execute("SELECT min(rev) FROM revs WHERE q = ? AND key = ?", (q, key)).fetchone()
        return row[0]

    def keys(self, q: str, prefix: bytes = b"", after: bytes | None = None, limit: int = 1000,
             now_ms: int = 0) -> list[tuple[bytes, int]]:
        """(key, revision) of live keys of ``q`` starting with ``prefix``, in key order,
        after ``after`` (paging)."""
        low = max(prefix, after + b"\x00") if after is not None else prefix
        end = prefix_end(prefix)
        sql = "SELECT key, rev FROM keys WHERE q = ? AND key >= ? AND dead = 0 AND (expires = 0 OR expires > ?)"
        args: list = [q, low, now_ms]
        if end is not None:
            sql += " AND key < ?"
            args.append(end)
        sql += " ORDER BY key LIMIT ?"
        args.append(limit)
        with self._lock:
            self.flush()
            return [(bytes(k), r) for k, r in self._db.execute(sql, args)]

    def expired(self, now_ms: int, limit: int = 1000) -> list[tuple[str, bytes, int]]:
        """(queue, key, revision) of live keys whose TTL ran out by ``now_ms``."""
        with self._lock:
            self.flush()
            return [(q, bytes(k), r) for q, k, r in self._db.execute(
                "SELECT q, key, rev FROM keys WHERE expires > 0 AND dead = 0 AND expires <= ? LIMIT ?",
                (now_ms, limit))]

    def close(self) -> None:
        with self._lock:
            try:
                self.flush()
            except sqlite3.Error as e:           # (read from the log again at the next start)
                log.warning("key index %s: rows not written at close (%s)", self.path, e)
            self._db.close()
