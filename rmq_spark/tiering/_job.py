"""The tiering job: ``spark.readStream.format("rocketmq")`` -> Delta/Parquet archive.

One Structured Streaming query per topic. Exactly once into the archive:

* Delta: ``foreachBatch`` appends with Delta's idempotent-write identity,
  ``txnAppId`` = ``rmq-tier-fence/TOPIC`` and ``txnVersion`` = the job's lease
  token and the batch id (``_fence``): a batch replayed after a kill is skipped
  by Delta, and so is (or fails) the append of a job that lost its lease.
* Parquet: Spark's file stream sink; its ``_spark_metadata`` log is the
  commit record (a new checkpoint continues the log's batch numbering, see
  ``rmq_spark.jobs.checkpoint.seed``).

The read starts at or above the ``archive`` watermark and reads the hot log
only (``readArchive=false``). After each committed batch a monitor (the
caller's thread for ``available-now``, a daemon thread otherwise) moves the
watermark to the batch's end, prints a progress line and, for Parquet, runs
archive retention; Delta's retention runs inside ``foreachBatch``, between
appends, so a DELETE never races an append. One job per topic: the job holds
the topic's ``tier`` lease while it runs (``_lease``).
"""
from __future__ import annotations

import logging
import re
import threading
from typing import Callable

from rmq_spark import fs
from rmq_spark.archive import layout
from rmq_spark.archive.reader import delta_txn_version
from rmq_spark.client import Client, TlsFiles
from rmq_spark.jobs import AVAILABLE_NOW, UTC_CONF, delta_conf, hot_stream
from rmq_spark.jobs import checkpoint as _checkpoint
from rmq_spark.spark import session_conf

from . import _fence
from ._config import DEFAULT_VACUUM_RETAIN_HOURS, TierSettings, check_location
from ._lease import TTL_S, LeaseLost, TierLease
from ._retention import ArchiveRetention
from ._watermark import archived_positions, queue_info, start_positions, sync_watermark
from .errors import TierConfigError

__all__ = ["tier_topic", "start_tiering"]

log = logging.getLogger(__name__)
POLL_S = 0.5
# Set on the query's own (cloned) session at start; the caller's session is left as it was.
_QUERY_CONF = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
               **UTC_CONF}                                 # date partition = UTC date
# Write each task's rows as they come to one file per partition value, instead of
# letting the writer sort them by (topic, date) first: a task reads one queue's offset
# range in order, and store time (so date) never decreases in a queue, so each file is
# in (queue, offset) order as it is. A sort would copy every row once more (~8% of a
# Delta batch here). Past 16 open files in a task Spark falls back to sorting.
_WRITER_CONF = {"spark.sql.maxConcurrentOutputFileWriters": "16"}


def tier_topic(spark, endpoints: str, topic: str, archive: str | None = None,
               format: str | None = None, trigger: str = AVAILABLE_NOW,
               checkpoint: str | None = None, max_offsets_per_trigger: int | None = None,
               fail_on_data_loss: bool = True,
               vacuum_retain_hours: float = DEFAULT_VACUUM_RETAIN_HOURS,
               retention_check_s: float = 60.0,
               progress: Callable[[str], None] | None = None, tls: TlsFiles | None = None,
               token: str | None = None, lease_ttl_s: float = TTL_S):
    """Archive ``topic`` into its Delta/Parquet archive with a streaming query.

    Parameters
    ----------
    spark : SparkSession
        With Delta configured for a delta archive (``rmq_spark.spark.session_builder()``).
    endpoints : str
        Storage nodes, ``"host:port[,host:port...]"``.
    topic : str
        The topic to archive.
    archive : str, optional
        Local directory of the archive. Default: the topic's ``tier`` config.
        A topic without one gets ``tier = FORMAT:archive`` recorded; a topic
        tiered elsewhere is refused (``TierConfigError``).
    format : ``"delta"`` | ``"parquet"``, optional
        Default: the topic's tier format, else ``delta``.
    trigger : str, default ``"available-now"``
        ``"available-now"``: archive what is there now, then stop (the call
        waits). An interval such as ``"30s"``: run until stopped (the call
        returns the running query).
    checkpoint : str, optional
        Default ``ARCHIVE/_rmq_checkpoints/TOPIC``, so a rerun resumes. A new
        checkpoint starts at the ``archive`` watermark (and never below what
        the archive holds): a lost checkpoint re-archives nothing.
    max_offsets_per_trigger : int, optional
        At most this many messages per micro-batch (``available-now`` too).
    fail_on_data_loss : bool, default True
        Fail when offsets to archive are gone from the hot log.
    vacuum_retain_hours : float, default 168
        Delta archive retention: ``VACUUM ... RETAIN`` hours. Below 168,
        Delta's retention-duration check is switched off for that VACUUM.
    retention_check_s : float, default 60
        Archive retention runs at start and then at most this often.
    progress : callable, optional
        Receives one line per committed batch (default: logged at INFO).
    tls : TlsFiles, optional
        A cluster with TLS: its CA (and a client certificate where required),
        for the job's own calls and its source.
    token : str, optional
        A cluster with ACLs: the job's bearer token (its principal needs consume
        and alter on the topic), for its calls and its source (a redacted option).
    lease_ttl_s : float, default 30
        TTL of the job's lease on the topic (3 s to 1 day): a job that died
        holds the topic this long after its last renewal; the job renews every
        third of it and stops when it could not renew for 90% of it.

    Returns
    -------
    StreamingQuery
        Terminated for ``available-now`` (its exception, if any, is raised),
        running otherwise.
    """
    client = Client(endpoints, tls=tls, token=token)
    try:
        settings = TierSettings.create(
            client, endpoints, topic, archive, format, trigger, checkpoint,
            max_offsets_per_trigger, fail_on_data_loss, vacuum_retain_hours, retention_check_s,
            lease_ttl_s)
    finally:
        client.close()
    return start_tiering(spark, settings, progress)


