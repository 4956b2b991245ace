"""The streaming query both jobs run: trigger, batch-size limit, source and session.

Tiering and compaction each read one topic's hot log with
``format("rocketmq")`` (never the archive: that is what they write), from
offsets they decide when the checkpoint is new, in micro-batches of at most
``maxOffsetsPerTrigger`` messages, with the session time zone at UTC.
"""
from __future__ import annotations

import json
from typing import Mapping

from rmq_spark.units import UnitError, parse_duration_ms

from .errors import JobConfigError

__all__ = ["AVAILABLE_NOW", "UTC_CONF", "delta_conf", "parse_trigger", "is_available_now",
           "check_max_offsets", "hot_stream"]

AVAILABLE_NOW = "available-now"
# The session time zone the queries run in: dates and timestamps they write are UTC.
UTC_CONF = {"spark.sql.session.timeZone": "UTC"}
_SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"


def delta_conf(spark) -> dict[str, str]:
    """SQL confs for a job that writes a Delta table with idempotent writes.

    Every write carrying Delta's txn identity (txnAppId, txnVersion) looks its
    version up in the table's state, which Delta rebuilds after each commit in
    ``snapshotPartitions`` tasks: 50 by default, ~10x the cost of a small append
    on a 2-core machine (the idempotent write of a 200,000-record compaction
    batch: 3.5-3.8 s against 1.9 s). As many partitions as the application has
    cores, unless the session sets its own.
    """
    if spark.conf.get(_SNAPSHOT_PARTITIONS, None) is not None:
        return {}
    return {_SNAPSHOT_PARTITIONS: str(max(1, spark.sparkContext.defaultParallelism))}


def parse_trigger(text: str, error: type[JobConfigError] = JobConfigError) -> dict:
    """``"available-now"`` or an interval > 0 (``500ms``, ``30s``, ``5m``, ``1h``;
    ``rmq_spark.units``) -> keyword arguments of ``DataStreamWriter.trigger``."""
    t = str(text).strip().lower()
    if t in (AVAILABLE_NOW, "availablenow", "available_now"):
        return {"availableNow": True}
    wrong = (f"trigger {text!r}: use {AVAILABLE_NOW!r} (process what is there, then stop) "
             "or an interval > 0 such as 500ms, 30s, 5m, 1h")
    try:
        ms = parse_duration_ms(t, what="trigger", no_limit=False)
    except UnitError as e:
        raise error(wrong) from e
    if ms <= 0:
        raise error(wrong)
    return {"processingTime": f"{ms} milliseconds"}


def is_available_now(trigger: Mapping) -> bool:
    """Whether a ``parse_trigger`` result runs once and stops."""
    return bool(trigger.get("availableNow"))


def check_max_offsets(n: int | None, error: type[JobConfigError] = JobConfigError) -> None:
    if n is not None and n < 1:
        raise error(f"max_offsets_per_trigger {n}: use an integer >= 1 (or leave it out: "
                    "no limit)")


def tls_options(tls, token: str | None = None) -> dict[str, str]:
    """A ``TlsFiles`` and a bearer token as the source's and sink's options (paths and
    ``token``: Spark redacts an option of that name in plans, the UI and event logs)."""
    out = {}
    if tls is not None:
        out["tlsCaFile"] = tls.ca
        if tls.cert:
            out.update(tlsCertFile=tls.cert, tlsKeyFile=tls.key)
    if token:
        out["token"] = token
    return out


def hot_stream(spark, endpoints: str, topic: str, starting: Mapping[int, int] | None,
               max_offsets_per_trigger: int | None, tls=None, token: str | None = None, **options: str):
    """``spark.readStream.format("rocketmq")`` of ``topic``'s hot log.

    ``starting``: offsets per queue (-2 earliest) for a new checkpoint; None
    when the checkpoint decides. ``tls``: the cluster's TLS files (``TlsFiles``),
    given to the source as its ``tls*File`` options, ``token`` as its ``token``.
    ``options``: more reader options.
    """
    reader = (spark.readStream.format("rocketmq").option("endpoints", endpoints)
              .option("topic", topic).option("readArchive", "false"))
    for name, value in {**tls_options(tls, token), **options}.items():
        reader = reader.option(name, value)
    if starting:
        reader = reader.option("startingOffsets", json.dumps(
            {topic: {str(q): int(o) for q, o in sorted(starting.items())}}))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    return reader.load()
