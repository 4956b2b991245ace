"""Driver-side planning: which topics, which offsets, which tasks.

Everything here runs on the driver (or in Spark's planner process) with a
client opened by the caller. ``QueueRange`` is the only object shipped to
executors: a small picklable partition naming one slice of one queue.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Iterable

from pyspark.sql.datasource import InputPartition

from rmq_spark.client import Client, QueueOffsets

from . import _offsets
from ._options import Bound, ReadOptions
from .errors import DataLossError, OptionError

__all__ = ["QueueRange", "subscribed_topics", "queue_state", "resolve", "split_ranges",
           "cap_by_backlog", "report_data_loss", "State"]

log = logging.getLogger(__name__)
State = dict[str, dict[int, QueueOffsets]]


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """Offsets [start, end) of one queue: what one Spark task reads."""
    topic: str
    queue: int
    start: int
    end: int


def subscribed_topics(client: Client, opts: ReadOptions) -> list[str]:
    """Topics the options subscribe to now; named topics must exist."""
    existing = sorted(t["name"] for t in client.list_topics())
    if opts.topic_pattern is not None:
        return [t for t in existing if opts.subscribes(t)]
    missing = [t for t in opts.topics if t not in existing]
    if missing:
        raise OptionError("topic" if len(opts.topics) == 1 else "topics",
                          f"topic {missing[0]!r} does not exist; create it first "
                          f"(rmq topic create {missing[0]}) or use topicPattern")
    return list(opts.topics)


def queue_state(client: Client, topics: Iterable[str]) -> State:
    """Earliest/latest of every queue of ``topics``, fresh from the group leaders."""
    return {t: {o.queue: o for o in client.offsets(t)} for t in topics}


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
