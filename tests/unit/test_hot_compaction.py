"""Hot-log compaction of a queue (storage_service.log.compaction) and the reads it implies."""
from __future__ import annotations

import os

import pytest

from storage_service.protocol import framing, records
from storage_service.log.compaction import CompactionPolicy, compact_queue
from storage_service.log.queue_log import QueueLog

pytestmark = pytest.mark.unit

HOUR = 3_600_000
NOW = 100 * HOUR


def _append(q: QueueLog, keyed: list[tuple[bytes, bytes | None]], ts: int) -> None:
    base = q.next_offset
    block = records.encode([v for _, v in keyed], [k for k, _ in keyed])
    frame = framing.frame_batch(base, ts, len(keyed), base + 1, block)
    q.append(frame, next(framing.iter_batches(frame)))


def _records(q: QueueLog, start: int | None = None) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every record from ``start`` to the end, read as a consumer does."""
    off = q.earliest if start is None else start
    out = []
    while off < q.next_offset:
        data = q.read(off, 1 << 20)
        assert data, f"read({off}) returned nothing before next_offset {q.next_offset}"
        for h, cols in framing.iter_blocks(data):
            for delta, key, value, *_ in records.iter_rows(cols):
                if h.base_offset + delta >= off:
                    out.append((h.base_offset + delta, key, value))
        off = framing.next_offset(data, off)
    return out


def _policy(watermark: int, now: int = NOW, delete_retention: int = 24 * HOUR, lag: int = 0):
    return CompactionPolicy(watermark, now, delete_retention, lag)


def _latest(recs) -> dict[bytes, tuple[int, bytes | None]]:
    out = {}
    for off, k, v in recs:
        out[k] = (off, v)
    return out


@pytest.fixture
def log_of_updates(tmp_path):
    """60 records over 12 batches of 5, 10 keys updated round-robin, small segments (several sealed)."""
    q = QueueLog(str(tmp_path / "q"), segment_bytes=600)
    for b in range(12):
        _append(q, [(b"k%d" % ((b * 5 + i) % 10), b"v%d" % (b * 5 + i)) for i in range(5)],
                ts=NOW - (12 - b) * HOUR)
    assert len(q.segments) >= 4
    yield q
    q.close()


def test_keeps_every_keys_latest_record_and_offsets(log_of_updates):
    q = log_of_updates
    before = _records(q)
    nxt, earliest = q.next_offset, q.earliest
    res = compact_queue(q, _policy(watermark=q.next_offset))
    after = _records(q)
    assert res.records_dropped > 0 and res.segments_rewritten > 0
    assert len(after) == len(before) - res.records_dropped
    # Every surviving record is an original (same offset, key, value), in offset order.
    assert set(after) <= set(before)
    assert [o for o, *_ in after] == sorted(o for o, *_ in after)
    # Replaying the compacted log gives every key's latest value.
    assert _latest(after) == _latest(before)
    assert (q.next_offset, q.earliest) == (nxt, earliest)
    # Below the active segment (the cleanable end) only each key's latest record
    # there and each segment's last record remain.
    active_base = q.segments[-1].base
    seg_last = {s.next_offset - 1 for s in q.segments}
    latest_offsets = {o for o, _ in _latest([r for r in before if r[0] < active_base]).values()}
    for off, _, _ in after:
        assert off >= active_base or off in latest_offsets or off in seg_last


def test_nothing_at_or_above_the_watermark_or_in_the_active_segment_goes(log_of_updates):
    q = log_of_updates
    wm = q.segments[2].base
    before = _records(q)
    compact_queue(q, _policy(watermark=wm))
    after = _records(q)
    assert [r for r in after if r[0] >= wm] == [r for r in before if r[0] >= wm]
    # A key updated above the watermark still has its latest below-watermark record:
    # only the compaction job's table has seen what lies below, and nothing above.
    below = _latest([r for r in before if r[0] < wm])
    assert _latest([r for r in after if r[0] < wm]) == below


def test_tombstones_stay_for_delete_retention_then_go(tmp_path):
    q = QueueLog(str(tmp_path / "q"), segment_bytes=300)
    _append(q, [(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], ts=NOW - 10 * HOUR)
    _append(q, [(b"a", None), (b"b", b"2"), (b"x", b"0")], ts=NOW - 9 * HOUR)     # a deleted
    for i in range(6):
        _append(q, [(b"filler%d" % i, b"f" * 40)], ts=NOW - 8 * HOUR + i)
    wm = q.next_offset
    res = compact_queue(q, _policy(wm, delete_retention=24 * HOUR))
    kept = _latest(_records(q))
    assert kept[b"a"] == (3, None), "a tombstone younger than delete-retention is kept"
    assert res.next_tombstone_expiry_ms == NOW - 9 * HOUR + 24 * HOUR
    assert (0, b"a", b"1") not in _records(q)
    # 15 hours later the tombstone is older than 24 h: it goes, and so does key a.
    compact_queue(q, _policy(wm, now=NOW + 16 * HOUR, delete_retention=24 * HOUR))
    assert b"a" not in _latest(_records(q))
    assert _latest(_records(q))[b"b"] == (4, b"2")


def test_min_compaction_lag_keeps_a_recent_head(log_of_updates):
    q = log_of_updates
    before = _records(q)
    # Records of the last 6 hours (batches 6..11, offsets 30..) must stay.
    compact_queue(q, _policy(q.next_offset, lag=6 * HOUR + 1))
    after = _records(q)
    assert [r for r in after if r[0] >= 30] == [r for r in before if r[0] >= 30]
    assert len(after) < len(before)


def test_reads_from_any_offset_skip_the_gaps(log_of_updates):
    q = log_of_updates
    compact_queue(q, _policy(q.next_offset))
    survivors = [o for o, *_ in _records(q)]
    for start in range(q.earliest, q.next_offset):
        got = [o for o, *_ in _records(q, start)]
        assert got == [o for o in survivors if o >= start], f"reading from {start}"


def test_restart_after_compaction_reads_the_same(tmp_path, log_of_updates):
    q = log_of_updates
    compact_queue(q, _policy(q.next_offset))
    want, nxt = _records(q), q.next_offset
    q.close()
    again = QueueLog(q.path, segment_bytes=600)
    assert again.next_offset == nxt and _records(again) == want
    # Appends go on at the same next offset.
    _append(again, [(b"k0", b"new")], ts=NOW)
    assert _records(again)[-1] == (nxt, b"k0", b"new")
    again.close()


def test_a_crash_during_the_swap_is_finished_or_rolled_back(log_of_updates):
    q = log_of_updates
    before = _records(q)
    seg = q.segments[0]
    # A crash after the cleaned files and the marker were written: the swap is finished.
    frames = []
    with open(seg.file("log"), "rb") as f:
        data = f.read()
    for h, cols in framing.iter_blocks(data):
        idx = [i for i, d in enumerate(cols.offset_delta.tolist()) if (h.base_offset + d) in (4, seg.next_offset - 1)]
        if idx:
            frames.append(framing.frame_batch(h.base_offset, h.store_ts, len(idx), h.apply_position,
                                            records.select(cols, idx)))
    q.close()
    _write_cleaned(seg, frames)
    open(os.path.join(seg.path, f"{seg.base:020d}.swap"), "wb").close()
    reopened = QueueLog(q.path, segment_bytes=600)
    got = _records(reopened)
    assert [o for o, *_ in got if o < seg.next_offset] == [4, seg.next_offset - 1]
    assert [r for r in got if r[0] >= seg.next_offset] == [r for r in before if r[0] >= seg.next_offset]
    assert not [f for f in os.listdir(q.path) if f.endswith((".swap", ".cleaned"))]
    reopened.close()
    # Cleaned files without a marker (a crash while writing them) are dropped.
    _write_cleaned(seg, frames[:1])
    again = QueueLog(q.path, segment_bytes=600)
    assert _records(again) == got
    assert not [f for f in os.listdir(q.path) if f.endswith(".cleaned")]
    again.close()


def _write_cleaned(seg, frames):
    with open(seg.file("log") + ".cleaned", "wb") as f:
        f.write(b"".join(frames))
    for ext in ("idx", "tix"):
        open(seg.file(ext) + ".cleaned", "wb").close()


def test_replace_after_retention_deleted_the_segment_changes_nothing(log_of_updates):
    q = log_of_updates
    seg = q.segments[0]
    q.truncate_prefix(q.segments[1].base)
    before = _records(q)
    assert q.replace_segment(seg, []) is False
    assert _records(q) == before
    assert not [f for f in os.listdir(q.path) if f.endswith(".cleaned")]


def test_a_replica_copies_a_compacted_log_with_its_gaps(tmp_path, log_of_updates):
    q = log_of_updates
    compact_queue(q, _policy(q.next_offset))
    want = _records(q)
    replica = QueueLog(str(tmp_path / "replica"), segment_bytes=600)
    off = 0
    while off < q.next_offset:
        data = q.read(off, 200)
        replica.append_frames(data)
        off = framing.next_offset(data, off)
    assert replica.next_offset == q.next_offset
    assert _records(replica) == want
    # A produce append must still land exactly at next_offset.
    frame = framing.frame_batch(q.next_offset + 5, NOW, 1, 10**6, records.encode([b"x"], [b"k"]))
    with pytest.raises(ValueError, match="append at"):
        replica.append(frame, next(framing.iter_batches(frame)))
    replica.close()


def test_an_expired_tombstone_stays_while_an_older_record_of_its_key_ends_a_segment(tmp_path):
    """A segment's last record is always kept, superseded or not; if the key's expired
    tombstone went too, that record would read as the key's value again (a deleted key
    back from the dead, for a reader from earliest and for the KV index rebuilt from
    the log)."""
    q = QueueLog(str(tmp_path / "q"), segment_bytes=100)
    old = b"old-value".ljust(80, b".")
    _append(q, [(b"k", old)], ts=NOW - 30 * HOUR)                   # fills (and ends) its segment
    _append(q, [(b"k", None)], ts=NOW - 29 * HOUR)                  # deleted
    for i in range(4):
        _append(q, [(b"f%d" % i, b"x" * 60)], ts=NOW - 28 * HOUR + i)
    assert len(q.segments) >= 3
    compact_queue(q, _policy(q.next_offset, delete_retention=24 * HOUR))
    recs = _records(q)
    assert q.segments[0].next_offset == 1 and (0, b"k", old) in recs    # a segment's last: kept
    assert _latest(recs)[b"k"] == (1, None), "the delete must stay after the value it deletes"
