"""QueueLog: append, read, seek by time, retention, recovery (storage_service.log.queue_log)."""
from __future__ import annotations

import os

import pytest

from storage_service.protocol.framing import CorruptBatch, frame_batch, iter_batches
from storage_service.log.queue_log import QueueLog

from ._helpers import encode_values, iter_values

pytestmark = pytest.mark.unit

PER_BATCH = 5


def _append(q: QueueLog, ts: int = 1000, n: int = PER_BATCH) -> bytes:
    base = q.next_offset
    msgs = [f"m{base + i:06d}".encode() for i in range(n)]
    frame = frame_batch(base, ts, n, base + 1, encode_values(msgs))
    q.append(frame, next(iter_batches(frame)))
    return frame


def _fill(q: QueueLog, batches: int, ts0: int = 1000) -> list[bytes]:
    return [_append(q, ts=ts0 + i) for i in range(batches)]


def _read_all(q: QueueLog, start: int | None = None, max_bytes: int = 1 << 20) -> list[int]:
    """Offsets of every record from ``start`` to the end, checking payloads."""
    off = q.earliest if start is None else start
    out: list[int] = []
    while off < q.next_offset:
        data = q.read(off, max_bytes)
        assert data, f"read({off}) returned nothing before next_offset {q.next_offset}"
        for o, _, m in iter_values(data, off):
            assert bytes(m) == f"m{o:06d}".encode()
            out.append(o)
        off = out[-1] + 1
    return out


def _log_files(path) -> list[str]:
    return sorted(f for f in os.listdir(path) if f.endswith(".log"))


@pytest.fixture
def qpath(tmp_path):
    return str(tmp_path / "t~inc~0")


def test_new_queue_is_empty(qpath):
    q = QueueLog(qpath, fsync=False)
    assert (q.earliest, q.next_offset, q.last_ts, q.last_position) == (0, 0, -1, 0)
    assert q.read(0, 1 << 20) == b""


def test_append_then_read_returns_the_frame_bytes(qpath):
    q = QueueLog(qpath, fsync=False)
    frame = _append(q, ts=42)
    assert q.read(0, 1 << 20) == frame
    assert (q.next_offset, q.last_ts, q.last_position) == (PER_BATCH, 42, 1)


def test_append_at_wrong_offset_is_rejected(qpath):
    q = QueueLog(qpath, fsync=False)
    _append(q)
    frame = frame_batch(99, 0, 1, 9, encode_values([b"x"]))
    with pytest.raises(ValueError, match="append at 99"):
        q.append(frame, next(iter_batches(frame)))
    assert q.next_offset == PER_BATCH
    assert q.size_bytes == os.path.getsize(os.path.join(qpath, _log_files(qpath)[0]))


def test_read_across_many_batches_and_segment_rolls(qpath):
    q = QueueLog(qpath, segment_bytes=300, fsync=False)
    _fill(q, 40)
    assert len(q.segments) > 5
    assert len(_log_files(qpath)) == len(q.segments)
    assert _read_all(q) == list(range(40 * PER_BATCH))


def test_segments_are_named_by_base_offset(qpath):
    q = QueueLog(qpath, segment_bytes=300, fsync=False)
    _fill(q, 10)
    assert _log_files(qpath) == [f"{s.base:020d}.log" for s in q.segments]
    assert [s.base for s in q.segments] == sorted({s.base for s in q.segments})


def test_read_from_inside_a_batch_returns_the_whole_batch(qpath):
    q = QueueLog(qpath, fsync=False)
    frames = _fill(q, 3)
    assert q.read(PER_BATCH + 2, 1) == frames[1]


def test_read_returns_at_least_one_batch_and_respects_max_bytes(qpath):
    q = QueueLog(qpath, fsync=False)
    frames = _fill(q, 10)
    assert q.read(0, 1) == frames[0]
    assert q.read(0, 2 * len(frames[0])) == frames[0] + frames[1]
    assert q.read(0, 2 * len(frames[0]) + 1) == frames[0] + frames[1]


def test_read_with_small_max_bytes_still_sees_everything(qpath):
    q = QueueLog(qpath, segment_bytes=300, index_interval=100, fsync=False)
    _fill(q, 30)
    assert _read_all(q, max_bytes=1) == list(range(30 * PER_BATCH))


