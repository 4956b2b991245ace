"""The committed files of a Parquet archive: Spark's file-sink log, read without
listing its folder on every planning.

``PATH/_spark_metadata`` holds one file per batch (``N``), every tenth a
``N.compact`` with the whole list so far; files never change once written.
The first read in a process lists the folder once (the latest compaction is
where to start); later reads check the last batch read is still the same
file (a HEAD: an archive written again from scratch starts over) and read
the batches after it until one is missing (a GET per new batch, two 404s -
``N`` and ``N.compact`` - when nothing changed). Retention's sweep, which
deletes what the log does not name, always lists (``listed=True``).
"""
from __future__ import annotations

import json
import re
import threading

from .. import fs
from .errors import ArchiveError

__all__ = ["committed_paths"]

_lock = threading.Lock()
# log dir -> (last batch read, its file name, its stamp, path -> entry)
_known: dict[str, tuple[int, str, tuple | None, dict]] = {}


def committed_paths(root: str, listed: bool = False) -> list[str] | None:
    """Every file the Parquet file sink at ``root`` committed (latest ``.compact`` +
    later batches), whether or not it still exists; None without a log."""
    log_dir = fs.join(root, "_spark_metadata")
    with _lock:
        known = None if listed else _known.get(log_dir)
    if known is not None and fs.stamp(fs.join(log_dir, known[1])) != known[2]:
        known = None
    if known is None:
        known = _from_listing(log_dir)
        if known is None:
            with _lock:
                _known.pop(log_dir, None)
            return None
    batch, name, stamp, entries = known
    moved = False
    while True:
        nxt = _read_next(log_dir, batch + 1)
        if nxt is None:
            break
        name, lines = nxt
        batch, moved = batch + 1, True
        entries = _apply(log_dir, name, lines, dict(entries) if not name.endswith(".compact") else {})
    if moved:
        stamp = fs.stamp(fs.join(log_dir, name))
    with _lock:
        _known[log_dir] = (batch, name, stamp, entries)
    return list(entries)


def _read_next(log_dir: str, batch: int) -> tuple[str, list[str]] | None:
    for name in (str(batch), f"{batch}.compact"):
        try:
            return name, fs.read_text(fs.join(log_dir, name)).splitlines()
        except FileNotFoundError:
            continue
    return None


def _from_listing(log_dir: str) -> tuple[int, str, tuple | None, dict] | None:
    names = fs.list_names(log_dir)
    if names is None:
        return None
    batches = {}
    for n in names:
        m = re.fullmatch(r"(\d+)(\.compact)?", n)
        if m:
            batches[int(m.group(1))] = n
    if not batches:
        return None
    compacts = [b for b, n in batches.items() if n.endswith(".compact")]
    first = max(compacts) if compacts else 0
    entries: dict[str, dict] = {}
    for b in sorted(v for v in batches if v >= first):
        entries = _apply(log_dir, batches[b], fs.read_text(fs.join(log_dir, batches[b])).splitlines(),
                         entries)
    last = max(batches)
    return last, batches[last], fs.stamp(fs.join(log_dir, batches[last])), entries


def _apply(log_dir: str, name: str, lines: list[str], entries: dict) -> dict:
    if not lines or lines[0] != "v1":
        raise ArchiveError(f"{log_dir}/{name}: unknown file sink log version "
                           f"{lines[0] if lines else '(empty)'!r}")
    for line in lines[1:]:
        if line.strip():
            e = json.loads(line)
            path = fs.file_uri(e["path"])
            if e.get("action") == "delete":
                entries.pop(path, None)
            else:
                entries[path] = e
    return entries
