"""Locations and log reading without listing (issue 21): rmq_spark/fs.py,
archive/delta_log.py, archive/sink_log.py, jobs/checkpoint.location, on local
files written the way Delta and Spark's file sink write them. The same code
runs against a real S3 server in tests/spark/test_s3_archive.py."""
from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rmq_spark import fs
from rmq_spark.archive import delta_log, sink_log
from rmq_spark.archive.layout import Tier, parse_tier
from rmq_spark.jobs.checkpoint import location
from rmq_spark.jobs.errors import JobConfigError

pytestmark = pytest.mark.unit


def _commit(root, version: int, *paths: str, remove=()) -> None:
    log = os.path.join(root, "_delta_log")
    os.makedirs(log, exist_ok=True)
    actions = [{"add": {"path": p, "partitionValues": {}, "size": 1, "dataChange": True}} for p in paths]
    actions += [{"remove": {"path": p, "dataChange": True}} for p in remove]
    with open(os.path.join(log, f"{version:020d}.json"), "w") as f:
        f.write("\n".join(json.dumps(a) for a in actions) + "\n")


def _checkpoint(root, version: int, *paths: str) -> None:
    """A classic single-file checkpoint (the add column only) and _last_checkpoint."""
    add = pa.array([{"path": p, "size": 1} for p in paths],
                   pa.struct([("path", pa.string()), ("size", pa.int64())]))
    pq.write_table(pa.table({"add": add}),
                   os.path.join(root, "_delta_log", f"{version:020d}.checkpoint.parquet"))
    with open(os.path.join(root, "_delta_log", "_last_checkpoint"), "w") as f:
        json.dump({"version": version, "size": len(paths)}, f)


def _live(root) -> set[str]:
    adds: dict = {}

    def apply(a):
        if "add" in a:
            adds[a["add"]["path"]] = a
        elif "remove" in a:
            adds.pop(a["remove"]["path"], None)
    assert delta_log.replay(root, apply)
    return set(adds)


def test_delta_log_is_read_from_last_checkpoint_and_numbered_commits(tmp_path, monkeypatch):
    root = str(tmp_path / "t")
    for v in range(3):
        _commit(root, v, f"f{v}")
    _checkpoint(root, 2, "f0", "f1", "f2")
    _commit(root, 3, "f3", remove=["f0"])
    delta_log.forget(root)

    def refuse(uri):
        raise AssertionError(f"listed {uri}")
    monkeypatch.setattr(fs, "list_names", refuse)
    os.remove(os.path.join(root, "_delta_log", f"{0:020d}.json"))     # log cleanup: not needed
    assert _live(root) == {"f1", "f2", "f3"}
    assert delta_log.version(root) == 3
    _commit(root, 4, "f4")                                             # a later commit is seen
    assert _live(root) == {"f1", "f2", "f3", "f4"}


def test_a_table_written_again_from_scratch_is_read_again(tmp_path):
    root = str(tmp_path / "t")
    for v in range(4):
        _commit(root, v, f"old{v}")
    delta_log.forget(root)
    assert _live(root) == {"old0", "old1", "old2", "old3"}
    shutil.rmtree(root)
    _commit(root, 0, "new0")
    _commit(root, 1, "new1")
    assert _live(root) == {"new0", "new1"}            # not the cached old commits
    shutil.rmtree(root)
    assert delta_log.version(root) is None and not delta_log.replay(root, lambda a: None)


def test_a_missing_commit_is_refused_when_the_log_is_listed(tmp_path):
    from rmq_spark.archive.errors import ArchiveError
    root = str(tmp_path / "t")
    for v in range(3):
        _commit(root, v, f"f{v}")
    os.remove(os.path.join(root, "_delta_log", f"{1:020d}.json"))
    with pytest.raises(ArchiveError, match="commit 1 is missing"):
        delta_log.replay(root, lambda a: None, listed=True)


def _sink_batch(root, name: str, *paths: str, deleted=()) -> None:
    log = os.path.join(root, "_spark_metadata")
    os.makedirs(log, exist_ok=True)
    entries = [{"path": f"file://{root}/{p}", "action": "add"} for p in paths]
    entries += [{"path": f"file://{root}/{p}", "action": "delete"} for p in deleted]
    with open(os.path.join(log, name), "w") as f:
        f.write("v1\n" + "\n".join(json.dumps(e) for e in entries) + "\n")


