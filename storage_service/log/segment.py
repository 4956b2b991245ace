"""One segment of a queue: its three files, how it is reopened, how its batches are found.

A queue directory holds segments named by their base offset::

    00000000000000000000.log   framed record batches (storage_service.protocol.framing)
    00000000000000000000.idx   sparse offset index: (u64 offset, u64 position)
    00000000000000000000.tix   sparse time index:   (i64 store_ts, u64 offset)

An entry every ``index_interval`` bytes (64 KiB), none for the first batch (it
is at byte 0): a segment under 64 KiB has no index files at all.

The functions here look at one segment file; ``QueueLog`` (``queue_log.py``)
keeps the list of segments, appends and cuts.
"""
from __future__ import annotations

import bisect
import logging
import mmap
import os
import struct
from dataclasses import dataclass, field

from ..protocol import framing

__all__ = ["FileSpan", "IDX_ENTRY", "SEGMENT_FILES", "Segment", "TIX_ENTRY", "check_segment", "finish_swaps",
           "index_entries", "index_position", "open_sealed", "rewrite_index", "read_batch_holding", "read_pairs",
           "read_segment", "recover_tail", "segment_name", "span_in", "write_pairs"]

log = logging.getLogger(__name__)

IDX_ENTRY = struct.Struct("<QQ")
SEGMENT_FILES = ("log", "idx", "tix")
TIX_ENTRY = struct.Struct("<qQ")


def segment_name(base: int, ext: str) -> str:
    return f"{base:020d}.{ext}"


def read_pairs(path: str, st: struct.Struct) -> list[tuple[int, int]]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    n = len(data) // st.size
    return [st.unpack_from(data, i * st.size) for i in range(n)]


def index_position(idx: list[tuple[int, int]], offset: int) -> int:
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
    damaged: bool = False   # a batch failed its CRC (bit rot): repaired from a peer (cluster/repair.py)

    def file(self, ext: str) -> str:
        return os.path.join(self.path, segment_name(self.base, ext))

    def open_fd(self) -> int:
        if self.fd is None:
            self.fd = os.open(self.file("log"), os.O_RDONLY)
        return self.fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def open_sealed(path: str, base: int) -> Segment:
    """A sealed segment, from its files: sizes and the last batch's offsets (read via the index).

    The index is only trusted when the batches from its last entry end exactly
    at the end of the file; otherwise the whole file is scanned: a bad index
    is rebuilt from the batches, a bad batch (bit rot) marks the segment
    ``damaged`` (its batches up to the rot are known; the queue takes its end
    from the next segment, and the repair fetches it from a peer).
    """
    seg = Segment(base, path, base, os.path.getsize(os.path.join(path, segment_name(base, "log"))))
    idx = read_pairs(seg.file("idx"), IDX_ENTRY)
    start = idx[-1][1] if idx else 0
    head_size = framing.BATCH_HEADER.size + framing.BODY_HEADER.size
    with open(seg.file("log"), "rb") as f:
        head = f.read(head_size) if start else b""   # the first batch's store time: it has no index entry
        f.seek(start)
        tail = f.read()
    valid, headers = framing.scan_valid_prefix(tail)
    if (start + valid != seg.size or (seg.size and not headers)
            or (headers and idx and headers[0].base_offset != idx[-1][0])):
        headers = _rescan(seg)
        start = 0
    if headers:
        seg.next_offset = headers[-1].next_offset
        seg.last_ts = headers[-1].store_ts
        seg.last_position = headers[-1].apply_position
    seg.first_ts = seg.last_ts
    if headers and start == 0:
        seg.first_ts = headers[0].store_ts
    elif len(head) == head_size:
        seg.first_ts = framing.BODY_HEADER.unpack_from(head, framing.BATCH_HEADER.size)[1]
    return seg


def _rescan(seg: Segment) -> list:
    """The whole segment scanned: its index rebuilt if the batches are whole, else marked damaged."""
    with open(seg.file("log"), "rb") as f:
        data = f.read()
    valid, headers = framing.scan_valid_prefix(data)
    if valid != len(data):
        seg.damaged = True
        log.error("segment %s: batch at byte %d of %d fails its check (bit rot?): %d batches before it "
                  "are readable; the segment will be repaired from a peer", seg.file("log"), valid,
                  len(data), len(headers))
        return headers
    idx, tix, _ = index_entries(headers)
    rewrite_index(seg, idx, tix)
    log.warning("segment %s: its index did not match its batches; rebuilt from them", seg.file("log"))
    return headers


