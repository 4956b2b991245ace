"""Bit rot: a corrupt batch or index entry is answered from a healthy copy and repaired.

Every batch carries a CRC32C and every read checks the batches it parses,
so rot is never served. Before, it was not healed either: each read of the
range failed with INTERNAL, and were the rotten replica the leader the range
was unreadable while two good copies existed. Now (a mixin of
``StorageNode``):

* **Healed reads.** A fetch that meets a corrupt batch (or an offset-index
  entry pointing where no batch starts) gets the range from another replica
  of the group (``peers.fetch_range``, which checks every batch's CRC; a peer
  whose copy is rotten too answers an error and the next one is asked) and
  answers it; the segment is queued for repair.
* **Repair.** A queued queue's segments are checked whole
  (``segment.check_segment``). A segment with a bad batch is swapped for the
  peers' batches of its offset range, as compaction swaps a segment
  (``QueueLog.repair_segment``: files written aside, synced, renamed); a bad
  index is rebuilt from the segment's own batches. The active segment is
  sealed first (``QueueLog.seal_active``), so only sealed segments are
  swapped.
* **Scrub.** A background pass reads every segment of every queue this node
  holds, at most ``--scrub-bytes-per-s``, one pass every
  ``--scrub-interval`` seconds (0: off), and queues what it finds: rot in
  data nobody reads is found before the other copies are needed.

Rot found when a node starts: in the active segment, the tail from the bad
batch on is cut and supplied again by the journal or a peer (as a torn
write); in a sealed segment, the segment is marked damaged (its index
rebuilt if only the index was bad) and queued for repair. Rot in the raft
journal is handled by the journal itself (``raft/journal.py``).
"""
from __future__ import annotations

import logging
import queue
import threading
import time

import grpc

from ..log.queue_log import QueueLog
from ..log.segment import Segment, check_segment
from ..protocol import framing
from ..protocol.errors import ServiceError

__all__ = ["Repair"]

log = logging.getLogger(__name__)


DAMAGED_EVERY = 5.0     # seconds between repairs asked for a queue a decision found damaged