def test_read_outside_the_log_is_empty(qpath):
    q = QueueLog(qpath, fsync=False)
    _fill(q, 2)
    assert q.read(q.next_offset, 1 << 20) == b""
    assert q.read(q.next_offset + 100, 1 << 20) == b""


def test_offset_for_timestamp_is_first_offset_at_or_after_ts(qpath):
    q = QueueLog(qpath, segment_bytes=300, index_interval=100, fsync=False)
    for ts in (100, 100, 200, 200, 300, 400, 400, 500, 600, 700):
        _append(q, ts=ts)
    assert q.offset_for_timestamp(0) == 0
    assert q.offset_for_timestamp(100) == 0
    assert q.offset_for_timestamp(101) == 2 * PER_BATCH
    assert q.offset_for_timestamp(400) == 5 * PER_BATCH
    assert q.offset_for_timestamp(650) == 9 * PER_BATCH
    assert q.offset_for_timestamp(700) == 9 * PER_BATCH


def test_offset_for_timestamp_after_the_last_is_next_offset(qpath):
    q = QueueLog(qpath, fsync=False)
    _fill(q, 3, ts0=100)
    assert q.offset_for_timestamp(10_000) == q.next_offset
    assert QueueLog(qpath + "-empty", fsync=False).offset_for_timestamp(0) == 0


def test_offset_for_timestamp_never_goes_below_earliest(qpath):
    q = QueueLog(qpath, segment_bytes=300, fsync=False)
    _fill(q, 20, ts0=100)
    q.truncate_prefix(q.segments[2].base + 1)
    assert q.offset_for_timestamp(0) == q.earliest


def test_truncate_prefix_deletes_whole_segments_below(qpath):
    q = QueueLog(qpath, segment_bytes=300, fsync=False)
    _fill(q, 20)
    third = q.segments[2].base
    before = len(q.segments)
    assert q.truncate_prefix(third) == 2
    assert (q.earliest, len(q.segments), q.segments[0].base) == (third, before - 2, third)
    assert _log_files(qpath)[0] == f"{third:020d}.log"
    assert _read_all(q) == list(range(third, 20 * PER_BATCH))


def test_truncate_prefix_inside_a_batch_rounds_down_to_the_batch_start(qpath):
    q = QueueLog(qpath, segment_bytes=300, fsync=False)
    _fill(q, 20)
    batch_start = q.segments[1].base
    assert q.truncate_prefix(batch_start + 3) == 1
    assert q.earliest == batch_start      # replicas can copy whole batches from here
    assert q.read(batch_start - 1, 1 << 20) == b""
    assert _read_all(q)[0] == batch_start


def test_truncate_prefix_never_deletes_the_active_segment(qpath):
    q = QueueLog(qpath, segment_bytes=300, fsync=False)
    _fill(q, 20)
    end = q.next_offset
    q.truncate_prefix(end + 1000)
    assert (q.earliest, q.next_offset, len(q.segments)) == (end, end, 1)
    _append(q)
    assert _read_all(q) == list(range(end, end + PER_BATCH))


def test_truncate_prefix_backwards_is_a_no_op(qpath):
    q = QueueLog(qpath, segment_bytes=300, fsync=False)
    _fill(q, 20)
    q.truncate_prefix(30)
    assert q.truncate_prefix(10) == 0
    assert q.earliest == 30


def test_truncate_prefix_survives_reopen(qpath):
    q = QueueLog(qpath, segment_bytes=300, fsync=False)
    _fill(q, 20)
    q.truncate_prefix(q.segments[1].base + 2)
    earliest, nxt = q.earliest, q.next_offset
    q.close()
    q2 = QueueLog(qpath, segment_bytes=300, fsync=False)
    assert (q2.earliest, q2.next_offset) == (earliest, nxt)
    assert _read_all(q2) == list(range(earliest, nxt))


def test_reset_drops_everything_and_continues_at_start(qpath):
    q = QueueLog(qpath, segment_bytes=300, fsync=False)
    _fill(q, 20)
    q.reset(500)
    assert (q.earliest, q.next_offset, len(q.segments)) == (500, 500, 1)
    assert _log_files(qpath) == [f"{500:020d}.log"]
    assert q.read(0, 1 << 20) == b""
    _fill(q, 2)
    assert _read_all(q) == list(range(500, 500 + 2 * PER_BATCH))


