"""Reading an archive without Spark: its committed files, their statistics, a queue's rows.

Planning runs in Spark's Python planner process, which has no SparkSession,
so the archive's file list comes straight from its log:

* Delta: the ``_delta_log`` (last checkpoint + later JSON commits); each
  ``add`` action carries the file's partition values and its min/max
  statistics of queue, offset and timestamp.
* Parquet: the file sink's ``_spark_metadata`` log (latest ``.compact`` +
  later batches); statistics come from each file's Parquet footer.

``ArchiveSnapshot.spans(topic)`` turns that into, per queue, the files in
offset order. Executors then read only those files with pyarrow and keep the
rows of one queue and offset range (``read_files``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import fs
from .delta_log import replay as replay_log
from .sink_log import committed_paths
from .errors import ArchiveError
from .layout import DATA_COLUMNS, Tier

__all__ = ["delta_log", "delta_file_path", "ArchiveFile", "ArchiveSnapshot", "load_snapshot", "read_files",
           "QueueFiles", "offset_for_timestamp", "parquet_sink_paths"]

_CONF_KEY = "\0configuration"       # where the table configuration rides among the adds
_SUPPORTED_READER_FEATURES = {"timestampNtz", "vacuumProtocolCheck"}


@dataclass(frozen=True)
class ArchiveFile:
    path: str
    topic: str | None           # None when the partition value is unknown
    min_queue: int
    max_queue: int
    min_offset: int
    max_offset: int
    min_ts_us: int
    max_ts_us: int
    rows: int


@dataclass
class QueueFiles:
    """One queue's part of the archive: files in offset order, offsets [earliest, end)."""
    files: list[ArchiveFile] = field(default_factory=list)

    @property
    def earliest(self) -> int:
        return self.files[0].min_offset

    @property
    def end(self) -> int:
        return max(f.max_offset for f in self.files) + 1

    def covering(self, lo: int, hi: int) -> list[ArchiveFile]:
        return [f for f in self.files if f.max_offset >= lo and f.min_offset < hi]


@dataclass
class ArchiveSnapshot:
    tier: Tier
    files: list[ArchiveFile]

    def spans(self, topic: str) -> dict[int, QueueFiles]:
        out: dict[int, QueueFiles] = {}
        for f in self.files:
            if f.topic not in (None, topic) or f.rows == 0:
                continue
            for q in range(f.min_queue, f.max_queue + 1):
                out.setdefault(q, QueueFiles()).files.append(f)
        for qf in out.values():
            qf.files.sort(key=lambda f: (f.min_offset, f.max_offset))
        return out


def load_snapshot(tier: Tier) -> ArchiveSnapshot | None:
    """The committed files of the archive now; None if it does not exist yet."""
    if tier.format == "delta":
        files = _delta_files(tier.path)
    else:
        files = _parquet_sink_files(tier.path)
    return None if files is None else ArchiveSnapshot(tier, files)


# ------------------------------------------------------------------ Delta log
def delta_log(root: str) -> tuple[list[dict], dict] | None:
    """The live ``add`` actions and table configuration of the Delta table at ``root``
    (last classic checkpoint + later JSON commits); None if it has no log yet."""
    adds: dict[str, dict] = {}
    if not replay_log(root, lambda action: _apply_action(action, adds)):
        return None
    conf = adds.pop(_CONF_KEY, {})
    return list(adds.values()), conf


def delta_txn_version(root: str, app_id: str) -> int | None:
    """The version Delta recorded for the idempotent-write id ``app_id`` (its
    ``txn`` actions); None when it has none, or the table has no log."""
    found: list[int] = []

    def note(action: dict) -> None:
        txn = action.get("txn")
        if txn and txn.get("appId") == app_id:
            found.append(int(txn["version"]))

    replay_log(root, note)
    return max(found, default=None)