def test_sink_log_lists_once_then_reads_batches_by_number(tmp_path, monkeypatch):
    root = str(tmp_path / "p")
    for b in range(9):
        _sink_batch(root, str(b), f"b{b}.parquet")
    _sink_batch(root, "9.compact", *[f"b{b}.parquet" for b in range(10)])
    _sink_batch(root, "10", "b10.parquet")
    assert len(sink_log.committed_paths(root)) == 11        # the first read lists the folder
    calls, real = [], fs.list_names
    monkeypatch.setattr(fs, "list_names", lambda uri: calls.append(uri) or real(uri))
    _sink_batch(root, "11", "b11.parquet", deleted=["b0.parquet"])
    got = sink_log.committed_paths(root)
    assert calls == [] and len(got) == 11 and f"{root}/b11.parquet" in got
    assert f"{root}/b0.parquet" not in got
    assert len(sink_log.committed_paths(root, listed=True)) == 11 and calls   # the sweep lists


def test_locations_name_one_place_for_spark_and_pyarrow(tmp_path):
    assert location("s3://bkt/a/b/", "archive") == "s3a://bkt/a/b"
    assert location("s3a://bkt/a", "archive") == "s3a://bkt/a"
    assert location(f"file://{tmp_path}/x", "archive") == f"{tmp_path}/x"
    assert location("rel/x", "archive") == os.path.abspath("rel/x")
    with pytest.raises(JobConfigError, match="no bucket"):
        location("s3a:///x", "archive")
    with pytest.raises(JobConfigError, match="scheme 'ftp' is not supported"):
        location("ftp://host/x", "archive")
    with pytest.raises(JobConfigError) as e:
        location("s3a://AKIA:SeCrEt@bkt/x", "checkpoint")
    assert "s3a://***@bkt/x" in str(e.value) and "SeCrEt" not in str(e.value)
    assert parse_tier("delta:s3://bkt/arch/") == Tier("delta", "s3a://bkt/arch")
    assert parse_tier("parquet:/data/a") == Tier("parquet", "/data/a")
    with pytest.raises(ValueError) as e:
        parse_tier("delta:s3a://AKIA:SeCrEt@bkt/x")
    assert "SeCrEt" not in str(e.value)
    assert fs.to_spark("s3://b/k") == "s3a://b/k" and fs.join("s3a://b/k/", "x", "y") == "s3a://b/k/x/y"


def test_local_files_through_the_same_calls(tmp_path):
    uri = f"{tmp_path}/d/f.txt"
    assert not fs.exists(uri) and fs.size(uri) is None and fs.stamp(uri) is None
    fs.write_bytes(uri, b"abc")
    assert fs.read_text(uri) == "abc" and fs.size(uri) == 3 and fs.stamp(uri)[0] == 3
    assert fs.list_names(f"{tmp_path}/d") == ["f.txt"] and fs.list_names(f"{tmp_path}/none") is None
    assert [(u, n) for u, n, _ in fs.walk_files(str(tmp_path))] == [(uri, 3)]
    assert fs.remove(uri) and not fs.remove(uri)
    with pytest.raises(FileNotFoundError):
        fs.read_text(uri)
    fs.check_writable(str(tmp_path), "archive")          # local: the job creates it


def test_a_monitor_finds_new_commits_without_listing_the_checkpoint(tmp_path, monkeypatch):
    from rmq_spark.jobs.checkpoint import latest_batch
    ck = str(tmp_path / "ck")
    assert latest_batch(ck, after=-1) is None
    for b in range(4):
        fs.write_bytes(f"{ck}/commits/{b}", b"v1\n{}")
    assert latest_batch(ck) == 3                          # a start: one listing

    def refuse(uri):
        raise AssertionError(f"listed {uri}")
    monkeypatch.setattr(fs, "list_names", refuse)
    assert latest_batch(ck, after=1) == 3 and latest_batch(ck, after=3) == 3
    assert latest_batch(ck, after=-1) == 3


def test_log_cleanup_under_a_reader_that_started_from_an_older_checkpoint(tmp_path):
    root = str(tmp_path / "t")
    for v in range(3):
        _commit(root, v, f"f{v}")
    _checkpoint(root, 2, "f0", "f1", "f2")
    delta_log.forget(root)
    assert _live(root) == {"f0", "f1", "f2"}
    for v in (3, 4):
        _commit(root, v, f"f{v}")
    _checkpoint(root, 4, *[f"f{v}" for v in range(5)])
    log = os.path.join(root, "_delta_log")
    for name in (f"{2:020d}.checkpoint.parquet", f"{3:020d}.json"):      # Delta's log cleanup
        os.remove(os.path.join(log, name))
    delta_log._parsed.clear()                     # and this process's parsed files evicted
    assert _live(root) == {f"f{v}" for v in range(5)}