def test_reset_survives_reopen(qpath):
    q = QueueLog(qpath, fsync=False)
    _fill(q, 3)
    q.reset(77)
    q.close()
    q2 = QueueLog(qpath, fsync=False)
    assert (q2.earliest, q2.next_offset) == (77, 77)


def test_reopen_after_close_restores_state_and_appends_continue(qpath):
    q = QueueLog(qpath, segment_bytes=300)
    _fill(q, 25, ts0=100)
    state = (q.earliest, q.next_offset, q.last_ts, q.last_position, len(q.segments), q.size_bytes)
    q.close()
    q2 = QueueLog(qpath, segment_bytes=300)
    assert (q2.earliest, q2.next_offset, q2.last_ts, q2.last_position,
            len(q2.segments), q2.size_bytes) == state
    _append(q2)
    assert _read_all(q2) == list(range(26 * PER_BATCH))


def test_reopen_restores_per_segment_timestamps(qpath):
    q = QueueLog(qpath, segment_bytes=300, fsync=False)
    _fill(q, 20, ts0=100)
    summary = [(s.base, s.next_offset, s.first_ts, s.last_ts) for s in q.segments]
    q.close()
    q2 = QueueLog(qpath, segment_bytes=300, fsync=False)
    assert [(s.base, s.next_offset, s.first_ts, s.last_ts) for s in q2.segments] == summary


# ------------------------------------------------------------------ recovery
def _tail_file(qpath) -> str:
    return os.path.join(qpath, _log_files(qpath)[-1])


def _last_batch(path: str):
    with open(path, "rb") as f:
        return list(iter_batches(f.read()))[-1]


def _damaged_queue(qpath, damage) -> tuple[QueueLog, int]:
    """Write 20 batches over several segments, damage the tail, reopen."""
    q = QueueLog(qpath, segment_bytes=300, fsync=False)
    _fill(q, 20)
    q.close()
    tail = _tail_file(qpath)
    last = _last_batch(tail)
    damage(tail, last)
    return QueueLog(qpath, segment_bytes=300, fsync=False), last


def _tear(path, last):
    with open(path, "r+b") as f:
        f.truncate(last.position + last.size // 2)


def _flip_payload_byte(path, last):
    with open(path, "r+b") as f:
        f.seek(last.position + last.size - 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("damage", [_tear, _flip_payload_byte], ids=["torn", "corrupt"])
def test_damaged_tail_is_cut_and_earlier_data_intact(qpath, damage):
    q, last = _damaged_queue(qpath, damage)
    assert q.next_offset == last.base_offset
    assert os.path.getsize(_tail_file(qpath)) == last.position
    assert _read_all(q) == list(range(last.base_offset))


@pytest.mark.parametrize("damage", [_tear, _flip_payload_byte], ids=["torn", "corrupt"])
def test_appends_continue_at_the_cut_after_damaged_tail(qpath, damage):
    q, last = _damaged_queue(qpath, damage)
    _fill(q, 3)
    assert _read_all(q) == list(range(last.base_offset + 3 * PER_BATCH))
    q.close()
    q2 = QueueLog(qpath, segment_bytes=300, fsync=False)
    assert _read_all(q2) == list(range(last.base_offset + 3 * PER_BATCH))


def test_tail_torn_inside_the_frame_header_is_cut(qpath):
    q = QueueLog(qpath, fsync=False)
    frames = _fill(q, 3)
    q.close()
    with open(_tail_file(qpath), "ab") as f:
        f.write(frames[0][:5])
    q2 = QueueLog(qpath, fsync=False)
    assert q2.next_offset == 3 * PER_BATCH
    assert os.path.getsize(_tail_file(qpath)) == sum(map(len, frames))


# Byte positions inside a frame: u32 len | u32 crc | u64 base | i64 ts | u32 count | ...
CRC_AT, BASE_AT, TS_AT, COUNT_AT = 4, 8, 16, 24


@pytest.mark.parametrize("where,mask", [
    ("payload", 0xFF), (CRC_AT, 0xFF), (TS_AT, 0xFF), (COUNT_AT, 0xFF),
    (BASE_AT, PER_BATCH),          # base 5 -> 0: the header now claims offsets 0..4
], ids=["payload", "crc", "store_ts", "count", "base_offset"])
def test_corrupt_byte_in_sealed_segment_is_never_served(qpath, where, mask):
    q = QueueLog(qpath, segment_bytes=300, fsync=False)
    _fill(q, 20)
    assert len(q.segments) > 2
    q.close()
    first = os.path.join(qpath, _log_files(qpath)[0])
    with open(first, "rb") as f:
        victim = [h for h in iter_batches(f.read()) if h.base_offset == PER_BATCH][0]
    pos = victim.position + (victim.size - 1 if where == "payload" else where)
    with open(first, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ mask]))
    q2 = QueueLog(qpath, segment_bytes=300, fsync=False)
    with pytest.raises(CorruptBatch):
        q2.read(PER_BATCH, 1 << 20)


