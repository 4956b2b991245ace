"""Per-queue segment files: the storage engine under one message queue.

A queue directory holds segments named by their base offset::

    00000000000000000000.log   framed record batches (storage_service.codec)
    00000000000000000000.idx   sparse offset index: (u64 offset, u64 position)
    00000000000000000000.tix   sparse time index:   (i64 store_ts, u64 offset)
    earliest                   logical earliest offset (retention may cut here)

Only the tail segment is scanned on open; a torn or corrupt tail is cut off
there (the raft log or a peer supplies it again). Memory per queue is a few
numbers per segment: indexes stay on disk and are read on lookup.
"""
from __future__ import annotations

import bisect
import logging
import mmap
import os
import struct
import threading
from dataclasses import dataclass, field

from . import codec

__all__ = ["FileSpan", "QueueLog", "Segment"]

log = logging.getLogger(__name__)

IDX_ENTRY = struct.Struct("<QQ")
SEGMENT_FILES = ("log", "idx", "tix")
TIX_ENTRY = struct.Struct("<qQ")
DEFAULT_CACHE_BYTES = 8 << 20


def _drop_pages(fd: int, start: int, length: int) -> None:
    """Let the kernel drop a synced range of a file from the page cache
    (``length`` 0: to the end). Clean pages only: never loses data.

    Why (``QueueLog``): an append-only log touches new page-cache memory with
    every byte it writes. On this project's VMs (Firecracker, free page
    reporting) memory the guest has not used recently is backed by the host
    on first touch: a write into it cost 1.5-3 CPU s/GB against 0.3 s/GB
    into pages freed a moment before (``bench/README.md``). Dropping what is
    synced keeps a node's page cache from growing with the data written, so
    the kernel reuses those pages for the next appends.
    """
    if hasattr(os, "posix_fadvise"):      # Linux; elsewhere the cache just grows
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)


def _name(base: int, ext: str) -> str:
    return f"{base:020d}.{ext}"


