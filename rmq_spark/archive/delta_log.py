"""A Delta table's log, read without listing its folder.

Listing is slow and billed on an object store, and the planner reads an
archive's log for every micro-batch. The log says which of its own files
exist: ``_delta_log/_last_checkpoint`` names the latest checkpoint (and its
parts), and commits are numbered, so the next one is probed by reading it.

* A process remembers, per table, the checkpoint it started from and the
  latest commit it read; the next replay checks that commit is still the
  same file (a HEAD: a table deleted and written again starts over), then
  reads commits from there on until one is missing (one GET per new commit,
  one 404 when nothing changed).
  After ``REBASE_COMMITS`` commits it starts again from ``_last_checkpoint``.
* Log files never change once written: each is parsed once per process
  (``_parsed``, least recently used first out).
* Only when neither ``_last_checkpoint`` nor commit 0 is there (log cleanup
  without a checkpoint file, or no table) is the folder listed; and for
  retention's sweep, which deletes what the log does not name (once an hour).

What a replay costs (requests to the store): a first read, 1 (_last_checkpoint)
+ checkpoint parts + commits since + 2; every later one, new commits + 2.
"""
from __future__ import annotations

import collections
import json
import re
import threading
from typing import Callable

import pyarrow.parquet as pq

from .. import fs
from .errors import ArchiveError

__all__ = ["REBASE_COMMITS", "forget", "replay", "version"]

REBASE_COMMITS = 100        # commits read past the checkpoint before starting from a newer one
_PARSED_MAX = 512           # log files kept parsed

_lock = threading.Lock()
# log dir -> (checkpoint, its parts, latest commit, that commit's (size, mtime): a replaced table)
_known: dict[str, tuple] = {}
_parsed: "collections.OrderedDict[str, list[dict]]" = collections.OrderedDict()


def replay(root: str, apply: Callable[[dict], None], listed: bool = False) -> bool:
    """Feed each action of the table's checkpoint, then of each later commit, to
    ``apply``; False when the table has no log. ``listed``: from a listing of the
    log folder as it is now, every commit since the checkpoint required (for
    what deletes files: retention's sweep), not from what this process knows."""
    log_dir = fs.join(root, "_delta_log")
    if listed:                    # as the folder is now, nothing this process remembers
        found = _listed(log_dir)
        return found is not None and _feed(log_dir, found, apply, cached=False)
    for attempt in (1, 2):
        found = _log_files(log_dir)
        if found is None:
            return False
        actions: list[dict] = []
        try:
            _feed(log_dir, found, actions.append, cached=True)
        except FileNotFoundError:
            # Log cleanup removed the checkpoint or commits this process started
            # from (a newer checkpoint covers them): start again from _last_checkpoint.
            _forget_dir(log_dir)
            if attempt == 2:
                raise
            continue
        for action in actions:
            apply(action)
        return True
    return False


def _feed(log_dir: str, found: tuple, apply, cached: bool) -> bool:
    checkpoint, parts, latest = found[:3]
    for part in parts:
        for action in _actions(fs.join(log_dir, part), checkpoint=True, cached=cached):
            apply(action)
    first = 0 if checkpoint is None else checkpoint + 1
    for v in range(first, latest + 1):
        for action in _actions(_commit(log_dir, v), cached=cached):
            apply(action)
    return True


def version(root: str) -> int | None:
    """The table's latest commit version; None when it has no log."""
    found = _log_files(fs.join(root, "_delta_log"))
    return None if found is None else found[2]


def forget(root: str) -> None:
    """Drop what this process remembers of the table at ``root``."""
    _forget_dir(fs.join(root, "_delta_log"))


def _commit(log_dir: str, v: int) -> str:
    return fs.join(log_dir, f"{v:020d}.json")


def _log_files(log_dir: str) -> tuple[int | None, tuple[str, ...], int] | None:
    with _lock:
        known = _known.get(log_dir)
    if known is not None and fs.stamp(_commit(log_dir, known[2])) != known[3]:
        _forget_dir(log_dir)            # the table was replaced (deleted and written again)
        known = None
    if known is None or known[2] - (known[0] if known[0] is not None else -1) > REBASE_COMMITS:
        found = _from_last_checkpoint(log_dir)
        if found is None:
            return None
        checkpoint, parts, latest = found
    else:
        checkpoint, parts, latest = known[:3]
    moved = known is None or latest != known[2]
    while _actions(_commit(log_dir, latest + 1), missing_ok=True) is not None:
        latest, moved = latest + 1, True
    if latest < 0 and checkpoint is None:
        return None
    stamp = fs.stamp(_commit(log_dir, latest)) if moved else known[3]
    with _lock:
        _known[log_dir] = (checkpoint, parts, latest, stamp)
    return checkpoint, parts, latest