def test_append_of_frame_parts_equals_append_of_the_frame(tmp_path):
    from storage_service.protocol.framing import frame_parts
    a, b = QueueLog(str(tmp_path / "a"), 4096), QueueLog(str(tmp_path / "b"), 4096)
    for i in range(50):       # many index intervals and segment rolls
        block = encode_values([f"v{i}-{j}".encode() * 20 for j in range(3)])
        parts = frame_parts(a.next_offset, 1000 + i, 3, i + 1, block)
        frame = b"".join(parts)
        a.append(parts, next(iter_batches(frame)))
        b.append(frame, next(iter_batches(frame)))
    assert a.read(0, 1 << 20) == b.read(0, 1 << 20) and a.next_offset == 150
    assert len(a.segments) > 1 and a.offset_for_timestamp(1030) == b.offset_for_timestamp(1030) == 90
    for q in (a, b):
        q.close()
    names = sorted(os.listdir(tmp_path / "a"))
    assert names == sorted(os.listdir(tmp_path / "b"))
    for n in names:
        assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes()


# ------------------------------------------------ locate (short-circuit reads)

def _span_bytes(span) -> bytes:
    with open(span.path, "rb") as f:
        f.seek(span.position)
        return f.read(span.length)


@pytest.mark.parametrize("max_bytes", [1, 170, 1 << 20])
def test_locate_points_at_the_bytes_read_would_return(qpath, max_bytes):
    q = QueueLog(qpath, segment_bytes=600, index_interval=100, fsync=False)
    _fill(q, 30)
    off = 0
    while off < q.next_offset:
        span = q.locate(off, max_bytes)
        got = _span_bytes(span)
        # read() may go on into the next segment; locate stops at a segment's end
        assert q.read(off, max_bytes).startswith(got) and got
        last = list(iter_batches(got))[-1]
        assert span.next_offset == last.next_offset
        st = os.stat(span.path)
        assert (span.inode, span.device) == (st.st_ino, st.st_dev)
        off = span.next_offset
    assert off == q.next_offset


def test_locate_from_inside_a_batch_starts_at_that_batch(qpath):
    q = QueueLog(qpath, fsync=False)
    frames = _fill(q, 3)
    span = q.locate(PER_BATCH + 2, 1)
    assert _span_bytes(span) == frames[1] and span.next_offset == 2 * PER_BATCH


def test_locate_outside_the_log_is_none(qpath):
    q = QueueLog(qpath, segment_bytes=300, fsync=False)
    assert q.locate(0, 1 << 20) is None                  # empty
    _fill(q, 10)
    q.truncate_prefix(3 * PER_BATCH)
    assert q.locate(q.next_offset, 1 << 20) is None
    assert q.locate(q.earliest - 1, 1 << 20) is None
    assert q.locate(q.earliest, 1 << 20) is not None


def _one_record_batches(q: QueueLog, n: int) -> int:
    """n batches of one record each; the size of one frame."""
    frames = [_append(q, n=1) for _ in range(n)]
    return len(frames[0])


def _sealed_one_record_batches(qpath) -> tuple[QueueLog, int]:
    """A queue whose first segment, sealed, holds 3 one-record batches (offsets 0-2),
    and the size of one frame. A read in a sealed segment starts at its offset
    index's entry (here byte 0) and parses every batch from there."""
    size = len(frame_batch(0, 1000, 1, 1, encode_values([b"m000000"])))
    q = QueueLog(qpath, 3 * size, fsync=False)
    _one_record_batches(q, 4)                         # the 4th rolls to a new segment
    assert len(q.segments) == 2
    return q, size


