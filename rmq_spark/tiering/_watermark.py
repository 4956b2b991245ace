"""Watermarks the tiering job keeps in the service's metadata group.

``archive``: every offset below it is committed in the archive. Set from the
checkpoint: ``commits/N`` exists only once batch N is in the archive, and
``offsets/N`` holds the batch's end offsets. Retention on the nodes may then
drop hot segments below it.

``archive_earliest``: the first offset the archive still holds. Set when a
queue's first rows are archived (to its hot earliest then: hot segments go
only below the ``archive`` watermark, which has not passed it yet, so the
archive starts exactly there) and by archive retention.
"""
from __future__ import annotations

import logging

from rmq_spark.archive import layout
from rmq_spark.client import Client

from rmq_spark.jobs import checkpoint as _checkpoint

from .errors import TierConfigError

__all__ = ["sync_watermark", "archived_positions", "start_positions", "queue_info"]

log = logging.getLogger(__name__)
Positions = dict[int, int]


def queue_info(client: Client, topic: str) -> dict[int, dict]:
    """Per queue: hot earliest/latest, ``archived`` and ``archive_earliest`` (-1 = none)."""
    return {q["queue"]: q for q in client.describe_topic(topic)["queue_info"]}


def sync_watermark(client: Client, topic: str, checkpoint: str, lease_token: int,
                   batch: int | None = None) -> Positions | None:
    """Set the ``archive`` watermark to the end of the latest committed batch.

    Safe to call at any time and repeatedly (watermarks only move forward), by
    the job holding the topic's tier lease: ``lease_token`` is that lease's
    token, and a move under any other token is refused (FailedPrecondition).
    Returns the end offsets, or None when the checkpoint has no committed batch.
    ``batch``: the latest committed batch, when the caller knows it (no listing).
    """
    done = _checkpoint.committed_end(_checkpoint.location(checkpoint, "checkpoint", TierConfigError), topic,
                                     batch)
    if done is None or not done[1]:
        return None
    end = done[1]
    info = queue_info(client, topic)
    # A queue's first archived rows start at its hot earliest: hot segments go only
    # below the ``archive`` watermark, which has not passed the hot earliest yet.
    first = {q: info[q]["earliest"] for q, off in end.items()
             if q in info and info[q]["archive_earliest"] < 0
             and info[q]["archived"] <= info[q]["earliest"] < off}
    if first:       # before ``archive``, which lets the hot earliest move
        client.set_watermark(topic, "archive_earliest", first, lease_token)
    if any(info.get(q, {}).get("archived", -1) < off for q, off in end.items()):
        client.set_watermark(topic, "archive", end, lease_token)
    return end


def archived_positions(client: Client, topic: str, tier: layout.Tier) -> Positions:
    """Per queue, how far the archive goes: the highest of the ``archive`` watermark and
    what the archive's log holds (exact even if a killed run committed a batch but
    did not get to set the watermark). Queues never archived are left out."""
    held = archive_end(tier, topic)
    out = {}
    for q, i in queue_info(client, topic).items():
        done = max(i["archived"], held.get(q, -1))
        if done >= 0:
            out[q] = done
    return out


def start_positions(client: Client, topic: str, archived: Positions) -> Positions:
    """Where a NEW checkpoint starts reading: where the archive ends, the hot earliest
    for a queue never archived. A lost checkpoint re-archives nothing."""
    return {q: archived.get(q, i["earliest"]) for q, i in queue_info(client, topic).items()}


def archive_end(tier: layout.Tier, topic: str) -> Positions:
    """Per queue, 1 + the highest offset committed in the archive (from its log)."""
    from rmq_spark.archive.reader import load_snapshot

    snap = load_snapshot(tier)
    return {} if snap is None else {q: qf.end for q, qf in snap.spans(topic).items()}