def _forget_dir(log_dir: str) -> None:
    with _lock:
        _known.pop(log_dir, None)
        for uri in [u for u in _parsed if u.startswith(log_dir)]:
            del _parsed[uri]


def _from_last_checkpoint(log_dir: str) -> tuple[int | None, tuple[str, ...], int] | None:
    try:
        last = json.loads(fs.read_text(fs.join(log_dir, "_last_checkpoint")))
    except (FileNotFoundError, ValueError):       # none, or half written: as if none
        last = None
    if last is not None and "v2Checkpoint" not in last:
        v, n = int(last["version"]), last.get("parts")
        parts = ((f"{v:020d}.checkpoint.parquet",) if not n else
                 tuple(f"{v:020d}.checkpoint.{i:010d}.{int(n):010d}.parquet" for i in range(1, int(n) + 1)))
        return v, parts, v
    if last is None and _actions(_commit(log_dir, 0), missing_ok=True) is not None:
        return None, (), 0
    return _listed(log_dir)


def _listed(log_dir: str) -> tuple[int | None, tuple[str, ...], int] | None:
    """From a listing of the folder: the newest complete classic checkpoint and the
    commits after it, which must follow on from it."""
    names = fs.list_names(log_dir)
    if names is None:
        return None
    commits = sorted(int(n[:20]) for n in names if re.fullmatch(r"\d{20}\.json", n))
    checkpoint, parts = _latest_checkpoint(names)
    if checkpoint is None and not commits:
        return None
    first = 0 if checkpoint is None else checkpoint + 1
    later = [v for v in commits if v >= first]
    if later != list(range(first, first + len(later))):
        # e.g. log cleanup after a checkpoint kind not read here (v2, sidecars)
        missing = min(set(range(first, later[-1])) - set(later))
        after = "the table's start" if checkpoint is None else f"checkpoint {checkpoint}"
        raise ArchiveError(f"{log_dir}: commit {missing} is missing (the log holds commits "
                           f"{later[0]}-{later[-1]} after {after}); the rocketmq reader reads "
                           "classic checkpoints and JSON commits only")
    return checkpoint, tuple(parts), later[-1] if later else checkpoint


def _latest_checkpoint(names: list[str]) -> tuple[int | None, list[str]]:
    by_version: dict[int, list[str]] = {}
    for n in names:
        m = re.fullmatch(r"(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet", n)
        if m:
            by_version.setdefault(int(m.group(1)), []).append(n)
    for v in sorted(by_version, reverse=True):
        parts = sorted(by_version[v])
        m = re.fullmatch(r"\d{20}\.checkpoint\.\d+\.(\d+)\.parquet", parts[0])
        if m is None or len(parts) == int(m.group(1)):   # single file, or every part present
            return v, parts
    return None, []


def _actions(uri: str, checkpoint: bool = False, missing_ok: bool = False,
             cached: bool = True) -> list[dict] | None:
    """The actions of one log file, parsed once per process (``cached``); None when
    it is missing and ``missing_ok``."""
    with _lock:
        got = _parsed.get(uri) if cached else None
        if got is not None:
            _parsed.move_to_end(uri)
            return got
    try:
        got = _checkpoint_actions(uri) if checkpoint else \
            [json.loads(line) for line in fs.read_text(uri).splitlines() if line.strip()]
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    if cached:
        with _lock:
            _parsed[uri] = got
            while len(_parsed) > _PARSED_MAX:
                _parsed.popitem(last=False)
    return got


def _checkpoint_actions(uri: str) -> list[dict]:
    store, path = fs.resolve(uri)
    table = pq.read_table(path, filesystem=store)
    cols = set(table.column_names)
    out = []
    for action in ("protocol", "metaData", "add", "remove", "txn"):
        if action not in cols:
            continue
        for value in table.column(action).to_pylist():
            if value is not None:
                if action == "add" and isinstance(value.get("partitionValues"), list):
                    value["partitionValues"] = dict(value["partitionValues"])
                out.append({action: value})
    return out