def test_locate_never_jumps_over_a_batch_with_a_bad_header(qpath):
    # Batch 0's length made to cover batch 1: a read at offset 1 must fail as
    # read() does, not answer a span starting at batch 2.
    q, size = _sealed_one_record_batches(qpath)
    with open(q.segments[0].file("log"), "r+b") as f:
        f.write((2 * size - 8).to_bytes(4, "little"))
    with pytest.raises(CorruptBatch):
        q.read(1, 1 << 20)
    with pytest.raises(CorruptBatch, match="crc mismatch"):
        q.locate(1, 1 << 20)


def test_a_read_near_the_end_starts_at_its_batch(qpath):
    """In the active segment the queue knows where each batch it appended since the last
    offset-index entry starts: a read there starts at its batch, so a rotten batch
    before it is not on its way (the scrub finds that one)."""
    q = QueueLog(qpath, fsync=False)
    size = _one_record_batches(q, 3)
    with open(q.segments[0].file("log"), "r+b") as f:
        f.write((2 * size - 8).to_bytes(4, "little"))
    assert [(o, v) for o, _, v in iter_values(q.read(1, 1 << 20), 1)] == [(1, b"m000001"), (2, b"m000002")]
    with pytest.raises(CorruptBatch):
        q.read(0, 1 << 20)


def test_locate_on_a_corrupt_header_raises_corrupt_batch_not_buffer_error(qpath):
    # locate maps the file; nothing may keep a view of the map alive past the error
    q, size = _sealed_one_record_batches(qpath)
    with open(q.segments[0].file("log"), "r+b") as f:
        f.seek(size + 8 + 16)                         # batch 1's record count
        f.write((0).to_bytes(4, "little"))
    with pytest.raises(CorruptBatch, match="empty batch"):
        q.locate(2, 1 << 20)


def test_locate_answers_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    q = QueueLog("rel~inc~0", fsync=False)
    _fill(q, 2)
    assert os.path.isabs(q.locate(0, 1 << 20).path)


# ------------------------------------------------------- background sync
def _count_fdatasync(monkeypatch, during=None) -> list[int]:
    calls = []
    real = os.fdatasync

    def fdatasync(fd):
        calls.append(fd)
        if during is not None:
            during()
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return calls


def test_sync_behind_syncs_the_active_segment_once_and_leaves_it_clean(qpath, monkeypatch):
    q = QueueLog(qpath, fsync=True)
    _fill(q, 3)
    calls = _count_fdatasync(monkeypatch)
    q.sync_behind()
    assert len(calls) == 1 and calls[0] != q._wfd      # a duplicate of the writer's descriptor
    q.sync_behind()
    q.sync()                                          # nothing left for the raft thread's sync
    assert len(calls) == 1
    assert _read_all(q) == list(range(3 * PER_BATCH))


def test_an_append_during_sync_behind_keeps_the_queue_dirty(qpath, monkeypatch):
    q = QueueLog(qpath, fsync=True)
    _fill(q, 1)
    calls = _count_fdatasync(monkeypatch, during=lambda: _append(q) if len(calls) == 1 else None)
    q.sync_behind()                                   # an append lands while it syncs
    q.sync()                                          # so the next sync still writes it out
    assert len(calls) == 2
    assert _read_all(q) == list(range(2 * PER_BATCH))


def test_sync_behind_without_fsync_or_data_does_nothing(qpath, monkeypatch):
    calls = _count_fdatasync(monkeypatch)
    QueueLog(qpath, fsync=True).sync_behind()         # nothing appended
    q = QueueLog(qpath + "-nosync", fsync=False)
    _fill(q, 2)
    q.sync_behind()
    assert calls == []