def index_entries(headers, interval: int = 64 << 10) -> tuple[list, list, int]:
    """The sparse offset and time index entries of these batches, and the bytes
    after the last offset-index entry. A segment's first batch, at byte 0, has none."""
    idx, tix, since = [], [], 0
    for h in headers:
        if since >= interval:
            idx.append((h.base_offset, h.position))
            tix.append((h.store_ts, h.base_offset))
            since = 0
        since += h.size
    return idx, tix, since


def rewrite_index(seg: Segment, idx, tix) -> None:
    """Replace a sealed segment's index files (written aside, synced, renamed)."""
    for ext, st, pairs in (("idx", IDX_ENTRY, idx), ("tix", TIX_ENTRY, tix)):
        tmp = seg.file(ext) + ".rebuilt"
        with open(tmp, "wb") as f:
            f.write(b"".join(st.pack(*p) for p in pairs))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, seg.file(ext))


def check_segment(seg: Segment, size: int) -> tuple[bool, bool, list]:
    """(batches whole, index consistent, headers) of the first ``size`` bytes of a
    segment: the scrub's look at data nobody reads. Every index entry must name
    a batch at its position (offset index) or its offset and store time (time index)."""
    with open(seg.file("log"), "rb") as f:
        data = f.read(size)
    valid, headers = framing.scan_valid_prefix(data)
    at = {(h.base_offset, h.position) for h in headers}
    stamped = {(h.store_ts, h.base_offset) for h in headers}
    end = headers[-1].next_offset if headers else seg.base     # what was read: appends go on
    idx = read_pairs(seg.file("idx"), IDX_ENTRY)
    tix = read_pairs(seg.file("tix"), TIX_ENTRY)
    index_ok = (all(e in at for e in idx if e[1] < valid) and all(e in stamped for e in tix if e[1] < end)
                and idx == sorted(idx) and tix == sorted(tix))
    return valid == len(data), index_ok, headers


def recover_tail(path: str, base: int, index_interval: int) -> tuple[Segment, int, dict[int, tuple[int, int]]]:
    """The active segment after a restart: a torn or corrupt tail cut off, both indexes rebuilt.

    Returns the segment, the bytes since its last offset-index entry, and apply
    position -> (base offset, store ts) of its batches (a journal replay after a
    restart answers a retry with real offsets from it).
    """
    seg = Segment(base, path, base, 0)
    with open(seg.file("log"), "rb") as f:
        data = f.read()
    valid, headers = framing.scan_valid_prefix(data)
    if valid != len(data):
        log.warning("queue %s: truncating torn/corrupt tail of %s at byte %d (%d bytes cut)",
                    path, seg.file("log"), valid, len(data) - valid)
        with open(seg.file("log"), "r+b") as f:
            f.truncate(valid)
            os.fsync(f.fileno())
    seg.size = valid
    # Rebuild both indexes from the scan: cheap, and they may be torn too.
    idx, tix, since = index_entries(headers, index_interval)
    write_pairs(seg.file("idx"), IDX_ENTRY, idx)
    write_pairs(seg.file("tix"), TIX_ENTRY, tix)
    # apply position -> (base offset, store ts) of the tail's batches, so a
    # journal replay after restart can answer a retry with real offsets.
    recent = {h.apply_position: (h.base_offset, h.store_ts) for h in headers}
    if headers:
        seg.next_offset = headers[-1].next_offset
        seg.first_ts = headers[0].store_ts
        seg.last_ts = headers[-1].store_ts
        seg.last_position = headers[-1].apply_position
    return seg, since, recent


def write_pairs(path: str, st: struct.Struct, pairs) -> None:
    """Replace an index file's entries (none and no file: nothing is made)."""
    if not pairs and not os.path.exists(path):
        return
    with open(path, "wb") as f:
        f.write(b"".join(st.pack(*p) for p in pairs))


def span_in(fd: int, size: int, idx, offset: int, max_bytes: int) -> tuple[int, int, int] | None:
    """(first, stop, next offset) of the batches ``read_segment`` would return."""
    if size == 0:
        return None
    pos = start = index_position(idx, offset)
    first = stop = nxt = None
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
        while pos < size:
            h = framing.header_at(m, pos)
            if pos == start and start:
                h = framing.header_at(m, pos, verify=True)
                if h.base_offset > offset:
                    raise framing.CorruptBatch(start, f"the offset index points to byte {start}, "
                                                      f"a batch past offset {offset}")
            if h.last_offset < offset:
                # CRC-checked as _read_segment does: a bad header must never make
                # a read jump over data (the reader checks only the span's batches).
                framing.header_at(m, pos, verify=True)
                pos += h.size
                continue
            pos += h.size
            if first is not None and stop - first + h.size > max_bytes:
                break
            first = h.position if first is None else first
            stop, nxt = h.position + h.size, h.next_offset
    return None if first is None else (first, stop, nxt)


