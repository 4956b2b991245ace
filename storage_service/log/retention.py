"""Retention arithmetic: where a queue's earliest offset may move to.

Pure functions over segment summaries, so the rules are unit-tested without
files. Whole sealed segments are deleted; the active (last) segment never is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["SegmentInfo", "retention_cutoff"]


@dataclass(frozen=True)
class SegmentInfo:
    base: int
    next_offset: int
    size: int
    last_ts: int


def retention_cutoff(segments: Sequence[SegmentInfo], now_ms: int, retention_ms: int,
                     retention_bytes: int, protected: int | None = None) -> int:
    """Return the new earliest offset (the base of the first segment kept).

    A sealed segment may go when it is older than ``retention_ms`` (its newest
    record) or when the queue stays at or above ``retention_bytes`` without it
    (as in Kafka: at least ``retention_bytes`` are kept). Either limit
    is off when 0. ``protected`` (the archived watermark of a tiered topic)
    caps the result: nothing at or above it is deleted, and a tiered topic
    with no watermark yet (``protected == 0``) deletes nothing.
    """
    if not segments:
        return 0
    cutoff = segments[0].base
    total = sum(s.size for s in segments)
    for seg in segments[:-1]:
        too_old = retention_ms > 0 and seg.last_ts < now_ms - retention_ms
        too_big = retention_bytes > 0 and total - seg.size >= retention_bytes
        if not (too_old or too_big):
            break
        if protected is not None and seg.next_offset > protected:
            break
        cutoff = seg.next_offset
        total -= seg.size
    return cutoff
