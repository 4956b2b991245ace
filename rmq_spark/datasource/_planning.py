"""Driver-side planning: which topics, which offsets, which tasks.

Everything here runs on the driver (or in Spark's planner process) with a
client opened by the caller. ``QueueRange`` is the only object shipped to
executors: a small picklable partition naming one slice of one queue.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from pyspark.sql.datasource import InputPartition

from rmq_spark.archive import layout
from rmq_spark.client import Client, NotFound, QueueOffsets

from . import _offsets
from ._options import Bound, ReadOptions
from .errors import DataLossError, OptionError

if TYPE_CHECKING:       # archive.reader (pyarrow.parquet) is imported where an archive is read
    from rmq_spark.archive.reader import ArchiveSnapshot, QueueFiles

__all__ = ["QueueRange", "QueueRanges", "ArchiveRange", "QueueView", "plan_hot", "subscribed_topics",
           "subscribed_state", "queue_state", "resolve", "split_ranges", "cap_by_backlog",
           "report_data_loss", "State"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """Offsets [start, end) of one queue: what one Spark task reads."""
    topic: str
    queue: int
    start: int
    end: int


@dataclass(frozen=True)
class QueueRanges(InputPartition):
    """Several small ``QueueRange``s one task reads together (``packRecordsPerTask``)."""
    ranges: tuple[QueueRange, ...]


@dataclass(frozen=True)
class ArchiveRange(InputPartition):
    """Offsets [start, end) of one queue read from archive ``files`` (tier: FORMAT:PATH)."""
    topic: str
    queue: int
    start: int
    end: int
    tier: str
    files: tuple[str, ...]


@dataclass(frozen=True)
class QueueView:
    """One queue as a reader sees it: hot log plus archive, offsets [earliest, latest).

    ``earliest`` is the archive's first offset when the archive reaches down
    further than the hot log; ``archive`` holds the archive's files for the
    queue (offsets [archive.earliest, archive.end)).
    """
    queue: int
    earliest: int
    latest: int
    hot_earliest: int
    archive: QueueFiles | None = None
    tier: str = ""


State = dict[str, dict[int, QueueView]]


def subscribed_topics(client: Client, opts: ReadOptions,
                      listing: list[dict] | None = None) -> list[str]:
    """Topics the options subscribe to now (of ``listing``, default: the cluster's);
    named topics must exist."""
    listing = client.list_topics() if listing is None else listing
    existing = sorted(t["name"] for t in listing)
    if opts.topic_pattern is not None:
        return [t for t in existing if opts.subscribes(t)]
    missing = [t for t in opts.topics if t not in existing]
    if missing:
        # On a cluster with ACLs the listing holds only what this principal may
        # describe: asking for the topic says which it is (PermissionDenied raised).
        try:
            client.describe_topic(missing[0])
        except NotFound:
            pass
        raise OptionError(opts.subscribed_by, f"topic {missing[0]!r} does not exist; create "
                          f"it first (rmq topic create {missing[0]}) or use topicPattern")
    return list(opts.topics)


def subscribed_state(client: Client, opts: ReadOptions) -> State:
    """``queue_state`` of the queues the options read now: every queue of the
    subscribed topics, or with ``assign`` only the assigned ones (which must exist)."""
    listing = client.list_topics()
    state = queue_state(client, subscribed_topics(client, opts, listing), opts.read_archive, listing)
    if opts.assign is None:
        return state
    return {t: _assigned(t, queues, opts.assign[t]) for t, queues in state.items()}


def _assigned(topic: str, queues: dict[int, QueueView],
              wanted: tuple[int, ...]) -> dict[int, QueueView]:
    missing = [q for q in wanted if q not in queues]
    if missing:
        raise OptionError("assign", f"topic {topic!r} has no queue {missing[0]} (it has "
                          f"{len(queues)} queues, 0 to {len(queues) - 1})")
    return {q: queues[q] for q in wanted}


def queue_state(client: Client, topics: Iterable[str], archive: bool = True,
                listing: list[dict] | None = None) -> State:
    """Every queue of ``topics``: hot offsets fresh from the group leaders, plus the
    committed files of the topic's archive when it is tiered (as ``listing``, default:
    the cluster's topic list, says)."""
    topics = list(topics)
    if topics and listing is None:
        listing = client.list_topics()
    tiers = {t["name"]: t["tier"] for t in listing or ()}
    snapshots: dict[str, ArchiveSnapshot | None] = {}
    out: State = {}
    for t in topics:
        spec = tiers.get(t, "") if archive else ""
        spans: dict[int, QueueFiles] = {}
        if spec:
            if spec not in snapshots:
                from rmq_spark.archive.reader import load_snapshot
                snapshots[spec] = load_snapshot(layout.parse_tier(spec))
            snap = snapshots[spec]
            spans = snap.spans(t) if snap is not None else {}
        out[t] = {o.queue: _view(o, spans.get(o.queue), spec) for o in client.offsets(t)}
    return out


def _view(o, archive: QueueFiles | None, tier: str) -> QueueView:
    if archive is None or archive.earliest >= o.earliest:
        # No archive, or the hot log reaches further back: it alone decides.
        earliest = o.earliest
        archive = archive if archive is not None and archive.end > o.earliest else None
    else:
        earliest = archive.earliest
    return QueueView(o.queue, earliest, o.latest, o.earliest, archive, tier)


def resolve(client: Client, bound: Bound | None, state: State, default: str) -> _offsets.Positions:
    """Concrete offsets for ``bound`` (or the ``default`` kind) on every queue of ``state``.

    Queues that a JSON option leaves out fall back to ``default``.
    """
    bound = bound or Bound(default)
    for topic, queues in bound.positions.items():
        bad = [q for q in queues if topic in state and q not in state[topic]]
        if bad:
            raise OptionError(bound.option, f"topic {topic!r} has no queue {bad[0]} "
                              f"(it has {len(state[topic])} queues)")
    out: _offsets.Positions = {}
    for topic, queues in state.items():
        out[topic] = {q: _position(client, bound, default, topic, o) for q, o in queues.items()}
    return out


def _position(client: Client, bound: Bound, default: str, topic: str, o: QueueOffsets) -> int:
    kind, value = bound.kind, None
    if kind in ("offsets", "timestamps"):
        value = bound.positions.get(topic, {}).get(o.queue)
        if value is None:
            kind = default
    if kind == "offsets":
        kind = {_offsets.EARLIEST: "earliest", _offsets.LATEST: "latest"}.get(value, kind)
    if kind == "earliest":
        return o.earliest
    if kind == "latest":
        return o.latest
    if kind == "offsets":
        return value
    ts = bound.timestamp if kind == "timestamp" else value
    if o.archive is not None:
        from rmq_spark.archive.reader import offset_for_timestamp
        found = offset_for_timestamp(o.archive, o.queue, ts)
        if found is not None and found < max(o.archive.end, o.hot_earliest):
            return found
    return client.offset_for_timestamp(topic, o.queue, ts)


def split_ranges(ranges: list[QueueRange], min_partitions: int | None) -> list[QueueRange]:
    """Drop empty ranges; split large ones so there are at least ``min_partitions`` tasks.

    Each range gets a share of the tasks proportional to its size (rounded up,
    at least one), and is cut into equal slices.
    """
    ranges = [r for r in ranges if r.end > r.start]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    out = []
    for r in ranges:
        size = r.end - r.start
        parts = max(1, min(size, math.ceil(size / total * min_partitions)))
        cuts = [r.start + size * i // parts for i in range(parts + 1)]
        out.extend(QueueRange(r.topic, r.queue, a, b) for a, b in zip(cuts, cuts[1:]) if b > a)
    return out


def plan_hot(ranges: list[QueueRange], min_partitions: int | None,
             pack: int) -> list[QueueRange | QueueRanges]:
    """The hot-log tasks of a read: ``split_ranges``, then small ranges packed together.

    A Spark task of a Python data source costs tens of milliseconds before it
    reads a byte (a Python worker round trip, the pickled reader, an Arrow
    stream each way), and a micro-batch of a few records per queue spent most
    of its time there, in waves of ``cores`` tasks. Ranges of fewer than
    ``pack`` records go into as few tasks as fit ``pack`` records each, in
    queue order; larger ranges keep a task each. ``minPartitions`` asks for
    parallelism, so it turns packing off, as does ``pack`` 0.
    """
    ranges = split_ranges(ranges, min_partitions)
    if min_partitions or not pack:
        return ranges
    out: list[QueueRange | QueueRanges] = []
    bin_: list[QueueRange] = []

    def close_bin() -> None:
        if bin_:
            out.append(bin_[0] if len(bin_) == 1 else QueueRanges(tuple(bin_)))
            bin_.clear()

    size = 0
    for r in ranges:
        n = r.end - r.start
        if n >= pack:
            out.append(r)
            continue
        if size + n > pack:
            close_bin()
            size = 0
        bin_.append(r)
        size += n
    close_bin()
    return out


def cap_by_backlog(start: dict, latest: dict, limit: int) -> dict:
    """End offsets admitting at most ``limit`` offsets in all, split by backlog.

    Each queue gets ``limit * backlog / total`` (rounded down, the remainder
    going to the largest fractions); queues without backlog keep ``latest``.
    """
    backlog = {k: max(0, latest[k] - start[k]) for k in latest}
    total = sum(backlog.values())
    if total <= limit:
        return dict(latest)
    shares = {k: limit * b / total for k, b in backlog.items()}
    take = {k: int(s) for k, s in shares.items()}
    left = limit - sum(take.values())
    by_fraction = sorted((k for k in backlog if backlog[k] > take[k]),
                         key=lambda k: (take[k] - shares[k], str(k)))
    for k in by_fraction[:left]:
        take[k] += 1
    return {k: (start[k] + take[k]) if backlog[k] else latest[k] for k in latest}


def report_data_loss(opts: ReadOptions, topic: str, queue: int, start: int, end: int | None,
                     reason: str) -> None:
    """Fail (failOnDataLoss=true) or log a warning naming what is skipped."""
    if opts.fail_on_data_loss:
        raise DataLossError(topic, queue, start, end, reason)
    missing = f"[{start}, {end})" if end is not None else f"from {start} on"
    log.warning("data loss: topic %r queue %d: offsets %s %s; skipping them because "
                "failOnDataLoss is false", topic, queue, missing, reason)
