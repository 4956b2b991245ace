"""What one tiering run is: the topic, its archive, the trigger and limits, checked once.

``resolve_tier`` decides the archive from the arguments and the topic's
``tier`` config (and records it in the topic when the topic has none);
``TierSettings.create`` checks every argument before anything starts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rmq_spark import fs, jobs
from rmq_spark.archive import layout
from rmq_spark.client import Client, NotFound, TlsFiles
from rmq_spark.jobs import AVAILABLE_NOW
from rmq_spark.jobs.checkpoint import checkpoint_under, location
from rmq_spark.jobs.lease import TTL_S, check_ttl

from .errors import TierConfigError

__all__ = ["TierSettings", "parse_trigger", "resolve_tier", "default_checkpoint",
           "AVAILABLE_NOW", "DEFAULT_VACUUM_RETAIN_HOURS"]

DEFAULT_VACUUM_RETAIN_HOURS = 168.0      # Delta's own default (7 days)


def parse_trigger(text: str) -> dict:
    """``rmq_spark.jobs.parse_trigger``, raising ``TierConfigError``."""
    return jobs.parse_trigger(text, TierConfigError)


def default_checkpoint(tier: layout.Tier, topic: str) -> str:
    """``ARCHIVE/_rmq_checkpoints/TOPIC`` (``jobs.checkpoint.checkpoint_under``)."""
    return checkpoint_under(tier.path, topic)


def resolve_tier(client: Client, topic: str, archive: str | None = None,
                 format: str | None = None, apply: bool = True) -> layout.Tier:
    """The archive ``topic`` is tiered to, from the arguments and the topic config.

    No ``archive``: the topic's ``tier`` config (it must have one). An
    ``archive`` for a topic without a tier config: recorded in the topic
    (``alter_topic(tier=...)``) when ``apply``. A topic tiered elsewhere:
    refused, naming both. Nothing is changed when an error is raised.
    """
    if format is not None and format not in layout.FORMATS:
        raise TierConfigError(f"format {format!r}: use one of {', '.join(layout.FORMATS)}")
    try:     # describe, not list: it waits for a just-created topic to reach the replica
        cfg = client.describe_topic(topic)
    except NotFound:
        raise TierConfigError(f"topic {topic!r} does not exist (create it with "
                              "`rmq topic create`)") from None
    if cfg["cleanup_policy"] == "compact":
        raise TierConfigError(f"topic {topic!r} has cleanup policy compact: tiering archives delete "
                              f"topics; a compact topic keeps its latest values with `rmq compact {topic}`")
    current = layout.parse_tier(cfg["tier"]) if cfg["tier"] else None
    if archive is None:
        if current is None:
            raise TierConfigError(f"topic {topic!r} has no tier config: give the archive "
                                  "(--archive PATH) or set it with `rmq topic alter "
                                  f"{topic} --tier delta:PATH`")
        if format is not None and format != current.format:
            raise TierConfigError(f"topic {topic!r} is tiered to {current}; format {format!r} "
                                  "does not match it")
        return current
    path = location(archive, "archive", TierConfigError)
    wanted = layout.Tier(format or (current.format if current and current.path == path
                                    else "delta"), path)
    if current is not None and current != wanted:
        raise TierConfigError(f"topic {topic!r} is already tiered to {current}, not {wanted}; "
                              f"tier it there (omit --archive), or change its config first "
                              f"(`rmq topic alter {topic} --tier {wanted}`)")
    if wanted.format == "parquet":
        _check_parquet_owner(client, topic, wanted)
    if apply:
        check_location(wanted.path, "archive")
    if current is None and apply:
        client.alter_topic(topic, tier=str(wanted))
    return wanted


def check_location(uri: str, what: str) -> None:
    """Refuse, before anything is written, a location the job could not use (a
    missing bucket, refused credentials), naming it."""
    try:
        fs.check_writable(uri, what)
    except fs.StoreError as e:
        raise TierConfigError(str(e)) from None


def _check_parquet_owner(client: Client, topic: str, tier: layout.Tier) -> None:
    """Spark's file sink numbers its log by batch id and skips ids it has seen:
    two queries on one path would skip each other's batches. One topic per path."""
    for t in client.list_topics():
        other = layout.parse_tier(t["tier"]) if t["tier"] else None
        if t["name"] != topic and other is not None and other.path == tier.path:
            raise TierConfigError(f"archive {tier.path} is already the archive of topic "
                                  f"{t['name']!r}; a Parquet archive takes one topic (Spark's "
                                  "file sink allows one writer per path): give this topic its "
                                  "own path, or use a delta archive, which topics can share")


@dataclass(frozen=True)
class TierSettings:
    """One tiering run, every argument checked (see ``tier_topic`` for their meaning)."""
    endpoints: str
    topic: str
    tier: layout.Tier
    checkpoint: str
    trigger: dict
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    vacuum_retain_hours: float = DEFAULT_VACUUM_RETAIN_HOURS
    retention_check_s: float = 60.0
    lease_ttl_s: float = TTL_S
    tls: TlsFiles | None = None          # the cluster's TLS files, for every client of the job
    token: str | None = field(default=None, repr=False)   # the job's bearer token (ACLs)

    @classmethod
    def create(cls, client: Client, endpoints: str, topic: str, archive: str | None = None,
               format: str | None = None, trigger: str = AVAILABLE_NOW,
               checkpoint: str | None = None, max_offsets_per_trigger: int | None = None,
               fail_on_data_loss: bool = True,
               vacuum_retain_hours: float = DEFAULT_VACUUM_RETAIN_HOURS,
               retention_check_s: float = 60.0, lease_ttl_s: float = TTL_S) -> "TierSettings":
        """Checked against the cluster ``client`` reaches (its TLS files and token go to the job)."""
        trig = parse_trigger(trigger)
        jobs.check_max_offsets(max_offsets_per_trigger, TierConfigError)
        if vacuum_retain_hours < 0:
            raise TierConfigError(f"vacuum retain {vacuum_retain_hours} h: use a number >= 0")
        if retention_check_s < 0:
            raise TierConfigError(f"retention check interval {retention_check_s} s: use >= 0")
        check_ttl(lease_ttl_s, TierConfigError)
        ckpt = location(checkpoint, "checkpoint", TierConfigError) if checkpoint else None
        tier = resolve_tier(client, topic, archive, format)
        return cls(endpoints, topic, tier, ckpt or default_checkpoint(tier, topic), trig,
                   max_offsets_per_trigger, fail_on_data_loss, vacuum_retain_hours,
                   retention_check_s, lease_ttl_s, client.tls, client.token)

    @property
    def available_now(self) -> bool:
        return jobs.is_available_now(self.trigger)
