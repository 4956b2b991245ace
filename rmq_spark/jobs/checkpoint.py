"""The few facts the streaming jobs read from (and tiering, once, writes to) a Spark checkpoint.

A streaming checkpoint is a directory of small logs (Spark's
``HDFSMetadataLog``): ``offsets/N`` is written before micro-batch N runs and
holds ``v1``, a metadata line and one line per source with the batch's END
offsets; ``commits/N`` appears once batch N is committed to the sink;
``metadata`` holds the query id. A job's query has one source, so line 3
of ``offsets/N`` is ``{"topic": {"queue": next_offset}}``.

Only local checkpoints (and archives, tables) are supported: a path or a
``file:`` URI. A stable default lives under the job's output directory
(``checkpoint_under``), so a rerun resumes.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from urllib.parse import urlparse

from .errors import JobConfigError

__all__ = ["local_path", "checkpoint_under", "latest_batch", "batch_end", "committed_end",
           "query_id", "seed"]

Positions = dict[int, int]


def local_path(path: str, what: str, error: type[JobConfigError] = JobConfigError) -> str:
    """A local absolute path from ``path`` or a ``file:`` URI; other schemes are refused
    with ``error`` (the calling job's own ``JobConfigError``)."""
    if "://" in path or path.startswith("file:"):
        u = urlparse(path)
        if u.scheme != "file":
            raise error(f"{what} {path!r}: only local paths (or file: URIs) are "
                        "supported by the Spark jobs")
        path = u.path
    if not path:
        raise error(f"{what} is empty: give a local directory")
    return os.path.abspath(path)


def checkpoint_under(home: str, topic: str) -> str:
    """``HOME/_rmq_checkpoints/TOPIC``: stable, so a rerun resumes. A name starting
    with ``_`` is invisible to Delta (VACUUM too) and to Parquet readers."""
    return os.path.join(home, "_rmq_checkpoints", topic)


def _batches(checkpoint: str, log: str) -> list[int]:
    try:
        names = os.listdir(os.path.join(checkpoint, log))
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def latest_batch(checkpoint: str, log: str = "commits") -> int | None:
    """The highest batch id in ``offsets`` or ``commits``; None if there is none."""
    ids = _batches(checkpoint, log)
    return ids[-1] if ids else None


def batch_end(checkpoint: str, batch_id: int, topic: str) -> Positions:
    """End offsets of ``topic`` in micro-batch ``batch_id`` (from ``offsets/batch_id``)."""
    path = os.path.join(checkpoint, "offsets", str(batch_id))
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if len(lines) < 3 or lines[0] != "v1":
        raise ValueError(f"{path}: not a v1 offset log entry with one source")
    source = lines[2].strip()
    if source in ("", "-"):
        return {}
    return {int(q): int(o) for q, o in json.loads(source).get(topic, {}).items()}


def committed_end(checkpoint: str, topic: str) -> tuple[int, Positions] | None:
    """(batch id, end offsets) of the latest committed micro-batch; None before the first."""
    batch = latest_batch(checkpoint, "commits")
    if batch is None:
        return None
    return batch, batch_end(checkpoint, batch, topic)


def query_id(checkpoint: str) -> str:
    """The streaming query's id: stable for the life of the checkpoint."""
    with open(os.path.join(checkpoint, "metadata"), encoding="utf-8") as f:
        return json.load(f)["id"]


def seed(checkpoint: str, batch_id: int, topic: str, end: Positions) -> None:
    """Make a new checkpoint resume after batch ``batch_id``, at ``end``.

    Spark's file stream sink skips every batch id at or below the latest one
    in its ``_spark_metadata`` log, so a new query writing to an existing
    Parquet archive must not start at batch 0: it would silently archive
    nothing while its offsets (and our watermark) moved on. A seeded
    checkpoint continues the archive's batch numbering instead.
    """
    if latest_batch(checkpoint, "offsets") is not None:
        raise ValueError(f"checkpoint {checkpoint} already has batches; it cannot be seeded")
    # Built aside and renamed into place: Spark never sees half a seed (an
    # offsets/N without commits/N would make it look for batch N-1).
    tmp = f"{checkpoint.rstrip(os.sep)}.seed-{uuid.uuid4().hex[:8]}"
    os.makedirs(os.path.join(tmp, "offsets"))
    os.makedirs(os.path.join(tmp, "commits"))
    _write(os.path.join(tmp, "metadata"), json.dumps({"id": str(uuid.uuid4())}) + "\n")
    source = json.dumps({topic: {str(q): int(end[q]) for q in sorted(end)}})
    header = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})
    # Spark restarts from the latest batch only if the one before it is logged too.
    for b in range(max(0, batch_id - 1), batch_id + 1):
        _write(os.path.join(tmp, "offsets", str(b)), f"v1\n{header}\n{source}")
        _write(os.path.join(tmp, "commits", str(b)), 'v1\n{"nextBatchWatermarkMs":0}')
    if os.path.isdir(checkpoint):        # started once but never planned a batch
        shutil.rmtree(checkpoint)
    os.rename(tmp, checkpoint)


def _write(path: str, text: str) -> None:
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