def fsync_dir(path: str) -> None:
    """Make the entries of a directory (files created, renamed, removed) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_pairs(path: str, st: struct.Struct) -> list[tuple[int, int]]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    n = len(data) // st.size
    return [st.unpack_from(data, i * st.size) for i in range(n)]


def _index_position(idx: list[tuple[int, int]], offset: int) -> int:
    """Byte position of the last sparse-index entry at or below ``offset`` (0 if none)."""
    i = bisect.bisect_right([o for o, _ in idx], offset) - 1
    return idx[i][1] if i >= 0 else 0


@dataclass(frozen=True)
class FileSpan:
    """Whole batches in a segment file, as ``QueueLog.locate`` found them."""
    path: str
    position: int
    length: int
    next_offset: int       # the offset after the last record in the span
    inode: int             # of the file the span was found in (a rewrite is a new file)
    device: int


@dataclass
class Segment:
    base: int
    path: str
    next_offset: int
    size: int
    first_ts: int = -1
    last_ts: int = -1
    last_position: int = 0
    fd: int | None = field(default=None, repr=False)

    def file(self, ext: str) -> str:
        return os.path.join(self.path, _name(self.base, ext))

    def open_fd(self) -> int:
        if self.fd is None:
            self.fd = os.open(self.file("log"), os.O_RDONLY)
        return self.fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class QueueLog:
    """An append-only log of record batches for one queue.

    Thread-safety: one writer (the raft apply thread) and many readers; the
    lock guards the segment list and the tail position.
    """

    def __init__(self, path: str, segment_bytes: int = 64 << 20,
                 index_interval: int = 64 << 10, fsync: bool = True,
                 cache_bytes: int = DEFAULT_CACHE_BYTES):
        """``cache_bytes``: how much of the active segment's synced tail stays in
        the page cache for readers that follow the log (``sync_behind``)."""
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
        self._dirty = False
        self._appends = 0     # appends so far (sync_behind: was anything written meanwhile?)
        self._uncached = 0    # active segment: bytes below this were dropped from the page cache
        os.makedirs(path, exist_ok=True)
        self._open()

    # ------------------------------------------------------------------ open
    def _open(self) -> None:
        self._finish_swaps()
        bases = sorted(int(f[:-4]) for f in os.listdir(self.path) if f.endswith(".log"))
        self._earliest = self._read_earliest()
        for base in bases[:-1]:
            self.segments.append(self._open_sealed(base))
        if bases:
            self.segments.append(self._recover_tail(bases[-1]))
        else:
            self._new_segment(self._earliest)
        self._earliest = max(self._earliest, self.segments[0].base)
        self._open_writer()

    def _finish_swaps(self) -> None:
        """Complete a compaction swap cut short by a crash, or drop its leftovers.

        ``replace_segment`` writes ``.cleaned`` files, then a ``.swap`` marker,
        then renames: a marker means the cleaned files are whole (finish the
        renames), no marker means they may not be (delete them).
        """
        names = os.listdir(self.path)
        for f in names:
            if f.endswith(".swap"):
                base = int(f[:-5])
                for ext in SEGMENT_FILES:
                    cleaned = os.path.join(self.path, _name(base, ext) + ".cleaned")
                    if os.path.exists(cleaned):
                        os.replace(cleaned, os.path.join(self.path, _name(base, ext)))
                os.unlink(os.path.join(self.path, f))
                log.warning("queue %s: finished the compaction swap of segment %d after a restart",
                            self.path, base)
        for f in os.listdir(self.path):
            if f.endswith(".cleaned"):
                os.unlink(os.path.join(self.path, f))

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

    def _open_sealed(self, base: int) -> Segment:
        seg = Segment(base, self.path, base, os.path.getsize(os.path.join(self.path, _name(base, "log"))))
        # The last batch gives next offset / last ts; read it via the index.
        idx = _read_pairs(seg.file("idx"), IDX_ENTRY)
        tix = _read_pairs(seg.file("tix"), TIX_ENTRY)
        start = idx[-1][1] if idx else 0
        with open(seg.file("log"), "rb") as f:
            f.seek(start)
            tail = f.read()
        valid, headers = codec.scan_valid_prefix(tail)
        if headers:
            seg.next_offset = headers[-1].next_offset
            seg.last_ts = headers[-1].store_ts
            seg.last_position = headers[-1].apply_position
        seg.first_ts = tix[0][0] if tix else seg.last_ts
        if start + valid != seg.size:
            log.warning("segment %s: %d bytes past the last valid batch in a sealed segment",
                        seg.file("log"), seg.size - start - valid)
        return seg

    def _recover_tail(self, base: int) -> Segment:
        seg = Segment(base, self.path, base, 0)
        with open(seg.file("log"), "rb") as f:
            data = f.read()
        valid, headers = codec.scan_valid_prefix(data)
        if valid != len(data):
            log.warning("queue %s: truncating torn/corrupt tail of %s at byte %d (%d bytes cut)",
                        self.path, seg.file("log"), valid, len(data) - valid)
            with open(seg.file("log"), "r+b") as f:
                f.truncate(valid)
                os.fsync(f.fileno())
        seg.size = valid
        # Rebuild both indexes from the scan: cheap, and they may be torn too.
        idx, tix, since = [], [], self.index_interval
        for h in headers:
            if since >= self.index_interval:
                idx.append((h.base_offset, h.position))
                tix.append((h.store_ts, h.base_offset))
                since = 0
            since += h.size
        self._idx_since = since
        self._rewrite(seg.file("idx"), IDX_ENTRY, idx)
        self._rewrite(seg.file("tix"), TIX_ENTRY, tix)
        # apply position -> (base offset, store ts) of the tail's batches, so a
        # journal replay after restart can answer a retry with real offsets.
        self.recent = {h.apply_position: (h.base_offset, h.store_ts) for h in headers}
        if headers:
            seg.next_offset = headers[-1].next_offset
            seg.first_ts = headers[0].store_ts
            seg.last_ts = headers[-1].store_ts
            seg.last_position = headers[-1].apply_position
        return seg

    @staticmethod
    def _rewrite(path: str, st: struct.Struct, pairs) -> None:
        with open(path, "wb") as f:
            f.write(b"".join(st.pack(*p) for p in pairs))

    def _new_segment(self, base: int) -> Segment:
        seg = Segment(base, self.path, base, 0)
        open(seg.file("log"), "ab").close()
        self._rewrite(seg.file("idx"), IDX_ENTRY, [])
        self._rewrite(seg.file("tix"), TIX_ENTRY, [])
        self.segments.append(seg)
        self._idx_since = self.index_interval
        return seg

    def _open_writer(self) -> None:
        self._close_writer()
        self._uncached = 0        # a new active segment: nothing of it dropped yet
        seg = self.segments[-1]
        self._wfd = os.open(seg.file("log"), os.O_WRONLY | os.O_APPEND)
        # The index files stay open too: opening them per batch was a visible
        # share of apply when most batches cross an index interval.
        self._ifd = os.open(seg.file("idx"), os.O_WRONLY | os.O_APPEND)
        self._tfd = os.open(seg.file("tix"), os.O_WRONLY | os.O_APPEND)

    def _close_writer(self) -> None:
        for fd in (self._wfd, self._ifd, self._tfd):
            if fd is not None:
                os.close(fd)
        self._wfd = self._ifd = self._tfd = None

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

    # --------------------------------------------------------------- writes
    def append(self, frame, h: codec.BatchHeader, gap_ok: bool = False) -> None:
        """Append one framed batch whose base offset must equal next_offset
        (or be past it, with ``gap_ok``: a compacted peer's batch).

        ``frame`` is the batch's bytes, or its parts (``codec.frame_parts``).
        """
        with self.lock:
            if h.base_offset != self.next_offset and not (gap_ok and h.base_offset > self.next_offset):
                raise ValueError(f"append at {h.base_offset} but queue {self.path} is at {self.next_offset}")
            seg = self.segments[-1]
            if seg.size >= self.segment_bytes:
                self._roll()
                seg = self.segments[-1]
            if isinstance(frame, tuple):
                os.writev(self._wfd, frame)
            else:
                os.write(self._wfd, frame)
            if self._idx_since >= self.index_interval:
                os.write(self._ifd, IDX_ENTRY.pack(h.base_offset, seg.size))
                os.write(self._tfd, TIX_ENTRY.pack(h.store_ts, h.base_offset))
                self._idx_since = 0
            self._idx_since += h.size
            seg.size += h.size
            seg.next_offset = h.next_offset
            if seg.first_ts < 0:
                seg.first_ts = h.store_ts
            seg.last_ts = h.store_ts
            seg.last_position = h.apply_position
            self._dirty = True
            self._appends += 1

    def append_frames(self, frames: bytes) -> int:
        """Append already-framed batches (peer catch-up). Returns batches written.

        A compacted peer's batches may start past ``next_offset`` (records
        dropped in between); the gap is kept, offsets never shift.
        """
        n = 0
        mv = memoryview(frames)
        for h in codec.iter_batches(mv):
            self.append(bytes(mv[h.position:h.position + h.size]), h, gap_ok=True)
            n += 1
        return n

    def replace_segment(self, seg: Segment, frames: list[bytes]) -> bool:
        """Swap a sealed segment's batches for ``frames`` (compaction).

        The frames must cover the same offset range (the segment's last record
        kept). Written to ``.cleaned`` files first; returns False and changes
        nothing when the segment was deleted (retention) in the meantime.
        Readers holding the old file keep reading it (``read`` dups the fd).
        """
        cleaned = {ext: seg.file(ext) + ".cleaned" for ext in SEGMENT_FILES}
        idx, tix, pos, since, first_ts = [], [], 0, self.index_interval, -1
        with open(cleaned["log"], "wb") as f:
            for frame in frames:
                h = next(codec.iter_batches(frame, verify=False))
                if since >= self.index_interval:
                    idx.append((h.base_offset, pos))
                    tix.append((h.store_ts, h.base_offset))
                    since = 0
                if first_ts < 0:
                    first_ts = h.store_ts
                f.write(frame)
                since += len(frame)
                pos += len(frame)
            f.flush()
            os.fsync(f.fileno())
        for ext, st, pairs in (("idx", IDX_ENTRY, idx), ("tix", TIX_ENTRY, tix)):
            self._rewrite(cleaned[ext], st, pairs)
            with open(cleaned[ext], "rb+") as f:
                os.fsync(f.fileno())
        with self.lock:
            if not any(s is seg for s in self.segments):
                for path in cleaned.values():
                    os.unlink(path)
                return False
            marker = os.path.join(self.path, f"{seg.base:020d}.swap")
            open(marker, "wb").close()
            fsync_dir(self.path)
            for ext in SEGMENT_FILES:
                os.replace(cleaned[ext], seg.file(ext))
            os.unlink(marker)
            fsync_dir(self.path)
            seg.close()
            seg.size = pos
            seg.first_ts = first_ts
        return True

    def _roll(self) -> None:
        self.sync()
        if self.fsync_enabled:    # a sealed segment is read rarely: all of it leaves the cache
            _drop_pages(self._wfd, 0, 0)
        self._new_segment(self.next_offset)
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
        cache (``_drop_pages``).
        """
        with self.lock:
            if not (self._dirty and self._wfd is not None and self.fsync_enabled):
                return
            seg = self.segments[-1]
            fd, appends, synced = os.dup(self._wfd), self._appends, seg.size
        try:
            os.fdatasync(fd)
            with self.lock:
                if self._appends == appends:
                    self._dirty = False
                drop = self._claim_uncached(synced) if self.segments[-1] is seg else None
            if drop:
                _drop_pages(fd, *drop)
        finally:
            os.close(fd)

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
            return dropped

    def _batch_start(self, offset: int) -> int:
        """Round an offset down to the first offset of the batch holding it."""
        if offset >= self.next_offset:
            return offset
        for h in codec.iter_batches(self.read(offset, 1), verify=False):
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
            self.segments = []
            self._earliest = start
            self._write_earliest(start)
            self._new_segment(start)
            self._open_writer()

    def close(self) -> None:
        with self.lock:
            self.sync()
            self._close_writer()
            for seg in self.segments:
                seg.close()

    # ---------------------------------------------------------------- reads
    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``offset``, about max_bytes (at least one batch).

        After compaction ``offset`` may fall in a gap: the read starts at the
        next batch with a record at or after it.
        """
        data = self.read_view(offset, max_bytes)
        return data if isinstance(data, bytes) else data.tobytes()

    def read_view(self, offset: int, max_bytes: int) -> bytes | memoryview:
        """``read``, but the answer may be a view of what was read from the file
        (the batches before ``offset`` cut off) instead of a copy."""
        return self._in_segments(offset, b"", lambda seg, fd, size, idx, off: self._read_segment(
            seg, fd, size, idx, off, max_bytes))

    def locate(self, offset: int, max_bytes: int) -> FileSpan | None:
        """Where ``read_view(offset, max_bytes)`` would read, without reading the batches.

        For a reader on this host (``storage_service.localread``): whole batches
        from the one holding ``offset``, about ``max_bytes``, within one segment
        (the next call continues in the next). Only batch headers are looked at,
        through a map of the file; the reader CRC-checks what it reads. None
        when nothing is at or after ``offset``.
        """
        def in_segment(seg: Segment, fd: int, size: int, idx, off: int) -> FileSpan | None:
            span = self._span_in(fd, size, idx, off, max_bytes)
            if span is None:
                return None
            first, stop, nxt = span
            st = os.fstat(fd)
            return FileSpan(os.path.abspath(seg.file("log")), first, stop - first, nxt,
                            st.st_ino, st.st_dev)

        return self._in_segments(offset, None, in_segment)

    def _in_segments(self, offset: int, nothing, fn):
        """``fn(segment, fd, size, sparse index, offset)`` on the segment holding
        ``offset``, then on the following ones until it finds something there."""
        while True:
            with self.lock:
                if offset < self._earliest or offset >= self.next_offset:
                    return nothing
                i = max(0, bisect.bisect_right([s.base for s in self.segments], offset) - 1)
                seg = self.segments[i]
                following = self.segments[i + 1].base if i + 1 < len(self.segments) else None
                # A private fd: compaction or retention may close the segment's.
                fd = os.dup(seg.open_fd())
                size = seg.size
                idx = _read_pairs(seg.file("idx"), IDX_ENTRY)
            try:
                out = fn(seg, fd, size, idx, offset)
            finally:
                os.close(fd)
            if out or following is None:
                return out if out else nothing
            offset = max(offset, following)   # nothing at or after offset here: the next segment

    @staticmethod
    def _span_in(fd: int, size: int, idx, offset: int, max_bytes: int) -> tuple[int, int, int] | None:
        """(first, stop, next offset) of the batches ``_read_segment`` would return."""
        if size == 0:
            return None
        pos = _index_position(idx, offset)
        first = stop = nxt = None
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
            while pos < size:
                h = codec.header_at(m, pos)
                if h.last_offset < offset:
                    # CRC-checked as _read_segment does: a bad header must never make
                    # a read jump over data (the reader checks only the span's batches).
                    codec.header_at(m, pos, verify=True)
                    pos += h.size
                    continue
                pos += h.size
                if first is not None and stop - first + h.size > max_bytes:
                    break
                first = h.position if first is None else first
                stop, nxt = h.position + h.size, h.next_offset
        return None if first is None else (first, stop, nxt)

    def _read_segment(self, seg: Segment, fd: int, size: int, idx, offset: int,
                      max_bytes: int) -> bytes | memoryview:
        pos = _index_position(idx, offset)
        out: list[memoryview] = []
        total = 0
        hs = codec.BATCH_HEADER.size
        while pos < size and total < max_bytes:
            first_len = hs + codec.BATCH_HEADER.unpack(os.pread(fd, hs, pos))[0]
            want = min(max(max_bytes - total, first_len, 64 << 10), size - pos)
            data = memoryview(os.pread(fd, want, pos))
            end = self._whole_prefix(data)
            if end == 0:
                raise codec.CorruptBatch(pos, f"segment {seg.file('log')} ends inside a batch")
            # CRC-check every batch parsed, also the ones skipped: a bad header
            # must never make a read silently jump over data.
            first = stop = None
            for h in codec.iter_batches(data[:end]):
                if h.last_offset < offset:
                    continue
                if total and total + h.size > max_bytes:
                    end = 0
                    break
                first = h.position if first is None else first
                stop = h.position + h.size
                total += h.size
            if first is not None:
                out.append(data[first:stop])     # the kept batches are contiguous: one view, no copy
            if end == 0:
                break
            pos += end
        if len(out) == 1:
            return out[0].obj if len(out[0]) == len(out[0].obj) else out[0]
        return b"".join(out)

    @staticmethod
    def _whole_prefix(data: bytes) -> int:
        pos = 0
        hs = codec.BATCH_HEADER.size
        while pos + hs <= len(data):
            body_len = codec.BATCH_HEADER.unpack_from(data, pos)[0]
            if pos + hs + body_len > len(data):
                break
            pos += hs + body_len
        return pos

    def offset_for_timestamp(self, ts: int) -> int:
        """First offset whose store timestamp is >= ts (next_offset if none)."""
        with self.lock:
            segs = list(self.segments)
            earliest = self._earliest
            nxt = self.next_offset
        for seg in segs:
            if seg.last_ts < ts or seg.next_offset <= earliest:
                continue
            start = max(seg.base, earliest)
            tix = _read_pairs(seg.file("tix"), TIX_ENTRY)
            i = bisect.bisect_left([t for t, _ in tix], ts) - 1
            if i >= 0:
                start = max(start, tix[i][1])
            off = start
            while off < seg.next_offset:
                data = self.read(off, 1 << 20)
                if not data:
                    break
                for h in codec.iter_batches(data, verify=False):
                    if h.store_ts >= ts and h.next_offset > earliest:
                        return max(h.base_offset, earliest)
                    off = h.next_offset
        return nxt
