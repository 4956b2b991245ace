"""Archive retention: drop archived messages older than the topic's ``retention_ms``.

Store time is non-decreasing in a queue, so what expires is a prefix of each
queue and the archive's first offset per queue (``archive_earliest``) moves
up to the first message kept. Which files hold expired rows comes from the
archive's log and statistics (``rmq_spark.archive.reader``), so a pass that
finds nothing expired costs no Spark job.

* Delta: ``DELETE`` of the topic's expired rows, then ``VACUUM`` (retaining
  ``vacuum_retain_hours``; Delta refuses less than its own 7 days unless its
  retention check is switched off, which happens only for a shorter retain
  asked for).
* Parquet: whole files whose newest row expired are removed. The file sink's
  ``_spark_metadata`` still lists them; the ``rocketmq`` reader skips listed
  files that are gone, a plain ``spark.read.parquet`` needs
  ``ignoreMissingFiles``.

A batch killed before its commit leaves its files behind: no reader sees
them (readers take the files from the archive's log), but they take space.
At start and at most once an hour the job removes the topic's data files
that the log does not name (Parquet: the sink's log; Delta: its log's adds
and the removes VACUUM has not deleted yet) once they are
``vacuum_retain_hours`` old (at least 24 h), as Delta's ``VACUUM FULL`` does
with a table's untracked files, and never a file written since the job
started: a batch this job is writing is never touched, and one a job whose
lease lapsed is still writing only if it has been at it for a day.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import time
from typing import Callable
from dataclasses import dataclass

from rmq_spark import fs
from rmq_spark.archive import layout
from rmq_spark.client import Client
from rmq_spark.spark import session_conf

from ._config import DEFAULT_VACUUM_RETAIN_HOURS

__all__ = ["ArchiveRetention", "RetentionResult"]

log = logging.getLogger(__name__)
VACUUM_INTERVAL_S = 3600.0
# A file no committed batch lists goes only this old at least, whatever the vacuum
# retain: a job whose lease lapsed may still be writing the batch it belongs to.
ORPHAN_MIN_AGE_H = 24.0
_LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
_CANNOT_VACUUM_LITE = "DELTA_CANNOT_VACUUM_LITE"
_VACUUM_LOGGING = "spark.databricks.delta.vacuum.logging.enabled"


@dataclass(frozen=True)
class RetentionResult:
    cutoff_ms: int
    removed_files: int
    archive_earliest: dict[int, int]


class ArchiveRetention:
    """One topic's archive retention; ``maybe_run`` is cheap to call after every batch."""

    def __init__(self, client: Client, topic: str, tier: layout.Tier,
                 vacuum_retain_hours: float = DEFAULT_VACUUM_RETAIN_HOURS,
                 check_interval_s: float = 60.0, lease_token: Callable[[], int] = lambda: 0):
        """``lease_token()``: the token of the job's tier lease, which ``archive_earliest``
        moves carry (the metadata group refuses them under any other token)."""
        self.client, self.topic, self.tier = client, topic, tier
        self.lease_token = lease_token
        self.vacuum_retain_hours = vacuum_retain_hours
        self.check_interval_s = check_interval_s
        self._last_check: float | None = None
        self._last_vacuum: float | None = None
        self._last_sweep: float | None = None
        self._created = time.time()     # files written since are this run's own

    def maybe_run(self, spark=None) -> RetentionResult | None:
        """Run if the last check is ``check_interval_s`` old (always the first time)."""
        now = time.monotonic()
        if self._last_check is not None and now - self._last_check < self.check_interval_s:
            return None
        self._last_check = now
        if self._last_sweep is None or now - self._last_sweep >= VACUUM_INTERVAL_S:
            self._last_sweep = now
            self.sweep_orphans()
        return self.run(spark)

    def run(self, spark=None) -> RetentionResult | None:
        """Remove expired rows now; None when the topic keeps everything or nothing expired."""
        from rmq_spark.archive.reader import load_snapshot

        retention_ms = self.client.describe_topic(self.topic)["retention_ms"]
        snap = load_snapshot(self.tier) if retention_ms > 0 else None
        if snap is None:
            return None
        cutoff_ms = int(time.time() * 1000) - retention_ms
        spans = snap.spans(self.topic)
        expired = [f for qf in spans.values() for f in qf.files if f.min_ts_us < cutoff_ms * 1000]
        if not expired:
            return None
        if self.tier.format == "delta":
            removed = self._delete_delta(spark, cutoff_ms)
        else:
            removed = self._remove_parquet(expired, cutoff_ms)
        earliest = self._record_earliest(spans, cutoff_ms)
        log.info("archive retention of %s: removed %d files before %d ms; archive earliest %s",
                 self.topic, removed, cutoff_ms, earliest)
        return RetentionResult(cutoff_ms, removed, earliest)

    def _record_earliest(self, before, cutoff_ms: int) -> dict[int, int]:
        """archive_earliest per queue, from the archive's log after the removal."""
        from rmq_spark.archive.reader import load_snapshot

        snap = load_snapshot(self.tier)
        after = snap.spans(self.topic) if snap is not None else {}
        earliest = {}
        for q, qf in before.items():
            if q in after:
                earliest[q] = after[q].earliest
            else:                       # every archived row of q expired
                earliest[q] = qf.end
        if earliest:
            self.client.set_watermark(self.topic, "archive_earliest", earliest, self.lease_token())
        return earliest

    # ----------------------------------------------------------------- Delta
    def _delete_delta(self, spark, cutoff_ms: int) -> int:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        if spark is None:
            raise ValueError("Delta archive retention needs a SparkSession")
        cutoff = F.timestamp_millis(F.lit(cutoff_ms))
        # The date condition lets Delta prune partitions before it looks at statistics
        # (``date`` is the UTC date, computed here so the session's time zone cannot shift it).
        day = dt.datetime.fromtimestamp(cutoff_ms / 1000, dt.timezone.utc).date()
        cond = ((F.col("topic") == self.topic) & (F.col("date") <= F.lit(day))
                & (F.col("timestamp") < cutoff))
        table = DeltaTable.forPath(spark, self.tier.path)
        table.delete(cond)
        metrics = table.history(1).collect()[0]["operationMetrics"] or {}
        removed = int(metrics.get("numRemovedFiles", 0))
        if self._vacuum_due(table):
            self._vacuum(spark)
        return removed

    def _vacuum_due(self, table) -> bool:
        """At most one VACUUM an hour, by this job or any other (from the table history):
        the files a DELETE retires may go only ``vacuum_retain_hours`` later anyway,
        and even a LITE VACUUM costs several Spark jobs."""
        from pyspark.sql import functions as F

        if self._last_vacuum is not None and \
                time.monotonic() - self._last_vacuum < VACUUM_INTERVAL_S:
            return False
        last = (table.history(100).where(F.col("operation") == "VACUUM END")
                .select(F.max(F.unix_timestamp("timestamp"))).first()[0])
        return last is None or time.time() - last >= VACUUM_INTERVAL_S

    def _vacuum(self, spark) -> None:
        self._last_vacuum = time.monotonic()
        short = self.vacuum_retain_hours < DEFAULT_VACUUM_RETAIN_HOURS
        check_off = {"spark.databricks.delta.retentionDurationCheck.enabled": "false"}
        table = f"delta.`{self.tier.path}`"
        retain = f"RETAIN {self.vacuum_retain_hours} HOURS"
        # Delta logs VACUUM START/END by default except on S3 (for a consistency S3 has
        # had since 2020): without them LITE and "one VACUUM an hour" have no history.
        logged = {_VACUUM_LOGGING: "true"}
        with session_conf(spark, {**logged, **(check_off if short else {})}):
            try:     # LITE: the files to delete come from the log, no listing of the table
                spark.sql(f"VACUUM {table} LITE {retain}")
            except Exception as e:   # the log no longer covers the last vacuum: list it all
                if _CANNOT_VACUUM_LITE not in str(e):
                    raise
                log.info("VACUUM LITE of %s not possible (%s: the log no longer reaches back "
                         "to the last VACUUM); running a full VACUUM", self.tier.path,
                         _CANNOT_VACUUM_LITE)
                # Delta lists the table in 10,000 tasks by default: ~2 minutes for a
                # small table on 2 cores; as many as the app has cores: ~10 s.
                cores = str(max(1, spark.sparkContext.defaultParallelism))
                with session_conf(spark, {_LISTING_PARALLELISM: cores}):
                    spark.sql(f"VACUUM {table} FULL {retain}")

    # --------------------------------------------------------------- orphans
    def sweep_orphans(self) -> int:
        """Remove this topic's data files that the archive's log does not name, written
        ``max(vacuum_retain_hours, 24 h)`` ago and before this job started (with their
        checksum files); returns how many. Never raises: a file it cannot remove stays.

        Such files are what a batch killed before its commit leaves. The log: the
        Parquet file sink's ``_spark_metadata``; Delta's log, where a file named by
        an ``add`` or by a ``remove`` (VACUUM's to delete, once it is old enough)
        stays. Delta's own ``VACUUM FULL`` would find them too, but lists the whole
        table (every topic) in several Spark jobs: tens of seconds on a small machine.

        Files are matched by their path below ``topic=TOPIC/`` (part-file names hold
        a job uuid), not by absolute path: the log holds the paths Spark qualified,
        the archive may be named by a relative path or through a symlink. Nothing is
        removed from an archive without a log, or with both formats' logs, nor when
        the log names no file of the topic or none of them is found where the walk
        looks; a log this reader cannot follow (a missing commit, unknown reader
        features) raises inside, so nothing is removed either.
        """
        try:
            return self._sweep_orphans()
        except Exception:                     # the job goes on; the next sweep retries
            log.warning("archive %s: sweep of topic %s failed", self.tier.path, self.topic,
                        exc_info=True)
            return 0

    def _sweep_orphans(self) -> int:
        from rmq_spark.archive.reader import delta_referenced_paths, parquet_sink_paths

        parquet = self.tier.format == "parquet"
        other_log = "_delta_log" if parquet else "_spark_metadata"
        if fs.exists(fs.join(self.tier.path, other_log)):
            log.warning("archive %s has a %s too (its format was switched?): not sweeping "
                        "topic %s", self.tier.path, other_log, self.topic)
            return 0
        logged = (parquet_sink_paths if parquet else delta_referenced_paths)(self.tier.path, listed=True)
        if logged is None:
            return 0
        marker = f"topic={self.topic}"
        committed = set()
        for p in logged:
            p = os.path.abspath(p).replace(os.sep, "/") if fs.is_local(p) else p
            _, found, rel = p.rpartition("/" + marker + "/")
            if found:
                committed.add(rel)
        if not committed:             # nothing of the topic committed yet: nothing to judge by
            return 0
        top = fs.join(self.tier.path, marker)
        files = {}                            # path below topic=T/ -> (uri, modified)
        for uri, _, mtime in fs.walk_files(top):     # the sweep's one listing, once an hour
            rel = uri[len(top):].lstrip("/").replace(os.sep, "/")
            name = rel.rsplit("/", 1)[-1]
            if name.endswith(".parquet") and not name.startswith((".", "_")):
                files[rel] = (uri, mtime)
        if not committed & files.keys():
            log.warning("archive %s: none of the %d files its log lists for topic %s is "
                        "under %s; not sweeping", self.tier.path, len(committed), self.topic,
                        top)
            return 0
        hours = max(self.vacuum_retain_hours, ORPHAN_MIN_AGE_H)
        # never a file this run may still be writing, whatever the retain
        older_than = min(time.time() - hours * 3600, self._created)
        removed = 0
        for rel, (uri, mtime) in files.items():
            if rel in committed or mtime >= older_than:
                continue
            try:
                if not fs.remove(uri):
                    continue
            except OSError as e:
                log.warning("archive %s: cannot remove %s: %s", self.tier.path, uri, e)
                continue
            removed += 1
            if fs.is_local(uri):               # Hadoop's local checksum file beside it
                folder, name = os.path.split(uri)
                try:
                    os.remove(os.path.join(folder, f".{name}.crc"))
                except OSError:
                    pass
        if removed:
            log.info("archive %s: removed %d files of topic %s that its log does not name "
                     "(older than %g h)", self.tier.path, removed, self.topic, hours)
        return removed

    def _remove_parquet(self, expired, cutoff_ms: int) -> int:
        removed = 0
        for f in expired:
            if f.max_ts_us < cutoff_ms * 1000:       # whole file expired
                if fs.remove(f.path):                 # False: removed by an earlier pass
                    removed += 1
        return removed