def delta_referenced_paths(root: str, listed: bool = True) -> set[str] | None:
    """Local paths of every file an ``add`` or a ``remove`` (a tombstone VACUUM has
    not passed yet) of the Delta table at ``root`` names, from the last checkpoint and
    later commits; None if it has no log yet."""
    paths: set[str] = set()
    scratch: dict[str, dict] = {}

    def note(action: dict) -> None:
        for kind in ("add", "remove"):
            if kind in action:
                paths.add(delta_file_path(root, action[kind]))
        if "protocol" in action or "metaData" in action:
            _apply_action(action, scratch)      # refuses a table this reader cannot read

    return paths if replay_log(root, note, listed=listed) else None


def delta_file_path(root: str, add: dict) -> str:
    """Where the file an ``add``/``remove`` action names is: a local path, or a URI
    on the table's object store."""
    raw = add["path"]
    if "://" in raw or raw.startswith("file:"):
        return fs.file_uri(raw)
    return fs.join(root, unquote(raw))


def _delta_files(root: str) -> list[ArchiveFile] | None:
    found = delta_log(root)
    return None if found is None else [_delta_file(root, a) for a in found[0]]


def _apply_action(action: dict, adds: dict[str, dict]) -> None:
    if "add" in action:
        a = action["add"]
        if a.get("deletionVector"):
            raise ArchiveError(f"archive file {a['path']} has a deletion vector; the rocketmq "
                               "reader needs delta.enableDeletionVectors=false on the archive")
        adds[a["path"]] = a
    elif "remove" in action:
        adds.pop(action["remove"]["path"], None)
    elif "protocol" in action:
        features = set(action["protocol"].get("readerFeatures") or ())
        unknown = features - _SUPPORTED_READER_FEATURES
        if "deletionVectors" in unknown:
            raise ArchiveError("archive table has deletion vectors enabled; the rocketmq reader "
                               "needs delta.enableDeletionVectors=false on the archive (the "
                               "tiering job creates it so)")
        if unknown:
            raise ArchiveError(f"archive table needs reader features {sorted(unknown)} that the "
                               f"rocketmq reader does not support (it supports "
                               f"{sorted(_SUPPORTED_READER_FEATURES)})")
    elif "metaData" in action:
        conf = action["metaData"].get("configuration") or {}
        if isinstance(conf, list):          # a checkpoint's map column
            conf = dict(conf)
        adds[_CONF_KEY] = conf
        if conf.get("delta.columnMapping.mode", "none") != "none":
            raise ArchiveError("archive table uses column mapping; the rocketmq reader needs "
                               "delta.columnMapping.mode=none")


def _delta_file(root: str, add: dict) -> ArchiveFile:
    path = delta_file_path(root, add)
    stats = add.get("stats")
    stats = json.loads(stats) if isinstance(stats, str) and stats else None
    topic = (add.get("partitionValues") or {}).get("topic")
    if not stats or "minValues" not in stats or "offset" not in stats["minValues"]:
        return _footer_file(path, topic)     # no statistics in the log: read the footer
    lo, hi = stats["minValues"], stats["maxValues"]
    return ArchiveFile(path, topic, int(lo["queue"]), int(hi["queue"]), int(lo["offset"]),
                       int(hi["offset"]), _iso_us(lo.get("timestamp")),
                       _iso_us(hi.get("timestamp")), int(stats.get("numRecords", 0)))


def _iso_us(text: str | None) -> int:
    if not text:
        return 0
    return int(np.datetime64(text.replace("Z", "").split("+")[0], "us").astype(np.int64))


# ------------------------------------------------------- Parquet file sink log
def _parquet_sink_files(root: str) -> list[ArchiveFile] | None:
    paths = parquet_sink_paths(root)
    if paths is None:
        return None
    out = []
    for path in paths:
        try:
            out.append(_footer_file(path, _partition_value(path, "topic")))
        except FileNotFoundError:           # removed by archive retention: gone on purpose
            continue
    return out


def parquet_sink_paths(root: str, listed: bool = False) -> list[str] | None:
    """Every file the Parquet file sink at ``root`` committed, whether or not it
    still exists; None without a log (``sink_log.committed_paths``)."""
    return committed_paths(root, listed)


