"""One message queue on disk: an append-only list of segments (``segment.py``).

A queue directory holds its segments (named by base offset) and a file
``earliest``: the logical earliest offset (retention may cut here).

Only the tail segment is scanned on open; a torn or corrupt tail is cut off
there (the raft log or a peer supplies it again). Memory per queue is a few
numbers per segment: indexes stay on disk and are read on lookup.
"""
from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
import time

from ..protocol import framing
from .diskspace import Shortage, is_shortage
from .durability import DirSyncs, drop_pages, fatal, fsync_dir
from .handles import OpenFiles
from .tally import ByteCount, Unsynced
from .queue_reads import QueueReads
from .swaps import SegmentSwaps
from .segment import (IDX_ENTRY, SEGMENT_FILES, TIX_ENTRY, FileSpan, Segment, finish_swaps, open_sealed,
                      recover_tail)

__all__ = ["FileSpan", "QueueLog", "Segment"]

log = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 8 << 20


def _made(path: str) -> bool:
    """Make a new queue's directory, in one call rather than a look first (issue 39.5);
    False if it is there already."""
    try:
        os.mkdir(path)
    except FileExistsError:
        return False
    except FileNotFoundError:          # (its parent too)
        os.makedirs(path)
    return True


class QueueLog(SegmentSwaps, QueueReads):
    """An append-only log of record batches for one queue.

    Thread-safety: one writer (the raft apply thread) and many readers; the
    lock guards the segment list and the tail position.
    """

    def __init__(self, path: str, segment_bytes: int = 64 << 20,
                 index_interval: int = 64 << 10, fsync: bool = True,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, files: OpenFiles | None = None,
                 dirs: DirSyncs | None = None, unsynced: Unsynced | None = None,
                 sizes: ByteCount | None = None):
        """``cache_bytes``: how much of the active segment's synced tail stays in
        the page cache for readers that follow the log (``sync_behind``).
        ``files``: the node's budget of open files (``handles.py``); the log opens
        its files when it is used and closes them when the budget needs them.
        ``dirs``: where a new queue leaves its directory syncs for its owner to
        make later (``DirSyncs``: the raft journal covers them meanwhile); without
        it they are made at once. ``unsynced``: where an append leaves this queue
        for the owner's background sync; ``sizes``: the owner's count of segment
        bytes, kept as this queue's change (``tally.py``)."""
        self.path = path
        self.segment_bytes = segment_bytes
        self.cache_bytes = cache_bytes
        self.index_interval = index_interval
        self.fsync_enabled = fsync
        self.lock = threading.RLock()
        self.segments: list[Segment] = []
        self._earliest = 0
        self.recent: dict[int, tuple[int, int]] = {}
        self._wfd: int | None = None   # active segment's .log, .idx, .tix (append)
        self._ifd: int | None = None
        self._tfd: int | None = None
        self._idx_since = 0   # bytes appended since the last offset-index entry
        # (base offset, byte position) of the batches this process appended to the
        # active segment (``_tail_seg``) since its last offset-index entry: a read near
        # the end starts at its batch, not up to 64 KiB of batches earlier, each of
        # them CRC-checked (a tailing consumer, a key-value condition's index catch-up).
        self._tail: list[tuple[int, int]] = []
        self._tail_seg: Segment | None = None
        self._index_sizes: tuple[int, int] | None = None   # index file sizes before an append
        self._dirty = False
        self._appends = 0     # appends so far (sync_behind: was anything written meanwhile?)
        self._uncached = 0    # active segment: bytes below this were dropped from the page cache
        self.files = files
        self.last_use = 0.0   # monotonic time of the last append or read (least used closes first)
        self.unsynced = unsynced if fsync else None
        self.sizes = sizes
        self._size = 0        # segment bytes as last counted in ``sizes``
        if _made(path):
            self._create(dirs)
        else:
            self._open()
        self._resized()

    # ------------------------------------------------------------------ open
    def _open(self) -> None:
        finish_swaps(self.path)
        bases = sorted(int(f[:-4]) for f in os.listdir(self.path) if f.endswith(".log"))
        self._earliest = self._read_earliest()
        for base in bases[:-1]:
            self.segments.append(open_sealed(self.path, base))
        if bases:
            seg, self._idx_since, self.recent = recover_tail(self.path, bases[-1], self.index_interval)
            self.segments.append(seg)
        else:
            self._new_segment(self._earliest)
        for seg, after in zip(self.segments, self.segments[1:]):
            if seg.damaged:                  # its end is where the next one starts
                seg.next_offset = max(seg.next_offset, after.base)
        self._earliest = max(self._earliest, self.segments[0].base)

    def _create(self, dirs: DirSyncs | None) -> None:
        """A new queue (its directory just made): its first segment's (empty) ``.log``. Both
        directories' new entries must survive a power loss: synced here, or by
        ``dirs``'s owner before a snapshot covers this queue (issue 39: the syncs
        held the first produce to fresh queues to 300-500 queues/s). The files are
        closed again: an idle queue holds none (its first append opens them)."""
        seg = Segment(0, self.path, 0, 0)
        os.close(os.open(seg.file("log"), os.O_WRONLY | os.O_CREAT, 0o644))
        self.segments.append(seg)
        self._idx_since = 0
        if self.fsync_enabled:
            parent = os.path.dirname(os.path.abspath(self.path))
            if dirs is not None:
                dirs.add(parent, self.path)
            else:
                fsync_dir(parent)
                fsync_dir(self.path)

    def _read_earliest(self) -> int:
        try:
            with open(os.path.join(self.path, "earliest")) as f:
                return int(f.read().strip() or 0)
        except FileNotFoundError:
            return 0

    def _write_earliest(self, value: int) -> None:
        tmp = os.path.join(self.path, "earliest.tmp")
        with open(tmp, "w") as f:
            f.write(str(value))
            f.flush()
            if self.fsync_enabled:
                os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.path, "earliest"))

    def _new_segment(self, base: int) -> Segment:
        seg = Segment(base, self.path, base, 0)
        open(seg.file("log"), "ab").close()
        for ext in ("idx", "tix"):      # a stale one (a reset) would misplace reads
            try:
                os.unlink(seg.file(ext))
            except FileNotFoundError:
                pass
        if self.fsync_enabled:
            # The new files' names: without this a power loss may drop them, and once a
            # raft snapshot covers their entries nothing would write them again
            # (found by the power-loss shim, tests/faults/unsynced.c).
            fsync_dir(self.path)
        self.segments.append(seg)
        self._idx_since = 0
        return seg

    def _open_writer(self) -> None:
        """Open the active segment's files for appends (lock held).

        The index files stay open too: opening them per batch was a visible
        share of apply when most batches cross an index interval. A segment
        has them from its first index entry on (``_open_index``).
        """
        self._close_writer()
        self._wfd = os.open(self.segments[-1].file("log"), os.O_WRONLY | os.O_APPEND)
        try:
            if self._idx_since:     # past the segment's start: its index files may be there
                try:
                    self._open_index(0)
                except FileNotFoundError:
                    pass
        finally:
            self._note_files()

    def _open_index(self, create: int) -> None:
        """Open the active segment's index files for appends (``create``: ``os.O_CREAT``
        to make them). A segment's first batch is at byte 0, so it needs no entry:
        the files come with the first entry past it, and a queue that never holds
        64 KiB costs two names (its directory and its ``.log``), not four (issue 39:
        the first produce to fresh queues was the file system's cost of those names)."""
        seg = self.segments[-1]
        fds = []
        try:
            for ext in ("idx", "tix"):
                fds.append(os.open(seg.file(ext), os.O_WRONLY | os.O_APPEND | create, 0o644))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        self._ifd, self._tfd = fds

    def _close_writer(self) -> None:
        for fd in (self._wfd, self._ifd, self._tfd):
            if fd is not None:
                os.close(fd)
        self._wfd = self._ifd = self._tfd = None

    # ------------------------------------------------------------ open files
    def _open_count(self) -> int:
        return sum(1 for fd in (self._wfd, self._ifd, self._tfd) if fd is not None) + \
            sum(1 for seg in self.segments if seg.fd is not None)

    def _note_files(self) -> None:
        if self.files is not None:
            self.files.changed(self, self._open_count())

    def release_files(self, clean_only: bool = False) -> bool:
        """Close every file this log holds open, after syncing what it wrote; the
        next append or read opens them again. False (nothing done) while another
        thread holds the log: the caller never waits on it; or, with ``clean_only``,
        while it has writes not synced yet."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if clean_only and self._dirty and self._wfd is not None:
                return False
            try:
                self.sync()
            except OSError as e:           # a failed sync is never retried over lost pages
                fatal(f"queue {self.path}: segment sync failed ({e})")
            self._close_writer()
            for seg in self.segments:
                seg.close()
            self._note_files()
            return True
        finally:
            self.lock.release()

    # ----------------------------------------------------------- properties
    @property
    def earliest(self) -> int:
        return self._earliest

    @property
    def next_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def last_position(self) -> int:
        for seg in reversed(self.segments):
            if seg.last_position:
                return seg.last_position
        return 0

    @property
    def last_ts(self) -> int:
        for seg in reversed(self.segments):
            if seg.last_ts >= 0:
                return seg.last_ts
        return -1

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def _resized(self) -> None:
        """Count a change of the segments (other than an append's) in ``sizes``."""
        new = self.size_bytes
        if new != self._size:
            if self.sizes is not None:
                self.sizes.add(new - self._size)
            self._size = new

    def uncount(self) -> None:
        """Take this queue out of ``sizes`` (it is being dropped)."""
        if self.sizes is not None and self._size:
            self.sizes.add(-self._size)
        self._size = 0

    # --------------------------------------------------------------- writes
    def append(self, frame, h: framing.BatchHeader, gap_ok: bool = False) -> None:
        """Append one framed batch whose base offset must equal next_offset
        (or be past it, with ``gap_ok``: a compacted peer's batch).

        ``frame`` is the batch's bytes, or its parts (``framing.frame_parts``).
        """
        with self.lock:
            if h.base_offset != self.next_offset and not (gap_ok and h.base_offset > self.next_offset):
                raise ValueError(f"append at {h.base_offset} but queue {self.path} is at {self.next_offset}")
            self.last_use = time.monotonic()
            try:
                if self._wfd is None:
                    self._open_writer()
                seg = self.segments[-1]
                if seg.size >= self.segment_bytes:
                    self._roll()
                    seg = self.segments[-1]
            except OSError as e:        # no descriptor or no room for a new segment's files
                if is_shortage(e):
                    raise Shortage(e.errno, f"queue {self.path}: {os.strerror(e.errno)}") from e
                raise
            indexed = self._idx_since >= self.index_interval
            try:
                self._write_batch(frame, h, seg, indexed)
            except OSError as e:
                self._cut_back(seg, indexed)
                if is_shortage(e):
                    raise Shortage(e.errno, f"queue {self.path}: {os.strerror(e.errno)}") from e
                fatal(f"queue {self.path}: segment write failed ({e})")
            if indexed:
                self._idx_since = 0
            self._idx_since += h.size
            if indexed or self._tail_seg is not seg:
                self._tail, self._tail_seg = [], seg
            self._tail.append((h.base_offset, seg.size))
            seg.size += h.size
            seg.next_offset = h.next_offset
            if seg.first_ts < 0:
                seg.first_ts = h.store_ts
            seg.last_ts = h.store_ts
            seg.last_position = h.apply_position
            self._dirty = True
            self._appends += 1
            self._size += h.size
        if self.sizes is not None:
            self.sizes.add(h.size)
        if self.unsynced is not None:
            self.unsynced.add(self)

    def _write_batch(self, frame, h: framing.BatchHeader, seg: Segment, indexed: bool) -> None:
        """Write one batch (and its index entries); a short write is an error."""
        self._index_sizes = None         # this batch's, if it writes index entries (_cut_back)
        n = os.writev(self._wfd, frame) if isinstance(frame, tuple) else os.write(self._wfd, frame)
        if n != h.size:                 # the file system ran out part way
            raise OSError(errno.ENOSPC, f"short write ({n} of {h.size} bytes)")
        if indexed:
            if self._ifd is None:
                self._open_index(os.O_CREAT)
                self._note_files()
            self._index_sizes = (os.fstat(self._ifd).st_size, os.fstat(self._tfd).st_size)
            for fd, entry in ((self._ifd, IDX_ENTRY.pack(h.base_offset, seg.size)),
                              (self._tfd, TIX_ENTRY.pack(h.store_ts, h.base_offset))):
                if os.write(fd, entry) != len(entry):
                    raise OSError(errno.ENOSPC, "short write of an index entry")

    def _cut_back(self, seg: Segment, indexed: bool) -> None:
        """Undo a failed append: the files end where they did before it."""
        try:
            os.ftruncate(self._wfd, seg.size)
            if indexed and self._index_sizes is not None and self._ifd is not None:
                os.ftruncate(self._ifd, self._index_sizes[0])
                os.ftruncate(self._tfd, self._index_sizes[1])
        except OSError as e:            # the files no longer match memory
            fatal(f"queue {self.path}: could not undo a failed write ({e})")
        finally:
            self._index_sizes = None

    def append_frames(self, frames: bytes) -> int:
        """Append already-framed batches (peer catch-up). Returns batches written.

        A compacted peer's batches may start past ``next_offset`` (records
        dropped in between); the gap is kept, offsets never shift.
        """
        n = 0
        mv = memoryview(frames)
        for h in framing.iter_batches(mv):
            self.append(bytes(mv[h.position:h.position + h.size]), h, gap_ok=True)
            n += 1
        return n

    def _roll(self) -> None:
        try:
            self.sync()
        except OSError as e:           # whatever the errno: never retried (durability.py)
            fatal(f"queue {self.path}: segment sync failed ({e})")
        if self.fsync_enabled:    # a sealed segment is read rarely: all of it leaves the cache
            drop_pages(self._wfd, 0, 0)
        self._new_segment(self.next_offset)
        self._uncached = 0        # a new active segment: nothing of it dropped yet
        self._open_writer()

    def sync(self) -> None:
        if self._dirty and self._wfd is not None:
            if self.fsync_enabled:
                os.fdatasync(self._wfd)
            self._dirty = False

    def sync_behind(self) -> None:
        """``sync`` from a thread other than the writer's, without holding up appends.

        The fdatasync runs on a duplicate of the active segment's descriptor,
        outside the lock; the queue counts as clean afterwards only if nothing
        was appended meanwhile. It keeps the dirty data small, so the sync a
        raft snapshot must make (on the raft thread) has little left to do.
        Then what it synced, less the last ``cache_bytes``, leaves the page
        cache (``durability.drop_pages``).
        """
        with self.lock:
            mark = self._mark()
            if mark is None:
                return
            try:
                fd = os.dup(self._wfd)
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    if self.unsynced is not None:
                        self.unsynced.add(self)
                    return            # no descriptor to spare now: not a disk error; next round
                raise
        try:
            os.fdatasync(fd)
            with self.lock:
                drop = self._settle(mark)
            if drop:
                drop_pages(fd, *drop)
        finally:
            os.close(fd)

    def sync_mark(self) -> tuple | None:
        """What this queue has to sync, taken before a sync of the whole file system
        (``DataState``'s bulk sync): None if nothing."""
        with self.lock:
            return self._mark()

    def synced(self, mark: tuple) -> None:
        """The file system was synced after ``sync_mark`` returned ``mark``: clean unless
        appended to since; what was synced leaves the page cache as in ``sync_behind``."""
        with self.lock:
            drop = self._settle(mark, claim=self._wfd is not None)   # (closed since: no range)
            if drop:
                drop_pages(self._wfd, *drop)

    def _mark(self) -> tuple | None:
        """(appends, active segment, its size) before a sync; None if clean (lock held)."""
        if not (self._dirty and self._wfd is not None and self.fsync_enabled):
            return None
        return self._appends, self.segments[-1], self.segments[-1].size

    def _settle(self, mark: tuple, claim: bool = True) -> tuple[int, int] | None:
        """After a sync begun at ``mark``: clean unless appended to since; the range to
        drop from the page cache, if any and ``claim`` (lock held)."""
        appends, seg, size = mark
        if self._appends == appends:
            self._dirty = False
        return self._claim_uncached(size) if claim and self.segments[-1] is seg else None

    def _claim_uncached(self, synced: int) -> tuple[int, int] | None:
        """The active segment's range to drop from the page cache once ``synced``
        bytes of it are on disk: all but the last ``cache_bytes`` (lock held)."""
        # Whole pages only: the kernel keeps a page the range covers in part, and
        # the next claim would start inside it, so a slow queue's pages stayed.
        end = (synced - self.cache_bytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if end <= self._uncached:
            return None
        start, self._uncached = self._uncached, end
        return start, end - start

    def truncate_prefix(self, offset: int) -> int:
        """Move earliest up to ``offset`` and delete whole segments below it.

        ``offset`` is rounded down to a batch boundary, so earliest is always
        the first offset of a stored batch (replicas can copy from there).

        Returns the number of segments deleted. The active segment is never
        deleted; if offset passes the end, earliest stops at next_offset.
        """
        with self.lock:
            offset = self._batch_start(min(offset, self.next_offset))
            if offset <= self._earliest:
                return 0
            self._earliest = offset
            self._write_earliest(offset)
            dropped = 0
            while len(self.segments) > 1 and self.segments[1].base <= offset:
                seg = self.segments.pop(0)
                seg.close()
                for ext in SEGMENT_FILES:
                    try:
                        os.unlink(seg.file(ext))
                    except FileNotFoundError:
                        pass
                dropped += 1
            if dropped:
                self._note_files()
                self._resized()
            return dropped

    def _batch_start(self, offset: int) -> int:
        """Round an offset down to the first offset of the batch holding it."""
        if offset >= self.next_offset:
            return offset
        try:
            data = self.read(offset, 1)
        except framing.CorruptBatch as e:
            # Runs in apply (retention's cut): rot must not stop the group. The cut
            # stays at the offset itself here; the scrub finds and repairs the rot.
            log.error("queue %s: cutting at %d, the batch holding it fails its check (%s)", self.path, offset, e)
            return max(offset, self._earliest)
        for h in framing.iter_batches(data, verify=False):
            return max(h.base_offset, self._earliest)
        return offset

    def reset(self, start: int) -> None:
        """Drop everything and continue empty at ``start`` (replica rebuild)."""
        with self.lock:
            for seg in self.segments:
                seg.close()
                for ext in SEGMENT_FILES:
                    try:
                        os.unlink(seg.file(ext))
                    except FileNotFoundError:
                        pass
            self._close_writer()
            self.segments = []
            self._tail, self._tail_seg = [], None
            self._earliest = start
            self._write_earliest(start)
            self._new_segment(start)
            self._uncached = 0
            self._note_files()
            self._resized()

    def close(self) -> None:
        with self.lock:
            self.sync()
            self._close_writer()
            for seg in self.segments:
                seg.close()
            self._note_files()

    # ---------------------------------------------------------------- reads
