"""The few facts the streaming jobs read from (and tiering, once, writes to) a Spark checkpoint.

A streaming checkpoint is a directory of small logs (Spark's
``HDFSMetadataLog``): ``offsets/N`` is written before micro-batch N runs and
holds ``v1``, a metadata line and one line per source with the batch's END
offsets; ``commits/N`` appears once batch N is committed to the sink;
``metadata`` holds the query id. A job's query has one source, so line 3
of ``offsets/N`` is ``{"topic": {"queue": next_offset}}``.

A checkpoint (like an archive or a table) is a local path, a ``file:`` URI
or an object-store URI (``s3a://BUCKET/PREFIX``; ``rmq_spark.fs``). A stable
default lives under the job's output location (``checkpoint_under``), so a
rerun resumes.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from urllib.parse import urlparse

from .. import fs
from .errors import JobConfigError

__all__ = ["location", "checkpoint_under", "latest_batch", "batch_end", "committed_end",
           "query_id", "seed"]

Positions = dict[int, int]
# Files a checkpoint holds besides its logs (the tier fence's token: tiering/_fence.py)
_CHECKPOINT_FILES = ("metadata", "rmq_tier_token")


def location(path: str, what: str, error: type[JobConfigError] = JobConfigError) -> str:
    """Where a job reads or writes: a local absolute path (from a path or a ``file:``
    URI), or an object-store URI with its bucket (``s3://`` and ``s3n://`` become
    ``s3a://``, the name Spark's Hadoop knows). Anything else is refused with
    ``error`` (the calling job's own ``JobConfigError``)."""
    if not path:
        raise error(f"{what} is empty: give a local directory or an s3a://BUCKET/PREFIX URI")
    if fs.userinfo_refusal(path):
        raise error(f"{what} {fs.userinfo_refusal(path)}")
    if "://" in path or path.startswith("file:"):
        u = urlparse(path)
        if u.scheme == "file":
            path = u.path
        elif u.scheme in fs.OBJECT_SCHEMES:
            if not u.netloc:
                raise error(f"{what} {path!r}: no bucket; expected {u.scheme}://BUCKET/PREFIX")
            return fs.to_spark(path.rstrip("/"))
        else:
            raise error(f"{what} {path!r}: scheme {u.scheme!r} is not supported; use a local "
                        f"path, file:, or one of {', '.join(s + '://' for s in fs.OBJECT_SCHEMES)}")
    return os.path.abspath(path)


def lease_owner(checkpoint: str) -> str:
    """A job's lease owner: its checkpoint (a local path normalized), so the same job
    restarted on it takes its lease back at once."""
    return os.path.normpath(checkpoint) if fs.is_local(checkpoint) else checkpoint


def checkpoint_under(home: str, topic: str) -> str:
    """``HOME/_rmq_checkpoints/TOPIC``: stable, so a rerun resumes. A name starting
    with ``_`` is invisible to Delta (VACUUM too) and to Parquet readers."""
    return fs.join(home, "_rmq_checkpoints", topic)


def _batches(checkpoint: str, log: str) -> list[int]:
    names = fs.list_names(fs.join(checkpoint, log)) or []
    return sorted(int(n) for n in names if n.isdigit())


def latest_batch(checkpoint: str, log: str = "commits", after: int | None = None) -> int | None:
    """The highest batch id in ``offsets`` or ``commits``; None if there is none.
    With ``after`` (a batch known to be there, or -1), the batches after it are
    looked up one by one instead of listing the log (a HEAD each on an object
    store, the one that is missing included): what a monitor asks every poll."""
    if after is not None:
        latest = after
        while fs.exists(fs.join(checkpoint, log, str(latest + 1))):
            latest += 1
        return latest if latest >= 0 else None
    ids = _batches(checkpoint, log)
    return ids[-1] if ids else None


def batch_end(checkpoint: str, batch_id: int, topic: str) -> Positions:
    """End offsets of ``topic`` in micro-batch ``batch_id`` (from ``offsets/batch_id``)."""
    path = fs.join(checkpoint, "offsets", str(batch_id))
    lines = fs.read_text(path).splitlines()
    if len(lines) < 3 or lines[0] != "v1":
        raise ValueError(f"{path}: not a v1 offset log entry with one source")
    source = lines[2].strip()
    if source in ("", "-"):
        return {}
    return {int(q): int(o) for q, o in json.loads(source).get(topic, {}).items()}


def committed_end(checkpoint: str, topic: str, batch: int | None = None) -> tuple[int, Positions] | None:
    """(batch id, end offsets) of the latest committed micro-batch (or of ``batch``,
    when the caller knows it); None before the first."""
    batch = latest_batch(checkpoint, "commits") if batch is None else batch
    if batch is None:
        return None
    return batch, batch_end(checkpoint, batch, topic)


def query_id(checkpoint: str) -> str:
    """The streaming query's id: stable for the life of the checkpoint."""
    return json.loads(fs.read_text(fs.join(checkpoint, "metadata")))["id"]


def seed(checkpoint: str, batch_id: int, topic: str, end: Positions) -> None:
    """Make a new checkpoint resume after batch ``batch_id``, at ``end``.

    Spark's file stream sink skips every batch id at or below the latest one
    in its ``_spark_metadata`` log, so a new query writing to an existing
    Parquet archive must not start at batch 0: it would silently archive
    nothing while its offsets (and our watermark) moved on. A seeded
    checkpoint continues the archive's batch numbering instead.
    """
    if not fs.is_local(checkpoint):
        return _seed_in_place(checkpoint, batch_id, topic, end)
    if latest_batch(checkpoint, "offsets") is not None:
        raise ValueError(f"checkpoint {checkpoint} already has batches; it cannot be seeded")
    # Built aside and renamed into place: Spark never sees half a seed (an
    # offsets/N without commits/N would make it look for batch N-1).
    tmp = f"{checkpoint.rstrip(os.sep)}.seed-{uuid.uuid4().hex[:8]}"
    os.makedirs(os.path.join(tmp, "offsets"))
    os.makedirs(os.path.join(tmp, "commits"))
    _write(os.path.join(tmp, "metadata"), json.dumps({"id": str(uuid.uuid4())}) + "\n")
    for name, text in _seed_files(batch_id, topic, end):
        _write(os.path.join(tmp, *name.split("/")), text)
    if os.path.isdir(checkpoint):        # started once but never planned a batch
        shutil.rmtree(checkpoint)
    os.rename(tmp, checkpoint)


def _seed_files(batch_id: int, topic: str, end: Positions) -> list[tuple[str, str]]:
    source = json.dumps({topic: {str(q): int(end[q]) for q in sorted(end)}})
    header = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})
    out = []
    # Spark restarts from the latest batch only if the one before it is logged too.
    for b in range(max(0, batch_id - 1), batch_id + 1):
        out.append((f"offsets/{b}", f"v1\n{header}\n{source}"))
        out.append((f"commits/{b}", 'v1\n{"nextBatchWatermarkMs":0}'))
    return out


