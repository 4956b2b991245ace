"""The compaction job: a compact topic -> a Delta table with the latest value per key.

A Structured Streaming query reads the topic (``format("rocketmq")``) and,
per micro-batch (``foreachBatch``):

1. reduces the batch to the last record of each key, by (queue, offset);
2. MERGEs it into the table on (bucket, key): a record replaces the row
   only if its (queue, offset) is higher than the row's, so a replayed or
   older record never overwrites a newer one; a tombstone (null value)
   deletes the row; a new key is inserted unless it is a tombstone. The
   MERGE carries Delta's idempotent-write identity (query id, batch id), so
   a batch replayed after a kill is skipped by Delta. The first batch of a
   run into a table that held no rows when the run started (a first build)
   is written instead of merged: its live records are the table. It
   overwrites, so it can only remove what a job that lost the topic wrote
   meanwhile (all of it above the compaction watermark, read again by the
   next batches), and Delta fails it if anything is committed while it runs.
   An overwrite costs about what the recomputation costs; a MERGE also
   materializes the batch and joins it with the table twice;
3. records the ``compaction`` watermark (the batch's end offsets) in the
   metadata group: everything below it is in the table.

One job compacts a topic at a time: it holds the topic's ``compact`` lease
(``rmq_spark.jobs.lease``: taken at start, renewed while the query runs,
given back when it ends), checks it before each MERGE, and every watermark
move carries its fencing token, so a job that lost it (paused, cut off, or a
second job) never moves the watermark.

The table path is the compact topic's ``compacted_table`` config (``delta:PATH``).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable

from rmq_spark import fs, jobs
from rmq_spark.archive import layout
from rmq_spark.archive.reader import delta_log
from rmq_spark.client import Client, TlsFiles
from rmq_spark.jobs import AVAILABLE_NOW, UTC_CONF, delta_conf, hot_stream
from rmq_spark.jobs import checkpoint as _checkpoint
from rmq_spark.jobs.lease import TTL_S, JobLease, LeaseLost, check_ttl
from rmq_spark.spark import session_conf

from .errors import CompactionConfigError
from .table import (BUCKETS_FILE, BUCKETS_PROPERTY, DEFAULT_BUCKETS, ROW_GROUP_CONF, TABLE_DDL,
                    buckets_of, write_buckets)

__all__ = ["compact_topic", "CompactLease", "CompactSettings"]

log = logging.getLogger(__name__)
_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_MESSAGE_COLUMNS = ("key", "value", "topic", "queue", "offset", "timestamp", "born_timestamp",
                    "tags", "properties", "msg_id")
_NEWER = "(s.queue > t.queue OR (s.queue = t.queue AND s.offset > t.offset))"


class CompactLease(JobLease):
    KIND = "compact"
    JOB = "compaction"
    VERB = "compacted"
    CONFIG_ERROR = CompactionConfigError


@dataclass(frozen=True)
class CompactSettings:
    endpoints: str
    topic: str
    table: str
    checkpoint: str
    trigger: dict
    buckets: int = DEFAULT_BUCKETS
    max_offsets_per_trigger: int | None = None
    lease_ttl_s: float = TTL_S
    tls: TlsFiles | None = None          # the cluster's TLS files (from the checking client)
    token: str | None = field(default=None, repr=False)   # its bearer token (ACLs)

    @classmethod
    def create(cls, client: Client, endpoints: str, topic: str, table: str | None = None,
               trigger: str = AVAILABLE_NOW, checkpoint: str | None = None,
               buckets: int = DEFAULT_BUCKETS,
               max_offsets_per_trigger: int | None = None,
               lease_ttl_s: float = TTL_S) -> "CompactSettings":
        trig = jobs.parse_trigger(trigger, CompactionConfigError)
        check_ttl(lease_ttl_s, CompactionConfigError)
        if buckets < 1 or buckets > 4096:
            raise CompactionConfigError(f"buckets {buckets}: use 1-4096")
        jobs.check_max_offsets(max_offsets_per_trigger, CompactionConfigError)
        cfg = next((t for t in client.list_topics() if t["name"] == topic), None)
        if cfg is None:
            raise CompactionConfigError(f"topic {topic!r} does not exist (create it with "
                                        f"`rmq topic create {topic} --cleanup-policy compact`)")
        if cfg["cleanup_policy"] != "compact":
            raise CompactionConfigError(
                f"topic {topic!r} has cleanup policy {cfg['cleanup_policy']!r}; compaction "
                "needs a compact topic (`rmq topic create NAME --cleanup-policy compact`)")
        current = layout.parse_tier(cfg["compacted_table"]) if cfg["compacted_table"] else None
        if table is None:
            if current is None:
                raise CompactionConfigError(f"topic {topic!r} has no table yet: give one "
                                            "(--table PATH)")
            path = current.path
        else:
            path = _checkpoint.location(table, "table", CompactionConfigError)
            if current is not None and current.path != path:
                raise CompactionConfigError(f"topic {topic!r} is compacted into {current.path}, "
                                            f"not {path}; omit --table, or change it first "
                                            f"(`rmq topic alter {topic} --compacted-table {path}`)")
        ckpt = (_checkpoint.location(checkpoint, "checkpoint", CompactionConfigError)
                if checkpoint else _checkpoint.checkpoint_under(path, topic))
        for where, what in ((path, "table"), (ckpt, "checkpoint")):
            try:       # before anything is written anywhere (the topic's config included)
                fs.check_writable(where, what)
            except fs.StoreError as e:
                raise CompactionConfigError(str(e)) from None
        if current is None:
            client.alter_topic(topic, compacted_table=f"delta:{path}")
        return cls(endpoints, topic, path, ckpt, trig, buckets, max_offsets_per_trigger, lease_ttl_s,
                   client.tls, client.token)

    @property
    def available_now(self) -> bool:
        return jobs.is_available_now(self.trigger)


def compact_topic(spark, endpoints: str, topic: str, table: str | None = None,
                  trigger: str = AVAILABLE_NOW, checkpoint: str | None = None,
                  buckets: int = DEFAULT_BUCKETS, max_offsets_per_trigger: int | None = None,
                  progress: Callable[[str], None] | None = None, tls: TlsFiles | None = None,
                  token: str | None = None, lease_ttl_s: float = TTL_S):
    """Compact ``topic`` into the Delta table at ``table`` (default: the topic's table).

    ``trigger``: ``"available-now"`` (compact what is there, then return the
    terminated query) or an interval such as ``"30s"`` (returns the running
    query). ``checkpoint`` defaults to ``TABLE/_rmq_checkpoints/TOPIC`` so a
    rerun resumes. ``buckets`` (fixed when the table is created) spreads
    keys over partitions for point lookups. ``progress`` gets a line per batch.
    ``tls``: a cluster with TLS (its CA, and a client certificate where required);
    ``token``: a cluster with ACLs, the job's bearer token (consume and alter on the topic).
    ``lease_ttl_s`` (3 s to 1 day, default 30): a job that died holds the topic this long
    after its last renewal; the job renews every third of it.
    """
    with Client(endpoints, tls=tls, token=token) as client:
        s = CompactSettings.create(client, endpoints, topic, table, trigger, checkpoint,
                                   buckets, max_offsets_per_trigger, lease_ttl_s)
        starting = None
        if _checkpoint.latest_batch(s.checkpoint, "offsets") is None:
            # A new checkpoint resumes at the compaction watermark. Starting lower is
            # safe too: the MERGE never lets an older record replace a newer one.
            info = client.describe_topic(topic)["queue_info"]
            starting = {q["queue"]: q["compacted"] if q.get("compacted", -1) >= 0 else -2
                        for q in info}
    lease = CompactLease(endpoints, topic, _checkpoint.lease_owner(s.checkpoint), s.lease_ttl_s,
                         tls=tls, token=token)
    lease.take()
    lost: list[LeaseLost] = []
    started: list = []               # the query, once started (the lease thread stops it)

    def on_lost(e: LeaseLost) -> None:
        log.error("%s", e)
        lost.append(e)
        for q in started:
            q.stop()

    # Renewed from here on: creating the table may take longer than the lease's TTL.
    lease.start_renewing(on_lost)
    try:
        # The query keeps its own copy of the confs from start() on.
        with session_conf(spark, {**UTC_CONF, **delta_conf(spark), **ROW_GROUP_CONF}):
            buckets_now, empty = _ensure_table(spark, s)
            say = progress or (lambda line: log.info("%s", line))
            writer = _BatchWriter(s, buckets_now, say, lease, empty)
            frame = hot_stream(spark, endpoints, topic, starting, s.max_offsets_per_trigger,
                               tls=tls, token=token)
            w = (frame.writeStream.queryName(f"rmq-compact-{topic}").trigger(**s.trigger)
                 .option("checkpointLocation", s.checkpoint).foreachBatch(writer))
            if lost:
                raise lost[0]
            query = w.start()
    except BaseException:
        lease.release()
        raise
    started.append(query)
    if lost:                         # lost while the query started
        query.stop()
    if s.available_now:
        try:
            query.awaitTermination()
        finally:
            lease.release()
        if lost:
            raise lost[0]
        return query

    def release_at_end() -> None:
        try:
            query.awaitTermination()
        except Exception:       # noqa: BLE001 - the query's own failure is the caller's to see
            pass
        finally:
            lease.release()
    threading.Thread(target=release_at_end, name=f"rmq-compact-{topic}-lease", daemon=True).start()
    return query


def _ensure_table(spark, s: CompactSettings) -> tuple[int, bool]:
    """The table's bucket count, and whether it holds no rows (no data file).

    A new table is created by the job's first write (creating it here costs a
    CREATE TABLE, and the first write's txn lookup then rebuilds the new table's
    state: ~0.6 s a run); its bucket count goes into ``_rmq_table.json`` first.
    An existing table must have the compacted table's columns.
    """
    found = delta_log(s.table)
    if found is None:
        write_buckets(s.table, s.buckets)
        return s.buckets, True
    adds, props = found
    schema = spark.createDataFrame([], TABLE_DDL).schema
    got = spark.read.format("delta").load(fs.to_spark(s.table)).schema
    buckets = buckets_of(s.table, props)
    if [f.name for f in got] != [f.name for f in schema]:
        raise CompactionConfigError(f"Delta table {s.table} is not a compacted table: its "
                                    f"schema is {got.simpleString()}, expected {TABLE_DDL}")
    if buckets is None:
        raise CompactionConfigError(f"Delta table {s.table} is not a compacted table: it "
                                    f"records no bucket count ({BUCKETS_FILE} or table "
                                    f"property {BUCKETS_PROPERTY})")
    return buckets, not adds


class _BatchWriter:
    """The foreachBatch function: reduce, MERGE (idempotent on batch id), watermark."""

    def __init__(self, s: CompactSettings, buckets: int, say: Callable[[str], None],
                 lease: JobLease, empty: bool = False):
        self.s, self.buckets, self.say, self.lease = s, buckets, say, lease
        self._empty = empty             # no row in the table yet: the next batch is written
        self._app_id: str | None = None

    def __call__(self, df, batch_id: int) -> None:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        spark = df.sparkSession
        if self._app_id is None:
            self._app_id = "rmq-compact:" + _checkpoint.query_id(self.s.checkpoint)
        cols = [F.col(c) for c in _MESSAGE_COLUMNS]
        latest = (df.where(F.col("key").isNotNull()).groupBy("key")
                  .agg(F.max_by(F.struct(*cols), F.struct("queue", "offset")).alias("r"))
                  .select("r.*")
                  .withColumn("bucket", F.pmod(F.crc32("key"), F.lit(self.buckets)).cast("int")))
        self.lease.check()          # a job that lost the topic's lease compacts nothing more
        if self._empty:         # creates the table if there is none yet
            schema = spark.createDataFrame([], TABLE_DDL).schema
            # One file per bucket, as a MERGE writes them (a lookup opens each file of
            # its bucket): a task per core, each with whole buckets. Costs no time.
            tasks = max(1, min(self.buckets, spark.sparkContext.defaultParallelism))
            (latest.where(F.col("value").isNotNull())
             .select(*[F.col(f.name).cast(f.dataType) for f in schema])
             .repartition(tasks, "bucket")
             .write.format("delta").mode("overwrite").partitionBy("bucket")
             .option("delta.enableDeletionVectors", "false")
             .option("partitionOverwriteMode", "static")
             .option("txnAppId", self._app_id).option("txnVersion", batch_id)
             .save(self.s.table))
        else:
            with session_conf(spark, {_TXN_APP_ID: self._app_id, _TXN_VERSION: str(batch_id)}):
                (DeltaTable.forPath(spark, self.s.table).alias("t")
                 .merge(latest.alias("s"), "t.bucket = s.bucket AND t.key = s.key")
                 .whenMatchedDelete(f"s.value IS NULL AND {_NEWER}")
                 .whenMatchedUpdateAll(f"s.value IS NOT NULL AND {_NEWER}")
                 .whenNotMatchedInsertAll("s.value IS NOT NULL")
                 .execute())
        self._empty = False
        end = _checkpoint.batch_end(self.s.checkpoint, batch_id, self.s.topic)
        if end:
            with Client(self.s.endpoints, tls=self.s.tls, token=self.s.token) as client:
                client.set_watermark(self.s.topic, "compaction", end, lease_token=self.lease.token)
        self.say(f"compact {self.s.topic}: batch {batch_id} merged, compacted to "
                 + " ".join(f"q{q}={o}" for q, o in sorted(end.items())))