# ---------------------------------------------------------- page-cache drop
def _cached_bytes(path: str) -> int:
    """Bytes of ``path`` resident in the page cache (Linux ``mincore``)."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    if not size:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vec.raw) * page
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def _append_big(q: QueueLog, batches: int, size: int = 64 << 10) -> None:
    for _ in range(batches):
        base = q.next_offset
        frame = frame_batch(base, 1000, 1, base + 1, encode_values([os.urandom(size)]))
        q.append(frame, next(iter_batches(frame)))


needs_linux = pytest.mark.skipif(not hasattr(os, "posix_fadvise"),
                                 reason="page-cache residency (mincore/fadvise) is Linux only")


@needs_linux
def test_sync_behind_drops_synced_data_but_the_cached_tail_from_the_page_cache(qpath):
    q = QueueLog(qpath, fsync=True, cache_bytes=1 << 20)
    _append_big(q, 64)                                # ~4 MiB, all of it in the page cache
    path = q.segments[-1].file("log")
    assert _cached_bytes(path) >= 4 << 20
    q.sync_behind()
    assert (1 << 20) <= _cached_bytes(path) <= (1 << 20) + 2 * mmap_page()
    _append_big(q, 32)                                # new appends are cached until synced
    assert _cached_bytes(path) >= 3 << 20
    q.sync_behind()
    assert _cached_bytes(path) <= (1 << 20) + 2 * mmap_page()
    data = open(path, "rb").read()                    # what left the cache is on disk, intact
    assert sum(1 for _ in iter_batches(data)) == 96 and len(data) == q.segments[-1].size


@needs_linux
def test_a_rolled_segment_leaves_the_page_cache_and_still_reads_back(qpath):
    q = QueueLog(qpath, segment_bytes=2 << 20, fsync=True, cache_bytes=1 << 20)
    _append_big(q, 40)                                # rolls at 2 MiB
    assert len(q.segments) >= 2
    sealed = q.segments[0].file("log")
    assert _cached_bytes(sealed) == 0
    assert [h.base_offset for h in iter_batches(open(sealed, "rb").read())] == \
        list(range(q.segments[0].base, q.segments[1].base))


@needs_linux
def test_nothing_leaves_the_page_cache_without_fsync(qpath):
    q = QueueLog(qpath, fsync=False, cache_bytes=0)   # nothing is synced: nothing is dropped
    _append_big(q, 32)
    q.sync_behind()
    assert _cached_bytes(q.segments[-1].file("log")) >= 2 << 20


@needs_linux
def test_a_roll_during_sync_behind_drops_nothing_of_the_new_segment(qpath, monkeypatch):
    q = QueueLog(qpath, segment_bytes=2 << 20, fsync=True, cache_bytes=0)
    _append_big(q, 20)                                # ~1.3 MiB in segment 0
    first, fired = q.segments[-1], []

    def roll_once():
        if not fired:
            fired.append(1)
            _append_big(q, 20)

    _count_fdatasync(monkeypatch, during=roll_once)
    q.sync_behind()                                   # segment 0 rolls while it syncs
    assert len(q.segments) == 2 and q.segments[0] is first
    assert q._uncached == 0                           # the new segment's bookkeeping untouched
    assert _cached_bytes(q.segments[-1].file("log")) > 0


def mmap_page() -> int:
    import mmap
    return mmap.PAGESIZE


@needs_linux
def test_a_slow_queue_synced_a_little_at_a_time_still_leaves_the_page_cache(qpath):
    """Each sync adds less than a page: the ranges dropped must still cover
    whole pages (the kernel keeps a page a range covers in part)."""
    q = QueueLog(qpath, fsync=True, cache_bytes=0)
    for _ in range(200):                              # ~200 x 300 B, a sync after each
        _append_big(q, 1, size=300)
        q.sync_behind()
    path = q.segments[-1].file("log")
    assert os.path.getsize(path) > 12 * mmap_page()
    assert _cached_bytes(path) <= mmap_page()         # at most the page still being filled


@needs_linux
def test_reset_starts_the_new_active_segment_with_nothing_dropped(qpath):
    q = QueueLog(qpath, fsync=True, cache_bytes=0)
    _append_big(q, 16)
    q.sync_behind()
    assert q._uncached > 0
    q.reset(1000)                                     # e.g. a snapshot install
    assert q._uncached == 0
    _append_big(q, 16)                                # ~1 MiB in the new segment
    q.sync_behind()
    assert _cached_bytes(q.segments[-1].file("log")) <= mmap_page()


def test_index_files_come_with_the_first_entry_and_a_failed_one_is_a_shortage(qpath, monkeypatch):
    """A segment's first batch (byte 0) has no index entry: a small queue has its
    directory and .log only. The files are made with the first entry; when making them
    fails for want of descriptors, the append is a Shortage (put off and retried) and
    the queue is as before it."""
    import errno

    from storage_service.log.diskspace import Shortage

    q = QueueLog(qpath, segment_bytes=4 << 10, index_interval=256, fsync=False)
    _append(q)
    assert sorted(os.listdir(qpath)) == ["00000000000000000000.log"]
    _fill(q, 60)                                   # rolls: the old segments got index entries
    assert len(_log_files(qpath)) > 1 and any(f.endswith(".idx") for f in os.listdir(qpath))
    while any(f.startswith(f"{q.segments[-1].base:020d}.") and f.endswith(".idx") for f in os.listdir(qpath)):
        _append(q)                                 # until a new segment without index files
    real_open = os.open

    def no_descriptor(path, flags, *a):
        if path.endswith((".idx", ".tix")) and flags & os.O_CREAT:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, *a)
    monkeypatch.setattr(os, "open", no_descriptor)
    before, size = q.next_offset, q.segments[-1].size
    with pytest.raises(Shortage):
        for _ in range(20):                        # until one crosses the index interval
            _append(q)
    assert q.segments[-1].size == os.path.getsize(q.segments[-1].file("log"))
    monkeypatch.setattr(os, "open", real_open)
    _append(q)
    assert _read_all(q) == list(range(q.next_offset)) and q.next_offset > before and size


def _batch_read(q: QueueLog, offset: int) -> bytes:
    """The batch holding ``offset`` as the careful path reads it."""
    data = q.read(offset, 1)
    return bytes(data[:next(iter_batches(data)).size])


@pytest.mark.parametrize("segment_bytes,interval", [(64 << 20, 64 << 10), (2000, 300), (64 << 20, 500)],
                         ids=["one-segment", "rolls", "sparse-index"])
def test_batch_holding_is_the_batch_read_finds_for_every_offset(qpath, segment_bytes, interval):
    """A key-value get reads one batch found by its neighbours' headers: for every
    offset (first, inside and last record of a batch, across segment rolls, with index
    entries every few batches) it is the batch the careful read returns; past the end
    and below the start there is none."""
    q = QueueLog(qpath, segment_bytes=segment_bytes, index_interval=interval, fsync=False)
    _fill(q, 60)
    for off in range(q.next_offset):
        assert q.batch_holding(off) == _batch_read(q, off), off
    assert q.batch_holding(q.next_offset) is None and q.batch_holding(-1) is None
    q.close()
    q = QueueLog(qpath, segment_bytes=segment_bytes, index_interval=interval, fsync=False)   # reopened
    assert all(q.batch_holding(off) == _batch_read(q, off) for off in range(q.next_offset))


def test_batch_holding_never_answers_other_data_when_a_header_before_it_is_bad(qpath):
    """A length that does not add up in a batch the walk skips: the walk gives up (the
    caller reads batch by batch and meets the damage), or finds the right batch, never
    another; a damaged batch itself is never answered."""
    q = QueueLog(qpath, segment_bytes=3000, fsync=False)
    _fill(q, 60)
    end = q.next_offset
    q.close()
    path = os.path.join(qpath, _log_files(qpath)[0])           # sealed: read as it is, never cut
    with open(path, "rb") as f:
        batches = list(iter_batches(f.read()))
    victim = [h for h in batches if h.base_offset == 3 * PER_BATCH][0]
    assert len(batches) > 8
    for at, value in ((0, 1 << 20), (0, 3), (0, victim.size - 8 + 37), (8, 10 ** 6), (8, 0)):
        with open(path, "r+b") as f:
            f.seek(victim.position + at)
            original = f.read(8 if at else 4)
            f.seek(victim.position + at)
            f.write(value.to_bytes(8 if at else 4, "little"))
        q = QueueLog(qpath, segment_bytes=3000, fsync=False)
        assert q.next_offset == end
        for off in range(q.next_offset):
            got = q.batch_holding(off)
            if got is not None:
                h = next(iter_batches(got))           # CRC-checked
                assert h.base_offset <= off <= h.last_offset and h.base_offset != 3 * PER_BATCH, (at, value, off)
        q.close()
        with open(path, "r+b") as f:
            f.seek(victim.position + at)
            f.write(original)