class Repair:
    def _init_repair(self) -> None:
        self._to_repair: queue.Queue = queue.Queue()
        self._queued: set[str] = set()
        self._repair_lock = threading.Lock()
        self._healed_logged: dict[str, float] = {}
        self._repair_failed: set[str] = set()
        self._damaged_asked: dict[str, float] = {}    # queue -> when check_damaged last asked
        self.repairs = {"healed_reads": 0, "segments_repaired": 0, "indexes_rebuilt": 0, "scrubbed_bytes": 0}
        for st in self.states.values():
            for name, ql in list(st.queues.items()):
                if ql.damaged():
                    self.queue_repair(name)

    def check_opened(self, qname: str, ql: QueueLog) -> None:
        """A queue opened after start (``QueueLogs``): repaired if its files are damaged
        (those open at start are checked by ``_init_repair``)."""
        if hasattr(self, "_to_repair") and ql.damaged():
            self.queue_repair(qname)

    def check_damaged(self, qname: str) -> None:
        """A queue's copy failed its check where a decision needed it (``Damaged``): repair
        it. The apply that met it asks again every tick until the copy is whole; a
        repair is queued at most every ``DAMAGED_EVERY`` seconds (one that found
        nothing to fix, a batch whose CRC holds but whose block does not parse, must not
        re-check the queue in a loop). Before the repair thread is set up (a replay at
        start) the caller asks again later."""
        if not hasattr(self, "_to_repair"):
            return
        now = time.monotonic()
        asked = self._damaged_asked
        if now - asked.get(qname, -DAMAGED_EVERY) < DAMAGED_EVERY:
            return
        if now - asked.get(qname, -60.0) < 60.0:         # asked a moment ago, and still damaged
            log.error("queue %s: still damaged where a key-value condition must be decided (a repair "
                      "found nothing to fix, or no peer has a whole copy); its group's applies wait", qname)
        asked[qname] = now
        self.queue_repair(qname)

    def queue_repair(self, qname: str) -> None:
        with self._repair_lock:
            if qname in self._queued:
                return
            self._queued.add(qname)
        self._to_repair.put(qname)

    # ------------------------------------------------------------ healed reads
    def healed_read(self, qname: str, offset: int, max_bytes: int, err: framing.CorruptBatch) -> bytes:
        """Batches from the one holding ``offset`` (about ``max_bytes``), from a peer:
        the local copy failed its check (``err``)."""
        if time.monotonic() - self._healed_logged.get(qname, -60.0) >= 10:      # once per 10 s a queue
            self._healed_logged[qname] = time.monotonic()
            log.error("queue %s: %s; answering offset %d from a peer, repairing the segment", qname, err, offset)
        self.queue_repair(qname)
        data = self.fetch_from_peers(qname, offset, offset + 1)
        if not data:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE,
                               f"{qname} offset {offset}: this replica's copy is corrupt (being repaired) "
                               f"and no other replica answered; retry") from err
        keep = 0
        for h in framing.iter_batches(data):          # CRC-checked once more, here
            if keep and keep + h.size > max_bytes:
                break
            keep = h.position + h.size
        self.repairs["healed_reads"] += 1
        return data[:keep]

    # ------------------------------------------------------------------ repair
    def _repair_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                qname = self._to_repair.get(timeout=0.5)
            except queue.Empty:
                continue
            with self._repair_lock:
                self._queued.discard(qname)
            try:
                self.repair_queue(qname)
                self._repair_failed.discard(qname)
            except Exception as e:
                if qname in self._repair_failed:
                    log.warning("repair of %s failed again (%s); retrying in 5 s", qname, e)
                else:
                    self._repair_failed.add(qname)
                    log.exception("repair of %s failed; retrying in 5 s", qname)
                self._stopping.wait(5)
                self.queue_repair(qname)

    def _queue_log(self, qname: str) -> QueueLog | None:
        return next((q for st in list(self.states.values()) if (q := st.queue(qname)) is not None), None)

    def repair_queue(self, qname: str) -> int:
        """Check every segment of a queue and repair what is bad; returns segments fixed."""
        ql = self._queue_log(qname)
        if ql is None:
            return 0
        fixed = 0
        for seg in list(ql.segments):
            fixed += self._repair_segment(qname, ql, seg)
        return fixed

    def _repair_segment(self, qname: str, ql: QueueLog, seg: Segment) -> int:
        whole, index_ok, headers = check_segment(seg, seg.size)
        if whole and index_ok and not seg.damaged:
            return 0
        if seg is ql.segments[-1]:
            if ql.seal_active() is None:
                return 0
        if whole and not seg.damaged:
            ql.rebuild_index(seg, headers)
            self.repairs["indexes_rebuilt"] += 1
            log.warning("queue %s: rebuilt the index of segment %d from its batches", qname, seg.base)
            return 1
        frames = self._peer_frames(qname, max(seg.base, ql.earliest), seg.next_offset)
        if frames is None:
            raise RuntimeError(f"no peer served {qname} [{seg.base}, {seg.next_offset})")
        if not frames:
            return 0
        if ql.repair_segment(seg, frames):
            self.repairs["segments_repaired"] += 1
            log.warning("queue %s: segment %d [%d, %d) repaired from a peer (%d batches)", qname, seg.base,
                        seg.base, seg.next_offset, len(frames))
            return 1
        return 0

    def _peer_frames(self, qname: str, start: int, end: int) -> list[bytes] | None:
        """The batches of [start, end) from peers, CRC-checked and contiguous; None if
        no peer served them."""
        frames, at = [], start
        while at < end:
            data = self.fetch_from_peers(qname, at, end)
            if not data:
                return None
            mv = memoryview(data)
            for h in framing.iter_batches(mv):
                if h.base_offset >= end:
                    break
                frames.append(bytes(mv[h.position:h.position + h.size]))
                at = h.next_offset
            else:
                continue
            break
        return frames

    # ------------------------------------------------------------------- scrub
    def _scrub_loop(self) -> None:
        interval, rate = self.config.scrub_interval, self.config.scrub_bytes_per_s
        if interval <= 0:
            return
        while not self._stopping.wait(interval):
            for st in list(self.states.values()):
                for name, ql in list(st.queues.items()):
                    if self._stopping.is_set():
                        return
                    self._scrub_queue(name, ql, rate)

    def _scrub_queue(self, qname: str, ql: QueueLog, rate: int) -> None:
        for seg in list(ql.segments):
            t0 = time.monotonic()
            try:
                whole, index_ok, _ = check_segment(seg, seg.size)
            except FileNotFoundError:       # retention or compaction took it meanwhile
                continue
            self.repairs["scrubbed_bytes"] += seg.size
            if not (whole and index_ok) or seg.damaged:
                log.error("scrub: queue %s segment %d: %s", qname, seg.base,
                          "a batch fails its check" if not whole else "its index does not match its batches")
                self.queue_repair(qname)
            if rate > 0:                    # at most rate bytes/s, the node's reads come first
                self._stopping.wait(max(0.0, seg.size / rate - (time.monotonic() - t0)))

    def _start_repair(self) -> None:
        self._init_repair()
        for target, name in ((self._repair_loop, "repair"), (self._scrub_loop, "scrub")):
            threading.Thread(target=target, name=name, daemon=True).start()

