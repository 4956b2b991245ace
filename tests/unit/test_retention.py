"""Retention arithmetic over segment summaries (storage_service.log.retention)."""
from __future__ import annotations

import pytest

from storage_service.log.retention import SegmentInfo, retention_cutoff

pytestmark = pytest.mark.unit

NOW = 1_000_000
HOUR = 3_600_000


def _segs(*last_ts: int, size: int = 100, per: int = 10) -> list[SegmentInfo]:
    """Segments of ``per`` offsets and ``size`` bytes each; the last one is active."""
    return [SegmentInfo(i * per, (i + 1) * per, size, ts) for i, ts in enumerate(last_ts)]


def test_no_segments_gives_zero():
    assert retention_cutoff([], NOW, 1, 1) == 0


def test_both_limits_off_deletes_nothing():
    segs = _segs(0, 0, 0, 0)
    assert retention_cutoff(segs, NOW + 100 * HOUR, 0, 0) == 0


def test_cutoff_starts_at_first_segment_base():
    segs = [SegmentInfo(50, 60, 100, 0), SegmentInfo(60, 70, 100, 0)]
    assert retention_cutoff(segs, NOW, 0, 0) == 50


def test_by_time_deletes_segments_whose_newest_record_is_too_old():
    segs = _segs(NOW - 5000, NOW - 3000, NOW - 500, NOW)
    assert retention_cutoff(segs, NOW, 1000, 0) == 20


def test_by_time_stops_at_first_young_segment():
    segs = _segs(NOW - 5000, NOW - 100, NOW - 5000, NOW)
    assert retention_cutoff(segs, NOW, 1000, 0) == 10


def test_by_time_keeps_a_segment_exactly_at_the_limit():
    assert retention_cutoff(_segs(NOW - 1000, NOW), NOW, 1000, 0) == 0
    assert retention_cutoff(_segs(NOW - 1001, NOW), NOW, 1000, 0) == 10


def test_by_bytes_deletes_oldest_until_within_limit():
    segs = _segs(NOW, NOW, NOW, NOW, NOW)         # 500 bytes
    assert retention_cutoff(segs, NOW, 0, 200) == 30


def test_by_bytes_under_the_limit_deletes_nothing():
    assert retention_cutoff(_segs(NOW, NOW, NOW), NOW, 0, 300) == 0
    assert retention_cutoff(_segs(NOW, NOW, NOW), NOW, 0, 10_000) == 0


def test_either_limit_is_enough():
    segs = _segs(NOW - 5000, NOW, NOW, NOW)        # 400 bytes, first one old
    assert retention_cutoff(segs, NOW, 1000, 10_000) == 10
    assert retention_cutoff(_segs(NOW, NOW, NOW), NOW, 1000, 100) == 20


def test_active_segment_is_never_deleted():
    segs = _segs(0, 0, 0)
    assert retention_cutoff(segs, NOW, 1, 1) == 20
    assert retention_cutoff(_segs(0), NOW, 1, 1) == 0


def test_protected_watermark_caps_deletion():
    segs = _segs(0, 0, 0, 0, 0)
    assert retention_cutoff(segs, NOW, 1, 0, protected=25) == 20


def test_protected_at_segment_end_allows_that_segment():
    segs = _segs(0, 0, 0, 0, 0)
    assert retention_cutoff(segs, NOW, 1, 0, protected=30) == 30


def test_protected_above_everything_does_not_extend_past_the_active_segment():
    assert retention_cutoff(_segs(0, 0, 0), NOW, 1, 0, protected=10_000) == 20


def test_protected_caps_bytes_retention_too():
    segs = _segs(NOW, NOW, NOW, NOW, NOW)
    assert retention_cutoff(segs, NOW, 0, 100, protected=15) == 10


def test_protected_zero_deletes_nothing():
    segs = _segs(0, 0, 0, 0)
    assert retention_cutoff(segs, NOW, 1, 1, protected=0) == 0


def test_protected_none_means_untiered():
    segs = _segs(0, 0, 0, 0)
    assert retention_cutoff(segs, NOW, 1, 0, protected=None) == 30
