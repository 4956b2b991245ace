"""Where archive and hot reads meet: one queue's offset range split between them.

A tiered topic's oldest offsets live only in its archive (Delta/Parquet files
written by the tiering job), the newest only in the hot log on the storage
nodes, and offsets archived but not yet trimmed in both. ``plan`` gives each
offset of a read to exactly one side: the archive up to its end, the hot log
from there (the boundary is the archived watermark, so no offset is read
twice or skipped). ``_read.py`` then reads archive ranges from the files
(``rmq_spark/archive/reader.py``) and hot ranges from the nodes.
"""
from __future__ import annotations

from ._options import ReadOptions
from ._planning import ArchiveRange, QueueRange, QueueView, report_data_loss

__all__ = ["plan"]

ARCHIVE_TASK_ROWS = 2_000_000     # archive rows per Spark task, at file boundaries


def plan(opts: ReadOptions, topic: str, view: QueueView, start: int,
         end: int) -> tuple[list[ArchiveRange], QueueRange | None]:
    """Split [start, end) of one queue (start >= view.earliest) into archive and hot parts.

    Offsets the archive holds are read from it (its files are plain Parquet:
    cheaper than fetching, and they do not move under the reader the way the
    hot log's earliest does under retention); the rest come from the service.
    A hole between the archive's end and the hot log's earliest is data loss.
    """
    archived: list[ArchiveRange] = []
    arch = view.archive
    if arch is not None and start < arch.end and end > start:
        hi = min(end, arch.end)
        archived = _archive_tasks(topic, view, max(start, arch.earliest), hi)
        start = hi
    if start >= end:
        return archived, None
    if start < view.hot_earliest:
        resume = min(view.hot_earliest, end)
        report_data_loss(opts, topic, view.queue, start, resume,
                         f"are neither in the archive (it ends at "
                         f"{arch.end if arch else 'none'}) nor in the hot log (it starts at "
                         f"{view.hot_earliest})")
        start = resume
    return archived, (QueueRange(topic, view.queue, start, end) if end > start else None)


def _archive_tasks(topic: str, view: QueueView, lo: int, hi: int) -> list[ArchiveRange]:
    files = view.archive.covering(lo, hi)
    cuts, rows = [lo], 0
    for f in files:
        if rows >= ARCHIVE_TASK_ROWS and lo < f.min_offset < hi and f.min_offset > cuts[-1]:
            cuts.append(f.min_offset)
            rows = 0
        rows += f.rows
    cuts.append(hi)
    return [ArchiveRange(topic, view.queue, a, b, view.tier,
                         tuple(f.path for f in view.archive.covering(a, b)))
            for a, b in zip(cuts, cuts[1:]) if b > a]