def read_segment(seg: Segment, fd: int, size: int, idx, offset: int,
                  max_bytes: int) -> bytes | memoryview:
    pos = start = index_position(idx, offset)
    out: list[memoryview] = []
    total = 0
    hs = framing.BATCH_HEADER.size
    while pos < size and total < max_bytes:
        first_len = hs + framing.BATCH_HEADER.unpack(os.pread(fd, hs, pos))[0]
        want = min(max(max_bytes - total, first_len, 64 << 10), size - pos)
        data = memoryview(os.pread(fd, want, pos))
        end = _whole_prefix(data)
        if end == 0:
            raise framing.CorruptBatch(pos, f"segment {seg.file('log')} ends inside a batch")
        # CRC-check every batch parsed, also the ones skipped: a bad header
        # must never make a read silently jump over data.
        first = stop = None
        for h in framing.iter_batches(data[:end]):
            if pos == start:
                _landed(seg, start, h, offset)
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


def read_batch_holding(fd: int, size: int, idx, offset: int, span: int = 128 << 10) -> bytes | None:
    """The one batch holding ``offset``, CRC-checked, found by its neighbours' headers
    alone; None when that is not sure (``offset`` in a compaction gap, a header that
    does not add up, the batch beyond ``span`` bytes of the index entry): the caller
    reads the ``read_segment`` way, which checks every batch it passes.

    A get of one key's revision read up to 64 KiB from the sparse index's entry and
    parsed and CRC-checked every batch there (some 400 for 100-byte puts): most of
    a get's CPU. Walking lengths and base offsets skips that; the batch answered is
    checked, and it must hold ``offset``, so a bad length in a skipped header can
    only send the read to the careful path, never answer other data."""
    pos = index_position(idx, offset)
    data = os.pread(fd, min(span, size - pos), pos)
    hs = framing.BATCH_HEADER.size
    p, found = 0, None
    while p + hs + framing.BODY_HEADER.size <= len(data):
        body_len = framing.BATCH_HEADER.unpack_from(data, p)[0]
        if body_len < framing.BODY_HEADER.size:
            return None
        if framing.BODY_HEADER.unpack_from(data, p + hs)[0] > offset:
            break
        found, p = p, p + hs + body_len
    else:
        if p != len(data) or pos + p != size:       # the span ended before a later batch
            return None
    if found is None:
        return None
    try:                                            # lengths and CRC (a truncated body too)
        h = framing.header_at(data, found, verify=True)
    except framing.CorruptBatch:
        return None
    return data[found:found + h.size] if h.base_offset <= offset <= h.last_offset else None


def _landed(seg: Segment, start: int, h: framing.BatchHeader, offset: int) -> None:
    """The first batch of a read that started where the offset index said must begin
    at or before ``offset``: a corrupt index entry must never make a read skip records."""
    if start and h.position == 0 and h.base_offset > offset:
        raise framing.CorruptBatch(start, f"the offset index of {seg.file('log')} points to byte {start}, "
                                          f"a batch past offset {offset}")


def _whole_prefix(data: bytes) -> int:
    pos = 0
    hs = framing.BATCH_HEADER.size
    while pos + hs <= len(data):
        body_len = framing.BATCH_HEADER.unpack_from(data, pos)[0]
        if pos + hs + body_len > len(data):
            break
        pos += hs + body_len
    return pos


def finish_swaps(path: str) -> None:
    """Complete a compaction swap in queue directory ``path`` cut short by a crash,
    or drop its leftovers.

    ``QueueLog.replace_segment`` writes ``.cleaned`` files, then a ``.swap``
    marker, then renames: a marker means the cleaned files are whole (finish the
    renames), no marker means they may not be (delete them).
    """
    for f in os.listdir(path):
        if f.endswith(".swap"):
            base = int(f[:-5])
            for ext in SEGMENT_FILES:
                cleaned = os.path.join(path, segment_name(base, ext) + ".cleaned")
                if os.path.exists(cleaned):
                    os.replace(cleaned, os.path.join(path, segment_name(base, ext)))
            os.unlink(os.path.join(path, f))
            log.warning("queue %s: finished the compaction swap of segment %d after a restart", path, base)
    for f in os.listdir(path):
        if f.endswith(".cleaned"):
            os.unlink(os.path.join(path, f))
