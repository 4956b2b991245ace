"""The ``rocketmq`` Spark data source: the thin Spark-facing class only."""
from __future__ import annotations

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    DataSourceStreamWriter, DataSourceWriter)
from pyspark.sql.types import StructType

from ._options import ReadOptions, WriteOptions
from .errors import OptionError

__all__ = ["RocketMQDataSource"]

_COLUMNS = [("key", "binary"), ("value", "binary"), ("topic", "string"), ("queue", "int"),
            ("offset", "bigint"), ("timestamp", "timestamp"), ("born_timestamp", "timestamp"),
            ("tags", "string"), ("properties", "map<string,string>"), ("msg_id", "string")]
_HEADERS = ("headers", "array<struct<key:string,value:binary>>")     # includeHeaders=true


class RocketMQDataSource(DataSource):
    """Read and write rmq topics from Spark: ``format("rocketmq")``.

    Works with ``spark.read``, ``spark.readStream``, ``df.write`` (mode
    ``append``) and ``df.writeStream``. Options are named as in Spark's Kafka
    source where the meaning is the same; unknown or malformed options fail
    at ``load()`` (reads) or at the write, naming the option.

    Schema of a read (fixed)::

        key binary, value binary, topic string, queue int, offset long,
        timestamp timestamp (store time, set by the service),
        born_timestamp timestamp (producer time), tags string,
        properties map<string,string>, msg_id string

    With ``includeHeaders=true``, ``headers array<struct<key string, value
    binary>>`` follows ``properties``.

    Common option
    -------------
    endpoints : str, required
        Storage nodes, ``"host:port[,host:port...]"``. Example ``"127.0.0.1:9100"``.
    tlsCaFile, tlsCertFile, tlsKeyFile : str, paths
        A cluster with TLS: the CA its nodes' certificates are signed by, and a
        client certificate and key where the nodes require one. Paths, not
        contents: the driver checks them, executors read the same paths.
    token, tokenFile : str
        A cluster with ACLs: a bearer token (``rmq principal create``), or a file
        holding one (read on the driver; executors get the token). Spark redacts
        an option named ``token`` in plans, the UI, progress and event logs
        (``spark.redaction.regex``); the principal needs ``consume`` on the topics
        a reader reads, ``produce`` on those a writer writes.

    Read options
    ------------
    topic : str
        One topic. Exactly one of ``topic``, ``topics`` (or ``subscribe``),
        ``topicPattern`` (or ``subscribePattern``), ``assign``; an alias and
        its original together are an error too.
    topics : str; alias ``subscribe`` (Spark's Kafka source name)
        Comma-separated topics, e.g. ``"orders,payments"``.
    topicPattern : str; alias ``subscribePattern`` (Kafka's name)
        Python regular expression matched against whole topic names, e.g.
        ``"orders-.*"``. Streams pick up matching topics created later,
        from their earliest offset.
    assign : str (JSON), as in Spark's Kafka source
        Only these queues of these topics, ``{"orders": [0, 1], "payments": [2]}``,
        batch and stream (offsets keep the form ``{"topic": {"queue": n}}``).
        Every topic must exist and have each queue listed; starting/ending
        offsets may name assigned queues only.
    includeHeaders : bool, default ``false``
        Add the column ``headers array<struct<key: string, value: binary>>``
        after ``properties`` (as Spark's Kafka source): one entry per
        property, key = its name, value = the UTF-8 bytes of its value, in
        stored order; null for a message without properties (as Kafka).
    startingOffsets : str, default ``earliest`` (batch) / ``latest`` (stream)
        ``earliest``, ``latest`` or JSON ``{"orders": {"0": 23, "1": -2}}``
        (-2 = earliest, -1 = latest; queues left out start at earliest).
        A stream uses it only when it starts without a checkpoint.
    startingTimestamp : int (ms)
        Start every queue at its first message stored at or after this time.
    startingOffsetsByTimestamp : str
        JSON ``{"topic": {"queue": ms}}``: a timestamp per queue.
        At most one of the three ``starting*`` options.
    endingOffsets : str, default ``latest`` (batch only)
        ``latest`` or JSON offsets (exclusive; -1 = latest).
    endingTimestamp : int (ms), endingOffsetsByTimestamp : str (batch only)
        End at the first message stored at or after the time (exclusive).
    maxOffsetsPerTrigger : int
        Stream: at most this many offsets per micro-batch, split across
        queues in proportion to their backlog. Honoured by
        ``Trigger.AvailableNow`` too (the backlog is read in several batches).
    minOffsetsPerTrigger : int
        Stream: wait until this many offsets are available, or
        ``maxTriggerDelay`` has passed since the last batch.
    maxTriggerDelay : duration, default ``15m``
        E.g. ``500ms``, ``30s``, ``15m``, ``1h`` (a bare number is ms).
    failOnDataLoss : bool, default ``true``
        When offsets the query needs are gone (in neither the archive nor the
        hot log: retention, a re-created topic): ``true`` fails naming topic,
        queue and range; ``false`` skips them and logs a warning with the
        same facts.
    readArchive : bool, default ``true``
        For a tiered topic (``rmq topic create --tier``), offsets below the
        hot log's earliest are read from the Delta/Parquet archive, and so is
        every offset the archive already holds: one query sees the whole
        retained history, and ``earliest`` is the archive's earliest.
        ``false`` reads the hot log only, as a non-tiered topic.
    minPartitions : int
        Split large queue ranges so a read runs at least this many tasks.
    readFrom : ``leader`` | ``follower``, default ``leader``
        ``follower`` spreads fetches over replicas (read replicas); a lagging
        follower falls back to the leader, so results are the same.
    tags : str
        Server-side filter in RocketMQ syntax, ``"TagA || TagB"`` (``*`` = all).
        Offsets still advance over messages filtered out.
    consumerGroup : str
        Stream: after each micro-batch, commit its end offsets to this
        consumer group, so ``rmq offsets TOPIC`` shows the query's lag.
    maxBytesPerFetch : int, default 8388608
        Bytes per fetch request (64 KiB - 64 MiB); one fetch = one Arrow batch.
    localReads : bool, default ``true``
        A task on the same host as the node serving its queue reads the
        node's segment file itself (a short-circuit read: the node only says
        where the batches are), checking the file and every batch's CRC;
        anything amiss, a tag filter, or another host means a network fetch.
        ``false``: always fetch over the network.
    latestPerKey : bool, default ``false``
        Batch read of compact topics only: one row per live key (its latest
        value, ``offset`` = its revision), read from the nodes' key index
        without the compaction job; no offsets options, no headers.

    Write options and columns
    -------------------------
    topic : str
        Topic for every row; overrides a ``topic`` column.
    idempotenceKey : str
        Batch writes: names this write. Re-running the same job (same input,
        same partitioning) with the same key is applied once. Without it a
        batch write is exactly-once across task retries within the job.
        Streaming writes are always exactly-once (keyed by the query id).

    Columns: ``value`` (binary or string, required, not null), ``key``
    (binary or string), ``tags`` (string), ``properties``
    (map<string,string>), ``born_timestamp`` (timestamp), ``topic`` (string),
    ``queue`` (integer: the queue to write to; null or -1 = as if absent).
    Without ``queue``, keyed rows go to ``crc32(key) % queues`` and the rest
    are spread evenly. The read schema's ``offset``, ``timestamp`` and
    ``msg_id`` columns are ignored (the service assigns them); any other
    column is an error. Column types are checked before anything is written.

    Exactly-once: each task writes as one producer (query id or
    ``idempotenceKey``, plus the partition) with sequences from the micro-batch
    id and row positions, so retried tasks and replayed micro-batches are
    applied once. This relies on a replay giving each task the same rows in the
    same order (true for this source and other replayable sources).
    """

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> str:
        opts = ReadOptions.from_options(self.options)  # fail at load(), before any planning
        return _ddl(_read_columns(opts))

    def reader(self, schema: StructType) -> DataSourceReader:
        from ._batch_reader import BatchReader

        opts = ReadOptions.from_options(self.options)
        opts.check_batch()
        _check_read_schema(opts, schema)
        if opts.latest_per_key:
            from ._kv_latest import KvLatestReader, check_latest_per_key
            check_latest_per_key(opts)
            return KvLatestReader(opts)
        return BatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from ._stream_reader import StreamReader

        opts = ReadOptions.from_options(self.options)
        opts.check_streaming()
        if opts.latest_per_key:
            raise OptionError("latestPerKey", "is a batch read (spark.read); a stream reads every change: "
                              "leave it out")
        _check_read_schema(opts, schema)
        return StreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from ._writer import BatchWriter

        if overwrite:
            raise OptionError("mode", "the rocketmq sink only appends: use "
                              "df.write.format('rocketmq').mode('append'); a message log "
                              "cannot be overwritten")
        return BatchWriter(WriteOptions.from_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from ._writer import StreamWriter

        if overwrite:
            raise OptionError("outputMode", "the rocketmq sink only appends: use "
                              "outputMode('append') (or 'update' for aggregations)")
        return StreamWriter(WriteOptions.from_options(self.options), schema)


def _read_columns(opts: ReadOptions) -> list[tuple[str, str]]:
    if not opts.include_headers:
        return _COLUMNS
    at = [name for name, _ in _COLUMNS].index("properties") + 1
    return [*_COLUMNS[:at], _HEADERS, *_COLUMNS[at:]]


def _check_read_schema(opts: ReadOptions, schema: StructType) -> None:
    got = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    want = _read_columns(opts)
    if got != want:
        raise OptionError("schema", "the rocketmq source has a fixed schema and cannot be read "
                          "with a user-specified one; remove .schema(...) (expected: "
                          f"{_ddl(want)})")


def _ddl(columns: list[tuple[str, str]]) -> str:
    return ", ".join(f"{name} {typ}" for name, typ in columns)
