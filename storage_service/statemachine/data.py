"""The replicated state machine of one data raft group (no network here).

Every committed raft entry of a data group is a command (``commands.py``:
``Produce``, ``Truncate``, ``Drop``) applied by ``DataState.apply``; the results go back to the waiting produce calls. The
state is the set of queue logs on disk plus the producer-dedupe table.

Apply is idempotent per queue: each batch carries its apply position (raft
index and item number within the entry), so entries replayed from the journal after a restart (or after a snapshot
older than the segment files) are recognised and skipped, while the dedupe
table is still rebuilt from them.

The snapshot (``manifest``) lists queues with their earliest/next offsets and
the dedupe table - never message payloads. A replica installing a manifest
fetches the batches it misses from a peer (``fetch_range`` callback).
"""
from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import threading
from typing import Callable

from ..log.durability import HAS_SYNCFS, DirSyncs, fatal, syncfs
from ..log.handles import OpenFiles
from ..log.queue_log import QueueLog
from ..log.tally import ByteCount, Unsynced
from .queue_logs import QueueLogs
from ..protocol import framing
from .commands import Drop, Produce, ProduceItem, Truncate, UnknownCommand, decode_command
from .kv import KV_CONFLICT, KvStore

__all__ = ["CatchUpFailed", "DataState", "OUT_OF_ORDER", "apply_position", "queue_dir", "parse_queue_dir"]

log = logging.getLogger(__name__)


class CatchUpFailed(RuntimeError):
    """A snapshot could not be installed yet: no peer served the batches it lacks
    (cut off, down). The leader sends the snapshot again; nothing is lost."""
    retry_later = True
MAX_PRODUCERS_PER_QUEUE = 1000
REMEMBERED_BATCHES = 8
OUT_OF_ORDER = "out_of_order"     # a produce result: (OUT_OF_ORDER, sequence expected, producer, sequence)

FetchRange = Callable[[str, int, int], bytes]


POSITION_BITS = 20     # items per raft entry: < 2**20


def apply_position(raft_index: int, item: int) -> int:
    """Where a batch was applied: raft index and item number in one sortable int.

    Stored in the batch header, it makes apply idempotent per queue.
    """
    return (raft_index << POSITION_BITS) | item


def queue_dir(topic: str, incarnation: str, queue: int) -> str:
    return f"{topic}~{incarnation}~{queue}"


# A sync round (the background one, a snapshot's) with this many queues written syncs the
# file system once (``durability.syncfs``), not each queue (issue 39.5).
BULK_SYNC_QUEUES = 32


def parse_queue_dir(name: str) -> tuple[str, str, int]:
    topic, inc, q = name.split("~")
    return topic, inc, int(q)


