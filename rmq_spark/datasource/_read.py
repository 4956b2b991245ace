"""Executor side of a read: a ``QueueRange`` (or several) -> Arrow RecordBatches.

Fetches are pipelined: while Spark consumes one batch, the next fetch (up to
``maxBytesPerFetch`` bytes) is already in flight on a helper thread. A task
of packed small ranges (``QueueRanges``) starts the first fetch of every
range at once. Batches come from ``Client.fetch_arrow`` column by column; no
per-message Python.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pyarrow as pa

import numpy as np
import pyarrow.compute as pc

from rmq_spark.archive.errors import ArchiveError
from rmq_spark.client import Client, OutOfRange, TlsFiles
from rmq_spark.client.arrow import ARROW_SCHEMA, empty_batch, with_headers
from storage_service.protocol.buffers import reuse_big_buffers
from storage_service.protocol.tags import parse_tag_expression

from ._options import ReadOptions
from ._planning import ArchiveRange, QueueRange, QueueRanges, report_data_loss

__all__ = ["read_ranges", "read_archive", "read_partition"]

log = logging.getLogger(__name__)


class _Fetcher:
    """Fetches one range; turns missing offsets into data-loss handling."""

    def __init__(self, client: Client, opts: ReadOptions, part: QueueRange):
        self.client, self.opts, self.part = client, opts, part
        self.follower = opts.read_from == "follower"

    def fetch(self, offset: int) -> tuple[pa.RecordBatch, int]:
        """One fetch at ``offset``: (batch trimmed to the range, where the next fetch starts)."""
        try:
            rb, nxt = self._fetch(offset, self.follower)
        except OutOfRange as e:
            if self.follower:
                return self.fetch_from_leader(offset)
            return self._out_of_range(offset, e)
        if nxt > offset:
            return rb, nxt
        return self.fetch_from_leader(offset) if self.follower else self._ended(offset)

    def fetch_from_leader(self, offset: int) -> tuple[pa.RecordBatch, int]:
        # A follower may lag behind the offsets planned from the leaders.
        try:
            rb, nxt = self._fetch(offset, False)
        except OutOfRange as e:
            return self._out_of_range(offset, e)
        return (rb, nxt) if nxt > offset else self._ended(offset)

    def _fetch(self, offset: int, from_follower: bool) -> tuple[pa.RecordBatch, int]:
        p = self.part
        # The one fetch call site: the tag filter runs in the service.
        rb, nxt, _, _ = self.client.fetch_arrow(
            p.topic, p.queue, offset, end=p.end, max_bytes=self.opts.max_bytes_per_fetch,
            from_follower=from_follower, tags=self.opts.tags, local=self.opts.local_reads)
        return rb, nxt

    def _out_of_range(self, offset: int, e: OutOfRange) -> tuple[pa.RecordBatch, int]:
        p = self.part
        if e.earliest is not None and offset < e.earliest:
            resume = min(e.earliest, p.end)
            report_data_loss(self.opts, p.topic, p.queue, offset, resume,
                             f"were removed by retention before they were read "
                             f"(the queue now starts at {e.earliest})")
            return empty_batch(), resume
        if e.latest is not None and offset > e.latest:
            return self._ended(offset, e.latest)
        raise e

    def _ended(self, offset: int, latest: int | None = None) -> tuple[pa.RecordBatch, int]:
        p = self.part
        now = f"ends at {latest}" if latest is not None else f"ends at {offset}"
        report_data_loss(self.opts, p.topic, p.queue, offset, p.end,
                         f"no longer exist (the queue {now}; was the topic deleted and "
                         "created again?)")
        return empty_batch(), p.end


ARCHIVE_BATCH_ROWS = 65_536


def read_archive(opts: ReadOptions, part: ArchiveRange) -> Iterator[pa.RecordBatch]:
    """Yield the rows of ``part`` from its archive files; missing offsets are data loss."""
    from rmq_spark.archive.reader import read_files      # (pyarrow.parquet: only where archives are read)

    table = read_files(list(part.files), part.topic, part.queue, part.start, part.end, ARROW_SCHEMA)
    offsets = table.column("offset").to_numpy()
    if len(offsets) != part.end - part.start:
        _archive_gaps(opts, part, offsets)
    wanted = parse_tag_expression(opts.tags)
    if wanted is not None and table.num_rows:
        table = table.filter(pc.is_in(table.column("tags"),
                                      value_set=pa.array([t.decode() for t in wanted])))
    yield from table.to_batches(max_chunksize=ARCHIVE_BATCH_ROWS)


def _archive_gaps(opts: ReadOptions, part: ArchiveRange, offsets: np.ndarray) -> None:
    expected = np.arange(part.start, part.end, dtype=np.int64)
    missing = np.setdiff1d(expected, offsets, assume_unique=True)
    if not len(missing):
        raise ArchiveError(f"archive {part.tier}: topic {part.topic!r} queue {part.queue} holds "
                           f"{len(offsets)} rows for offsets [{part.start}, {part.end}): some "
                           "offsets are archived more than once")
    # Report each run of consecutive missing offsets.
    breaks = np.nonzero(np.diff(missing) != 1)[0]
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [len(missing) - 1]])
    for a, b in zip(starts, ends):
        report_data_loss(opts, part.topic, part.queue, int(missing[a]), int(missing[b]) + 1,
                         f"are missing from the archive {part.tier} (files removed since the "
                         "query was planned?)")


def read_partition(opts: ReadOptions, part, client: Client | None = None) -> Iterator[pa.RecordBatch]:
    """An archive or a hot-log partition's rows (with ``headers`` if ``includeHeaders``).

    A read with nothing to read plans no partition, and Spark then hands the
    reader one plain ``InputPartition(None)``: it has no rows."""
    if isinstance(part, ArchiveRange):
        batches = read_archive(opts, part)
    elif isinstance(part, QueueRange):
        batches = read_ranges(opts, (part,), client)
    elif isinstance(part, QueueRanges):
        batches = read_ranges(opts, part.ranges, client)
    else:
        return iter(())
    return map(with_headers, batches) if opts.include_headers else batches


_clients: dict[str, Client] = {}
_clients_lock = threading.Lock()


def worker_client(endpoints: str, tls: TlsFiles | None = None, token: str | None = None) -> Client:
    """One client per endpoints list for the life of this Python worker process.

    Spark reuses a Python worker for task after task (``spark.python.worker.reuse``,
    on by default): a client of its own per task paid for new connections and a
    route lookup every time, a third of a small task. The client is thread-safe
    and follows leader changes itself; it is closed when the process exits.
    """
    with _clients_lock:
        client = _clients.get((endpoints, tls, token))
        if client is None:
            client = _clients[(endpoints, tls, token)] = Client(endpoints, tls=tls, token=token)
        return client


PREFETCH_THREADS = 8


def read_ranges(opts: ReadOptions, parts: tuple[QueueRange, ...],
                client: Client | None = None) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``parts``, range after range, as Arrow RecordBatches, one per
    fetch, with ``client`` (default: this worker's)."""
    reuse_big_buffers()     # this Python worker receives megabyte fetches again and again
    client = client or worker_client(opts.endpoints, opts.tls, opts.token)
    pool = ThreadPoolExecutor(min(len(parts), PREFETCH_THREADS), thread_name_prefix="rmq-prefetch")
    try:
        fetchers = [_Fetcher(client, opts, p) for p in parts]
        firsts = [pool.submit(f.fetch, f.part.start) for f in fetchers]
        for fetcher, pending in zip(fetchers, firsts):
            while pending is not None:
                rb, nxt = pending.result()
                pending = pool.submit(fetcher.fetch, nxt) if nxt < fetcher.part.end else None
                if rb.num_rows:
                    yield rb
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