def start_tiering(spark, settings: TierSettings, progress: Callable[[str], None] | None = None):
    """``tier_topic`` for settings already checked (``TierSettings.create``)."""
    client = Client(settings.endpoints, tls=settings.tls, token=settings.token)
    try:
        run = _Run(spark, settings, client, progress or (lambda line: log.info("%s", line)))
        query = run.start()
    except BaseException:
        client.close()
        raise
    if settings.available_now:
        run.watch(query)
        return query
    threading.Thread(target=run.watch, args=(query,), name=f"rmq-tier-{settings.topic}",
                     daemon=True).start()
    # A continuous job may end for a reason the query does not show (its lease was
    # lost: the monitor stopped it). Callers that wait for it ask here.
    query.rmq_outcome = run.outcome
    return query


class _Run:
    """One run of the tiering query: preparation, the writer, the monitor."""

    def __init__(self, spark, settings: TierSettings, client: Client,
                 progress: Callable[[str], None]):
        self.spark, self.s, self.client, self.progress = spark, settings, client, progress
        self.retention = ArchiveRetention(client, settings.topic, settings.tier,
                                          settings.vacuum_retain_hours, settings.retention_check_s,
                                          lease_token=lambda: self.lease.token)
        self._reported: int | None = None      # last batch with a progress line
        self._synced: int | None = None        # last batch whose end is the watermark
        self._end: dict[int, int] = {}
        self._legacy_done: int | None = None   # last batch committed under the pre-fence app id
        self._table_found = False              # the Delta archive has a log (it stays so)
        self.lease = TierLease(settings.endpoints, settings.topic,
                               _checkpoint.lease_owner(settings.checkpoint), settings.lease_ttl_s,
                               tls=settings.tls, token=settings.token)
        self._lease_lost: LeaseLost | None = None
        self._query = None                     # once started (the lease thread stops it)
        self.finished = threading.Event()      # the monitor is done (watch)
        self.failure: BaseException | None = None

    # ------------------------------------------------------------ start
    def start(self):
        """Take the topic's lease, prepare (table, checkpoint, watermark, retention)
        and start the query."""
        try:
            self.lease.take()
            # Renewed from here on: preparing (the fence, a retention pass) may take
            # longer than the lease's TTL.
            self.lease.start_renewing(self._lose_lease)
            query = self._start()
        except BaseException:
            self.lease.release()
            raise
        self._query = query
        if self._lease_lost is not None:      # lost while the query started
            query.stop()
        return query

    def _start(self):
        s = self.s
        check_location(s.tier.path, "archive")          # before anything is written anywhere
        check_location(s.checkpoint, "checkpoint")
        with session_conf(self.spark, self._conf()):
            if s.tier.format == "delta":
                _fence.raise_fence(s.tier.path, s.topic, self.lease.token, self._append_empty)
            starting = self._prepare_checkpoint()
            sync_watermark(self.client, s.topic, s.checkpoint, self.lease.token)
            self.retention.maybe_run(self.spark)
            self._reported = self._synced = _checkpoint.latest_batch(s.checkpoint)
            if self._lease_lost is not None:
                raise self._lease_lost
            query = self._writer(self._frame(starting)).start()
        log.info("tiering %s into %s (checkpoint %s) started", s.topic, s.tier, s.checkpoint)
        return query

    def _lose_lease(self, err: LeaseLost) -> None:
        """From the lease thread: another job may own the topic now; stop appending."""
        log.error("%s", err)
        self._lease_lost = err
        if self._query is not None:
            self._query.stop()

    def _conf(self) -> dict[str, str]:
        """SQL confs for the run; the query keeps its own copy from ``start()`` on."""
        conf = {**_QUERY_CONF, **_WRITER_CONF}
        if self.s.tier.format == "delta":
            conf.update(delta_conf(self.spark))     # each append is an idempotent write
        return conf

    def _frame(self, starting: dict[int, int] | None):
        s = self.s
        # A task per queue range, so archive files stay within a queue and reads
        # prune by queue (the source packs small ranges into one task by default).
        return layout.archive_frame(hot_stream(
            self.spark, s.endpoints, s.topic, starting, s.max_offsets_per_trigger, tls=s.tls, token=s.token,
            failOnDataLoss=str(s.fail_on_data_loss).lower(), packRecordsPerTask="0",
            driverReadRecords="0"))

    def _writer(self, frame):
        s = self.s
        w = (frame.writeStream.queryName(f"rmq-tier-{s.topic}").trigger(**s.trigger)
             .option("checkpointLocation", s.checkpoint))
        if s.tier.format == "delta":
            return w.foreachBatch(self._delta_batch)
        return w.format("parquet").partitionBy(*layout.PARTITION_COLUMNS).option("path", s.tier.path)

    def _prepare_checkpoint(self) -> dict[int, int] | None:
        """Starting offsets for a new checkpoint (None: resume, or seeded)."""
        s = self.s
        sink_batch = _sink_latest_batch(s.tier)
        ours = _checkpoint.latest_batch(s.checkpoint, "offsets")
        archived = archived_positions(self.client, s.topic, s.tier)
        if s.tier.format == "delta":
            pending = ours if ours is not None and ours != _checkpoint.latest_batch(s.checkpoint) else None
            _fence.check_resume(s.tier.path, s.topic, s.checkpoint, self.lease.token, pending)
        if ours is not None:
            self._check_owner(ours, sink_batch, archived)
            if s.tier.format == "delta":
                self._legacy_done = delta_txn_version(s.tier.path, _fence.legacy_app_id(
                    s.topic, _checkpoint.query_id(s.checkpoint)))
            return None
        start = start_positions(self.client, s.topic, archived)
        if sink_batch is None:
            return start
        _checkpoint.seed(s.checkpoint, sink_batch, s.topic, start)
        return None

    def _check_owner(self, ours: int, sink_batch: int | None, archived: dict[int, int]) -> None:
        """Refuse a checkpoint the archive has moved past (another checkpoint wrote on):
        resuming it would archive those messages again."""
        s = self.s
        planned = _checkpoint.batch_end(s.checkpoint, ours, s.topic)
        ahead = {q: o for q, o in archived.items() if o > planned.get(q, o)}
        if (sink_batch is not None and sink_batch > ours) or ahead:
            where = (f"its file-sink log is at batch {sink_batch}, the checkpoint at batch {ours}"
                     if not ahead else f"it holds offsets {_positions_text(ahead)}, the "
                     f"checkpoint ends at {_positions_text(planned)}")
            raise TierConfigError(
                f"archive {s.tier.path} of topic {s.topic!r} was written on by another "
                f"checkpoint than {s.checkpoint} ({where}). Resume with the checkpoint that "
                "wrote last, or give a new (empty) one: it starts where the archive ends")

    # ----------------------------------------------------------- writer
    def _delta_batch(self, df, batch_id: int) -> None:
        self.lease.check()          # a job whose lease lapsed must not append
        if self._legacy_done is not None and batch_id <= self._legacy_done:
            return                  # committed before fencing, under the checkpoint's own app id
        self._append(df, _fence.batch_version(self.lease.token, batch_id))
        self.retention.maybe_run(df.sparkSession)

    def _append_empty(self, version: int) -> None:
        """The fence (``_fence.raise_fence``): an empty append at ``version``."""
        self._append(self.spark.createDataFrame([], layout.ARCHIVE_DDL), version)

    def _append(self, df, version: int) -> None:
        """Append ``df`` to the Delta archive as idempotent write ``version`` of the
        topic's fence app id; skipped by Delta if a version as high is recorded."""
        from delta.exceptions import MetadataChangedException, ProtocolChangedException

        path = self.s.tier.path
        new = not (self._table_found or _has_delta_log(path))
        # A new archive is created by its first append (the "delta." options are its
        # table properties; an existing table ignores them). Creating it before the
        # query instead costs a CREATE TABLE, and makes the first append's txn lookup
        # compute the table's state: ~1 s per new archive.
        write = (df.write.format("delta").options(**layout.DELTA_TABLE_PROPERTIES)
                 .option("txnAppId", _fence.app_id(self.s.topic)).option("txnVersion", version)
                 .mode("append").partitionBy(*layout.PARTITION_COLUMNS))
        try:
            write.save(path)
        except (ProtocolChangedException, MetadataChangedException) as e:
            # Two jobs (topics sharing an archive) creating the table at once: one
            # commit loses. The table exists now; append to it. Had this append
            # committed, its txn version would make the retry a no-op.
            if not new or not _has_delta_log(path):
                raise
            log.info("archive %s was created by another job meanwhile (%s); appending again",
                     path, type(e).__name__)
            self.lease.check()
            write.save(path)
        self._table_found = True

    # ---------------------------------------------------------- monitor
    def watch(self, query) -> None:
        """Until the query ends: after each committed batch, watermark + progress line."""
        failure = None
        try:
            while True:
                try:
                    if query.awaitTermination(POLL_S):
                        break
                except Exception as e:       # the query failed: record what it committed
                    failure = e
                    break
                self._safe_poll(query)
            self.poll(query, final=True)
        finally:
            if query.isActive:               # interrupted here: the query must not outlive its lease
                query.stop()
            self.lease.release()
            self.client.close()
        failure = self._lease_lost or failure    # a query stopped for its lease did not finish
        self.failure = failure
        self.finished.set()
        if failure is not None:
            if self.s.available_now:
                raise failure
            log.error("tiering query of %s failed: %s", self.s.topic, failure)

    def outcome(self, timeout: float = 60.0) -> BaseException | None:
        """Once the query ended: why it failed (None if it did not), after the monitor
        is done (lease released, watermark of the last batch set)."""
        self.finished.wait(timeout)
        return self.failure

    def _safe_poll(self, query) -> None:
        try:
            self.poll(query)
        except Exception:                    # a retriable hiccup: the next poll catches up
            log.warning("tiering %s: progress check failed; retrying", self.s.topic,
                        exc_info=True)

    def poll(self, query, final: bool = False) -> None:
        """Watermark as soon as a batch is committed; its progress line once Spark
        has reported the batch (or the query has ended)."""
        # From the last batch seen on: a HEAD a poll on an object store, not a listing
        latest = _checkpoint.latest_batch(self.s.checkpoint, after=-1 if self._synced is None
                                          else self._synced)
        if latest is None or latest == self._reported:
            return
        if latest != self._synced:
            self._end = sync_watermark(self.client, self.s.topic, self.s.checkpoint, self.lease.token,
                                       latest) or {}
            self._synced = latest
        first = 0 if self._reported is None else self._reported + 1
        rows = _rows(query, first, latest)
        if rows is None and not final:
            return
        self._reported = latest
        info = queue_info(self.client, self.s.topic)
        lag = sum(max(0, i["latest"] - self._end.get(q, i["earliest"])) for q, i in info.items())
        batches = f"batch {latest}" if first >= latest else f"batches {first}-{latest}"
        self.progress(f"tier {self.s.topic}: {batches} committed, {rows or '?'} rows, archived "
                      f"to {_positions_text(self._end)}, lag {lag}")
        if self.s.tier.format == "parquet":
            self.retention.maybe_run()


def _rows(query, first: int, last: int) -> int | None:
    """Rows read by batches first..last, from Spark's progress; None until it has the last."""
    counts = {p["batchId"]: p["numInputRows"] for p in query.recentProgress   # dicts
              if first <= p["batchId"] <= last}
    return sum(counts.values()) if last in counts else None


def _positions_text(end: dict[int, int]) -> str:
    return " ".join(f"q{q}={o}" for q, o in sorted(end.items())) or "-"


def _sink_latest_batch(tier: layout.Tier) -> int | None:
    """Latest batch id in a Parquet archive's file-sink log (None for Delta or no log)."""
    if tier.format != "parquet":
        return None
    names = fs.list_names(fs.join(tier.path, "_spark_metadata")) or []
    ids = [int(m.group(1)) for n in names if (m := re.fullmatch(r"(\d+)(\.compact)?", n))]
    return max(ids) if ids else None


def _has_delta_log(path: str) -> bool:
    """Whether the Delta table at ``path`` has a first commit."""
    names = fs.list_names(fs.join(path, "_delta_log")) or []
    return any(n.endswith(".json") or ".checkpoint" in n for n in names)