class DataState:
    def __init__(self, root: str, fsync: bool = True, segment_bytes: int = 64 << 20,
                 files: OpenFiles | None = None):
        self.fetch_range: FetchRange | None = None   # set by the node: peer catch-up
        self.files = files          # the node's open-file budget, shared by its groups
        self.root = root
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        os.makedirs(root, exist_ok=True)
        # For the bulk sync (``_bulk_sync``): open for the state's life, so its syncfs
        # sees every write-back error since (``durability.syncfs``).
        self._fs_fd = os.open(root, os.O_RDONLY) if fsync and HAS_SYNCFS else None
        self._fs_lock = threading.Lock()    # the descriptor is not closed under a sync
        self.dirs = DirSyncs()      # new queues' directory syncs, made by ``sync``/``sync_behind``
        self.unsynced = Unsynced()  # queues written since ``sync_behind`` last synced them
        self.sizes = ByteCount()    # segment bytes of the open queues (``tally.py``)
        on_disk = [n for n in os.listdir(root) if "~" in n and os.path.isdir(os.path.join(root, n))]
        self.queues = QueueLogs(self._open, on_disk)     # opened when first used
        # (earliest, next offset) of queues not opened since start, as the snapshot loaded at
        # start recorded them: what a snapshot taken now says of them (``manifest``)
        self._as_loaded: dict[str, list] = {}
        self._trust_disk = bool(on_disk)          # until the first snapshot install (``restore``)
        # qdir -> producer_id -> deque[(seq, base_offset, count, store_ts)]
        self.producers: dict[str, collections.OrderedDict] = {}
        self.lock = threading.Lock()
        self.parked: dict[str, list] = {}    # qdir -> [(offset, wake)]: fetches waiting for data
        self._park_lock = threading.Lock()   # not self.lock: a queue's creation syncs directories under it
        self._applied_items: dict[int, tuple] = {}   # apply position -> result, within one entry
        self.on_damaged = None    # on_damaged(queue name): a copy failed its check (repair it)
        self._kv: KvStore | None = None               # opened when key-value is first used (kv.py)
        self._kv_lock = threading.Lock()

    @property
    def kv_if_open(self) -> KvStore | None:
        """The key-value view if something used it already (``kv`` opens it)."""
        return self._kv

    def _damaged(self, qname: str) -> None:
        if self.on_damaged is not None:
            self.on_damaged(qname)

    @property
    def kv(self) -> KvStore:
        """The key-value view of this group's queues (``kv.py``), opened when first used."""
        if self._kv is None:
            with self._kv_lock:
                if self._kv is None:
                    self._kv = KvStore(self.root, self.queues.get, self._damaged)
        return self._kv

    def _open(self, name: str) -> QueueLog:
        return QueueLog(os.path.join(self.root, name), self.segment_bytes, fsync=self.fsync, files=self.files,
                        dirs=self.dirs, unsynced=self.unsynced, sizes=self.sizes)

    def queue(self, name: str, create: bool = False) -> QueueLog | None:
        q = self.queues.get(name)
        if q is None and create:
            with self.lock:
                q = self.queues.get(name)
                if q is None:
                    q = self.queues[name] = self._open(name)
        return q

    # ------------------------------------------------------------------ apply
    def apply(self, raft_index: int, raw: tuple):
        """Apply one committed entry (the replicated tuple); returns its result."""
        try:
            cmd = decode_command(raw)
        except UnknownCommand as e:
            cmd, res = None, ("error", str(e))
        if isinstance(cmd, Produce):
            # One raft entry may carry several batches, even for one queue;
            # each gets its own apply position (raft index, item number).
            res = [self._apply_item(apply_position(raft_index, i), item) for i, item in enumerate(cmd.items)]
            self._applied_items.clear()
        elif isinstance(cmd, Truncate):
            q = self.queue(cmd.queue_dir)
            res = q.truncate_prefix(cmd.offset) if q is not None else 0
            if q is not None and self._kv is not None:
                self._kv.truncated(cmd.queue_dir, q.earliest)
        elif isinstance(cmd, Drop):
            res = self._drop(cmd.queue_dir)
        elif cmd is not None:
            res = ("error", f"command {cmd.KIND!r} is not for a data group")
        if self.parked:
            self._wake_for(cmd)
        return res

    def _wake_for(self, cmd) -> None:
        if isinstance(cmd, Produce):
            self._wake({item.queue_dir for item in cmd.items})
        elif isinstance(cmd, (Truncate, Drop)):       # the waiters answer what is left (or an error)
            self._wake([cmd.queue_dir], everyone=True)

    def park(self, name: str, offset: int, wake: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``wake()`` (from the applying thread) once queue ``name`` holds a record
        at ``offset``, or is truncated or dropped; a long-polling fetch waits so without
        holding a thread (``server/dispatch.py``). Returns the cancel function, or None
        when the record is there already (nothing registered).

        Registered first, looked at after: apply appends, then looks for waiters, so
        either it sees this one or this sees its record."""
        entry = (offset, wake)
        with self._park_lock:
            self.parked.setdefault(name, []).append(entry)

        def cancel() -> None:
            with self._park_lock:
                waiting = self.parked.get(name)
                if waiting and entry in waiting:
                    waiting.remove(entry)
                    if not waiting:
                        del self.parked[name]
        q = self.queues.get(name)
        if q is not None and q.next_offset > offset:
            cancel()
            return None
        return cancel

    def parked_count(self) -> int:
        with self._park_lock:
            return sum(map(len, self.parked.values()))

    def _wake(self, names, everyone: bool = False) -> None:
        """Wake the fetches parked on queues an entry grew (``everyone``: shrank or dropped)."""
        woken = []
        with self._park_lock:
            for name in names:
                waiting = self.parked.get(name)
                if not waiting:
                    continue
                q = self.queues.get(name)
                end = q.next_offset if q is not None else None
                keep = [] if everyone or end is None else [w for w in waiting if w[0] >= end]
                woken += [w[1] for w in waiting if w not in keep]
                if keep:
                    self.parked[name] = keep
                else:
                    del self.parked[name]
        for wake in woken:
            try:
                wake()
            except Exception:              # a server stopping: its loop is closed
                log.debug("waking a parked fetch failed", exc_info=True)

    def _apply_item(self, position: int, item: ProduceItem):
        """``_apply_batch`` once per item: an entry whose apply met a shortage part way
        (``log/diskspace.py``) is applied again, and the items it already wrote answer
        what they answered the first time."""
        done = self._applied_items.get(position)
        if done is None:
            done = self._applied_items[position] = self._apply_batch(position, item)
        return done

    def _apply_batch(self, position: int, item: ProduceItem):
        qname, producer, seq, store_ts, count = (item.queue_dir, item.producer_id, item.sequence,
                                                 item.store_ts, item.count)
        q = self.queue(qname, create=True)
        if producer:
            dup = self._find_duplicate(qname, producer, seq)
            if dup is not None:
                return dup
            if item.in_order:
                expected = self._expected_sequence(qname, producer)
                if expected is not None and seq > expected:
                    return (OUT_OF_ORDER, expected, producer, seq)
        if position <= q.last_position:
            # Replay of a batch already in the segments (journal replay after
            # a restart): rebuild the dedupe entry, write nothing.
            found = q.batch_at_position(position)
            if found is None and item.condition is not None:
                # Not in the log: refused when first applied (a conflict stores
                # nothing), or compacted away since: not remembered.
                return (KV_CONFLICT, -1)
            base, ts = found or (-1, store_ts)
        else:
            base, ts = q.next_offset, max(store_ts, q.last_ts)
            if item.condition is not None:       # a key-value write's condition (kv.py)
                conflict = self.kv.decide(qname, q, item.condition, item.records, count, ts)
                if conflict is not None:
                    return conflict              # nothing stored, nothing remembered
            parts = framing.frame_parts(base, ts, count, position, item.records)
            size = sum(map(len, parts))
            q.append(parts, framing.BatchHeader(0, size, base, ts, count, position, base + count - 1))
            if self._kv is not None:
                self._kv.appended(qname, q, base, count, item.records)
        if producer:
            self._remember(qname, producer, seq, base, count, ts)
        return (base, count, ts, False)

    def _find_duplicate(self, qname, producer, seq):
        batches = self.producers.get(qname, {}).get(producer)
        if not batches or seq > batches[-1][0]:
            return None
        for s, base, count, ts in batches:
            if s == seq:
                return (base, count, ts, True)
        return (-1, 0, 0, True)      # older than what we remember: applied before

    def _expected_sequence(self, qname, producer) -> int | None:
        """The sequence after the producer's last batch on the queue (None: not known)."""
        batches = self.producers.get(qname, {}).get(producer)
        if not batches:
            return None
        seq, _, count, _ = batches[-1]
        return seq + count

    def _remember(self, qname, producer, seq, base, count, ts):
        table = self.producers.setdefault(qname, collections.OrderedDict())
        batches = table.pop(producer, None) or collections.deque(maxlen=REMEMBERED_BATCHES)
        batches.append((seq, base, count, ts))
        table[producer] = batches
        while len(table) > MAX_PRODUCERS_PER_QUEUE:
            table.popitem(last=False)

    def _drop(self, qname: str) -> int:
        with self.lock:
            q = self.queues.pop(qname, None)
            self.producers.pop(qname, None)
        if q is None:
            return 0
        q.close()
        q.uncount()
        shutil.rmtree(q.path, ignore_errors=True)
        if self._kv is not None:
            self._kv.dropped(qname)
        return 1

    def sync(self) -> None:
        self._sync_all(QueueLog.sync)

    def sync_behind(self) -> None:
        """Sync the queues written since the last call, from a background thread
        (``QueueLog.sync_behind``; ``tally.Unsynced``)."""
        self._sync_all(QueueLog.sync_behind, self.unsynced.take())

    def flush_kv_index(self) -> None:
        """Write the key index's rows held in memory for ``FLUSH_SECONDS`` to SQLite
        (``KvIndex.flush_held``; a background thread)."""
        if self._kv is not None:
            self._kv.index.flush_held()

    def _sync_all(self, sync, queues: list | None = None) -> None:
        queues = list(self.queues.values()) if queues is None else queues
        if self._fs_fd is not None and len(queues) >= BULK_SYNC_QUEUES:
            marked = [(q, m) for q in queues if (m := q.sync_mark()) is not None]
            if len(marked) >= BULK_SYNC_QUEUES and self._bulk_sync(marked):
                return
            queues = [q for q, _ in marked]         # the others had nothing to sync
        try:
            self.dirs.sync()              # new queues' directories (``DirSyncs``)
        except OSError as e:
            fatal(f"group data {self.root}: directory sync failed ({e})")
        for q in queues:
            try:
                sync(q)
            except OSError as e:          # never retried over lost pages (errors.fatal)
                fatal(f"queue {q.path}: segment sync failed ({e})")

    def _bulk_sync(self, marked: list) -> bool:
        """One ``syncfs`` for a round with ``BULK_SYNC_QUEUES`` or more queues to sync
        (``QueueLog.sync_mark``), their new directories with them; False (nothing done)
        once the state is closed."""
        with self._fs_lock:
            if self._fs_fd is None:
                return False
            try:
                with self.dirs.covered():
                    syncfs(self._fs_fd)
            except OSError as e:          # never retried over lost pages (durability.fatal)
                fatal(f"group data {self.root}: file system sync failed ({e})")
        for q, mark in marked:
            q.synced(mark)
        return True

    def close(self) -> None:
        for q in list(self.queues.values()):
            q.close()
        with self._fs_lock:
            if self._fs_fd is not None:
                os.close(self._fs_fd)
                self._fs_fd = None
        if self._kv is not None:
            self._kv.close()

    # --------------------------------------------------------------- snapshot
    def manifest(self) -> dict:
        self.sync()   # the snapshot never claims data that is not on disk
        queues = {}
        for n in self.queues.closed_names():      # unchanged since the snapshot loaded at start
            if n in self._as_loaded:
                queues[n] = self._as_loaded[n]
            else:
                q = self.queues.get(n)
                queues[n] = [q.earliest, q.next_offset]
        return {
            "queues": queues | {n: [q.earliest, q.next_offset] for n, q in list(self.queues.items())},
            "producers": {n: {p: list(map(list, b)) for p, b in t.items()}
                          for n, t in self.producers.items()},
        }

    def snapshot(self) -> bytes:
        return json.dumps(self.manifest()).encode()

    def restore(self, data: bytes, index: int, leader: str | None, own: bool = False) -> None:
        """Install a snapshot; CatchUpFailed if no peer could serve the batches it lacks
        (what was fetched stays: a later install goes on from there). ``own``: a
        snapshot this replica wrote itself (not one received from a leader, whose
        queues this replica may lack), loaded at start: closed queues stay closed."""
        trust = self._trust_disk and own and self.fsync
        self._trust_disk = False
        self.install(json.loads(data), self.fetch_range, index, trust_disk=trust)

    def install(self, manifest: dict, fetch_range: FetchRange | None, index: int,
                trust_disk: bool = False) -> None:
        """Make local queues match the manifest of a snapshot taken at raft ``index``.

        Queues behind the manifest fetch the missing batches from a peer;
        queues written after the snapshot (raft index > ``index``) are kept.
        ``trust_disk``: the node's own snapshot, loaded at start: its queues were
        synced before it was written, so a queue not opened yet is left closed
        (``QueueLogs``) and its manifest entry kept for the next snapshot.
        """
        closed = self.queues.closed_names() if trust_disk else set()
        self._as_loaded = {}
        for name, (earliest, nxt) in manifest["queues"].items():
            if name in closed:
                self._as_loaded[name] = [earliest, nxt]
                continue
            q = self.queue(name, create=True)
            if q.next_offset < earliest or q.earliest > nxt:
                q.reset(earliest)
            if q.next_offset < nxt:
                if fetch_range is None:
                    raise RuntimeError(f"queue {name}: local data ends at {q.next_offset}, "
                                       f"snapshot needs {nxt}, and no peer to fetch from")
                log.info("queue %s: catching up [%d, %d) from peers", name, q.next_offset, nxt)
                while q.next_offset < nxt:
                    frames = fetch_range(name, q.next_offset, nxt)
                    if not frames:
                        raise CatchUpFailed(f"queue {name}: no peer could serve it from {q.next_offset}")
                    q.append_frames(frames)
                q.sync()
            if earliest > q.earliest:
                q.truncate_prefix(earliest)
        # (a closed queue the manifest does not name: dropped before the snapshot, its
        # directory left by a crash; opened here to be judged like the rest)
        for name in set(self.queues) | (self.queues.closed_names() - manifest["queues"].keys()):
            if name not in manifest["queues"] and self.queues[name].last_position < apply_position(index + 1, 0):
                self._drop(name)
        try:
            self.dirs.sync()             # the queues created here: the journal no longer covers them
        except OSError as e:
            fatal(f"group data {self.root}: directory sync failed ({e})")
        self.producers = {
            n: collections.OrderedDict(
                (p, collections.deque(map(tuple, b), maxlen=REMEMBERED_BATCHES)) for p, b in t.items())
            for n, t in manifest["producers"].items()}
        self._wake(list(self.parked), everyone=True)