def _seed_in_place(checkpoint: str, batch_id: int, topic: str, end: Positions) -> None:
    """A seed on an object store, where a folder cannot be renamed into place: the
    logs first, ``metadata`` last. Spark writes ``metadata`` before anything else,
    so a checkpoint without one is a seed cut short (or never started): it is
    cleared and seeded again."""
    if fs.exists(fs.join(checkpoint, "metadata")):
        if latest_batch(checkpoint, "offsets") is not None:
            raise ValueError(f"checkpoint {checkpoint} already has batches; it cannot be seeded")
    files = list(fs.walk_files(checkpoint))
    for f, _, _ in files:           # clear only what a checkpoint holds: never a mistyped prefix
        rel = f[len(checkpoint):].lstrip("/")
        if not rel.startswith(("offsets/", "commits/", "sources/")) and rel not in _CHECKPOINT_FILES:
            raise ValueError(f"checkpoint {checkpoint} holds {rel!r}, which no checkpoint holds: "
                             "not clearing it to seed a checkpoint there; give an empty location")
    for f, _, _ in files:
        fs.remove(f)
    for name, text in _seed_files(batch_id, topic, end):
        fs.write_bytes(fs.join(checkpoint, name), text.encode())
    fs.write_bytes(fs.join(checkpoint, "metadata"), (json.dumps({"id": str(uuid.uuid4())}) + "\n").encode())


def _write(path: str, text: str) -> None:
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