def _partition_value(path: str, name: str) -> str | None:
    for part in path.split("/"):
        if part.startswith(name + "="):
            return unquote(part[len(name) + 1:])
    return None


def _footer_file(path: str, topic: str | None) -> ArchiveFile:
    store, at = fs.resolve(path)
    md = pq.read_metadata(at, filesystem=store)
    idx = {md.schema.column(i).name: i for i in range(md.num_columns)}
    lo: dict[str, int] = {}
    hi: dict[str, int] = {}
    for rg in range(md.num_row_groups):
        g = md.row_group(rg)
        if g.num_rows == 0:
            continue
        for name in ("queue", "offset", "timestamp"):
            st = g.column(idx[name]).statistics
            if st is None or not st.has_min_max:
                raise ArchiveError(f"{path}: no {name} statistics in the Parquet footer")
            mn, mx = _stat_int(st.min), _stat_int(st.max)
            lo[name] = min(lo.get(name, mn), mn)
            hi[name] = max(hi.get(name, mx), mx)
    if not lo:
        return ArchiveFile(path, topic, 0, -1, 0, -1, 0, 0, 0)
    return ArchiveFile(path, topic, lo["queue"], hi["queue"], lo["offset"], hi["offset"],
                       lo["timestamp"], hi["timestamp"], md.num_rows)


def _stat_int(v) -> int:
    if hasattr(v, "timestamp") and not isinstance(v, (int, np.integer)):
        return int(v.timestamp() * 1_000_000) if v.tzinfo else \
            int(np.datetime64(v, "us").astype(np.int64))
    return int(v)


# ------------------------------------------------------------------- reading
_READ_COLUMNS = list(DATA_COLUMNS)


def _read_parquet(path: str, **kwargs) -> pa.Table:
    store, at = fs.resolve(path)
    return pq.read_table(at, filesystem=store, **kwargs)


def read_files(files: list[str], topic: str, queue: int, lo: int, hi: int,
               schema: pa.Schema) -> pa.Table:
    """Rows of ``queue`` with offsets in [lo, hi) from ``files``, in offset order, as ``schema``."""
    parts = []
    filt = (pc.field("queue") == queue) & (pc.field("offset") >= lo) & (pc.field("offset") < hi)
    for path in files:
        try:
            t = _read_parquet(path, columns=_READ_COLUMNS, filters=filt)
        except FileNotFoundError:
            continue                       # vacuumed since planning: the caller sees the gap
        if t.num_rows:
            parts.append(t)
    if not parts:
        return schema.empty_table()
    t = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    offsets = t.column("offset").to_numpy()
    if len(offsets) > 1 and not (np.diff(offsets) > 0).all():
        t = t.take(pc.sort_indices(t, [("offset", "ascending")]))
    return _conform(t, topic, schema)


def _conform(t: pa.Table, topic: str, schema: pa.Schema) -> pa.Table:
    cols = []
    for f in schema:
        if f.name == "topic":
            cols.append(pa.array([topic] * t.num_rows, pa.string()) if t.num_rows < 64 else
                        pa.DictionaryArray.from_arrays(np.zeros(t.num_rows, np.int32),
                                                       pa.array([topic])).cast(pa.string()))
            continue
        c = t.column(f.name)
        cols.append(c if c.type == f.type else c.cast(f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def offset_for_timestamp(qf: QueueFiles, queue: int, timestamp_ms: int) -> int | None:
    """First archived offset of ``queue`` stored at or after ``timestamp_ms``; None if none."""
    ts_us = timestamp_ms * 1000
    for f in qf.files:                      # offset order; store time is non-decreasing
        if f.max_ts_us < ts_us:
            continue
        t = _read_parquet(f.path, columns=["queue", "offset", "timestamp"],
                          filters=pc.field("queue") == queue)
        ts = t.column("timestamp").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy()
        hit = t.column("offset").to_numpy()[ts >= ts_us]
        if len(hit):
            return int(hit.min())
    return None
