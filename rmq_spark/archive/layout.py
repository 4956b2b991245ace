"""The archive's layout: one contract shared by the tiering job and the reader.

A tiered topic's config carries ``tier = "delta:PATH"`` or ``"parquet:PATH"``.
The archive at PATH is one table (several topics may share it) with every
message column of the ``rocketmq`` source, partitioned by ``topic`` and by
``date`` (UTC date of the store timestamp). Rows inside a file are sorted by
(queue, offset). The columns that planning prunes on (queue, offset,
timestamp) come first so Delta collects statistics for them.

* Delta: written with idempotent appends (``txnAppId`` + ``txnVersion``).
  The committed files are those of the Delta log.
* Parquet: written by Spark's file stream sink; the committed files are the
  ones listed in ``PATH/_spark_metadata`` (anything else is a leftover of a
  killed batch and is never read).

Watermarks in the service's metadata group, per queue:
``archive`` — every offset below it is committed in the archive;
``archive_earliest`` — the first offset archive retention has kept.
"""
from __future__ import annotations

import os

from dataclasses import dataclass

FORMATS = ("delta", "parquet")
# Order matters: statistics columns first (Delta indexes the leading columns).
DATA_COLUMNS = ("queue", "offset", "timestamp", "born_timestamp", "key", "value", "tags",
                "properties", "msg_id")
PARTITION_COLUMNS = ("topic", "date")
STATS_COLUMNS = ("queue", "offset", "timestamp")
ARCHIVE_DDL = ("queue int, offset long, timestamp timestamp, born_timestamp timestamp, key binary, "
               "value binary, tags string, properties map<string,string>, msg_id string, "
               "topic string, date date")
# A new Delta archive's table properties: statistics on the columns reads prune by, and
# no deletion vectors (the archive reader reads data files as they are).
DELTA_TABLE_PROPERTIES = {"delta.dataSkippingStatsColumns": ",".join(STATS_COLUMNS),
                          "delta.enableDeletionVectors": "false"}


@dataclass(frozen=True)
class Tier:
    format: str
    path: str

    def __str__(self) -> str:
        return f"{self.format}:{self.path}"


def absolute_tier(spec: str | None) -> str | None:
    """``FORMAT:PATH`` with a relative local PATH made absolute (from the current
    directory), as the command line means it; anything else as it was (the service
    refuses a tier it cannot take, naming it)."""
    if not spec:
        return spec
    fmt, sep, path = spec.partition(":")
    if sep and fmt in FORMATS and path and not path.startswith(("/", "file:")) \
            and "://" not in path:
        return f"{fmt}:{os.path.abspath(path)}"
    return spec


def parse_tier(spec: str, what: str = "tier") -> Tier | None:
    """``"delta:PATH"`` / ``"parquet:PATH"`` -> Tier; ``""`` -> None."""
    if not spec:
        return None
    fmt, sep, path = spec.partition(":")
    if not sep or fmt not in FORMATS or not path:
        raise ValueError(f"{what}={spec!r}: expected FORMAT:PATH with FORMAT one of "
                         f"{', '.join(FORMATS)}, e.g. delta:/data/archive")
    from rmq_spark.fs import userinfo_refusal
    if userinfo_refusal(path):
        raise ValueError(f"{what}: {userinfo_refusal(path)}")
    scheme, sep2, rest = path.partition("://")
    if sep2 and scheme in ("s3", "s3n"):
        path = f"s3a://{rest}"          # one name for Spark's Hadoop and for pyarrow (rmq_spark.fs)
    return Tier(fmt, path.rstrip("/") if sep2 else path)


def archive_frame(df):
    """A ``rocketmq`` DataFrame in the archive's column order, with ``date``:
    the UTC date of the store time, whatever the session's time zone."""
    from pyspark.sql import functions as F
    day = F.floor(F.unix_micros(F.col("timestamp")) / 86_400_000_000).cast("int")
    return df.select(*DATA_COLUMNS, "topic", F.date_from_unix_date(day).alias("date"))
