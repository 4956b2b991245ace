"""The compacted table: latest value per key, and point lookups on it without Spark.

Layout (Delta, written by the compaction job): the message columns of the
``rocketmq`` source for the record that won for each key, plus ``bucket``
= crc32(key) mod B, the partition column. B is fixed when the table is
created and kept in ``_rmq_table.json`` next to ``_delta_log`` (Delta
ignores files whose name starts with ``_``); tables created before that
keep it in the table property ``rmq.buckets``. The table itself is created
by the job's first write (a Delta write sets no property outside ``delta.``).

A lookup reads the Delta log (cached until the log changes), keeps the files
of the key's bucket (partition pruning: 1/B of the table), reads only their
``key`` column to find the row, then that one row's columns: a few
milliseconds for a million keys on a local disk. Deletion vectors are off
(the log is read here, without Spark).
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rmq_spark import fs
from rmq_spark.archive.delta_log import version as log_version
from rmq_spark.archive.reader import delta_file_path, delta_log

from .errors import CompactionConfigError


__all__ = ["BUCKETS_PROPERTY", "DEFAULT_BUCKETS", "ROW_GROUP_CONF", "TABLE_DDL", "bucket_of",
           "buckets_of", "write_buckets", "CompactedTable", "TableRow"]

BUCKETS_PROPERTY = "rmq.buckets"
BUCKETS_FILE = "_rmq_table.json"
DEFAULT_BUCKETS = 32
# A lookup reads its bucket's key column, then the whole row group holding the key
# (``_read_row``). The job writes each bucket as one file, and Parquet's default row
# group is 128 MB, so a row group would grow with the table: 1 MB (uncompressed, as
# the writer counts) bounds what a lookup reads past the keys. The job sets it on its
# session (Spark hands SQL confs to the Parquet writer) for the first write and MERGE.
ROW_GROUP_CONF = {"parquet.block.size": str(1 << 20)}
TABLE_DDL = ("key binary, value binary, topic string, queue int, offset long, "
             "timestamp timestamp, born_timestamp timestamp, tags string, "
             "properties map<string,string>, msg_id string, bucket int")
_COLUMNS = ["key", "value", "topic", "queue", "offset", "timestamp", "born_timestamp", "tags",
            "properties", "msg_id"]


def bucket_of(key: bytes, buckets: int) -> int:
    """Spark's ``pmod(crc32(key), buckets)``."""
    return zlib.crc32(key) % buckets


def write_buckets(path: str, buckets: int) -> None:
    """Record the bucket count of the table at ``path`` before its first write."""
    fs.write_bytes(fs.join(path, BUCKETS_FILE), json.dumps({"buckets": buckets}).encode())


def buckets_of(path: str, conf: dict) -> int | None:
    """The bucket count of the table at ``path`` (``conf``: its table properties);
    None when neither the table property nor the file records one."""
    if BUCKETS_PROPERTY in conf:
        return int(conf[BUCKETS_PROPERTY])
    where = fs.join(path, BUCKETS_FILE)
    try:
        text = fs.read_text(where)
    except FileNotFoundError:
        return None
    try:
        buckets = json.loads(text)["buckets"]
        if not isinstance(buckets, int) or isinstance(buckets, bool) or not 1 <= buckets <= 4096:
            raise ValueError(buckets)
        return buckets
    except (ValueError, KeyError, TypeError):
        raise CompactionConfigError(f"{where} does not hold a bucket count: {text[:200]!r} "
                                    "(expected {\"buckets\": N}, N from 1 to 4096)") from None


@dataclass(frozen=True)
class TableRow:
    key: bytes
    value: bytes
    queue: int
    offset: int
    timestamp_ms: int
    tags: str
    properties: dict


class CompactedTable:
    """Read access to a compacted table at ``path`` (a local directory or a URI: rmq_spark.fs)."""

    def __init__(self, path: str):
        self.path = path
        self._stamp = None
        self._by_bucket: dict[int, list[str]] = {}
        self.buckets = DEFAULT_BUCKETS

    def exists(self) -> bool:
        return log_version(self.path) is not None

    def _refresh(self) -> None:
        # The newest commit: every change to the table adds one (found without a
        # listing: rmq_spark.archive.delta_log).
        stamp = log_version(self.path)
        if stamp is None:
            self._by_bucket, self._stamp = {}, None
            return
        if stamp == self._stamp:
            return
        found = delta_log(self.path)
        adds, conf = found if found else ([], {})
        if self._stamp is None:            # fixed for the table's life: read once
            buckets = buckets_of(self.path, conf)
            if buckets is None:
                raise CompactionConfigError(
                    f"{self.path} is not a compacted table: it records no bucket count "
                    f"({BUCKETS_FILE} or table property {BUCKETS_PROPERTY})")
            self.buckets = buckets
        by_bucket: dict[int, list[str]] = {}
        for a in adds:
            b = int((a.get("partitionValues") or {}).get("bucket", -1))
            by_bucket.setdefault(b, []).append(delta_file_path(self.path, a))
        self._by_bucket, self._stamp = by_bucket, stamp

    def get(self, key: bytes) -> TableRow | None:
        """The latest value of ``key`` in the table; None if absent (or deleted)."""
        self._refresh()
        for path in self._by_bucket.get(bucket_of(key, self.buckets), []):
            keys = _read(path, columns=["key"]).column("key")
            hit = np.nonzero(pc.equal(keys, pa.scalar(key, pa.binary())).to_numpy(
                zero_copy_only=False))[0]
            if len(hit):
                return _row(_read_row(path, int(hit[0])))
        return None

    def scan(self, prefix: bytes = b"", limit: int | None = None) -> list[TableRow]:
        """Rows whose key starts with ``prefix``, in key order."""
        self._refresh()
        out: list[TableRow] = []
        for paths in self._by_bucket.values():
            for path in paths:
                t = _read(path, columns=_COLUMNS)
                keys = t.column("key").to_pylist()
                idx = [i for i, k in enumerate(keys) if k.startswith(prefix)]
                if idx:
                    out.extend(_row(r) for r in t.take(idx).to_pylist())
        out.sort(key=lambda r: r.key)
        return out[:limit] if limit is not None else out


def _read(path: str, **kwargs) -> pa.Table:
    store, at = fs.resolve(path)
    return pq.read_table(at, filesystem=store, **kwargs)


def _read_row(path: str, index: int) -> dict:
    store, at = fs.resolve(path)
    f = pq.ParquetFile(at, filesystem=store)
    start = 0
    for rg in range(f.num_row_groups):
        n = f.metadata.row_group(rg).num_rows
        if index < start + n:
            t = f.read_row_group(rg, columns=_COLUMNS)
            return t.slice(index - start, 1).to_pylist()[0]
        start += n
    raise IndexError(f"{path}: row {index} past the end")


def _row(r: dict) -> TableRow:
    ts = r["timestamp"]
    return TableRow(r["key"], r["value"], r["queue"], r["offset"],
                    int(ts.timestamp() * 1000) if ts is not None else 0, r["tags"] or "",
                    dict(r["properties"] or []))
