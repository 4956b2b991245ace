"""Shared fixtures: a real local cluster (one OS process per node) on loopback."""
from __future__ import annotations

import os
import time
import zlib

import pytest

from storage_service.local import LocalCluster
from rmq_spark.client import Client, TlsFiles
from rmq_spark.spark import SHORT_LIVED_JVM

# Every Spark JVM a test starts binds to loopback only.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# The Spark drivers tests start in processes of their own (`rmq tier`, `rmq compact`, the
# README tour's programs, notebooks, the demo) live for a minute or less: for them the
# JVM's C2 compiler and parallel GC threads cost more CPU than they save. One `rmq tier`
# of 200 messages on this 2-core VM: 71-78 CPU-s and 42-45 s with the defaults, 43.6
# CPU-s and 35.5 s with these. The run's shared sessions (tests/spark/conftest.py) live
# for the whole run and keep the defaults (C1 alone made S3A's request signing there
# several times slower). What the jobs do is the same; only the JIT differs.
os.environ.setdefault("SPARK_SUBMIT_OPTS", SHORT_LIVED_JVM)

# The modules that take longest (401, 266, 247, 186, 174 and 136 s of test time in a
# `make test` run with --junitxml on 2 cores, 2026-11-27; the next is 91 s; test_realtime.py,
# 2026-11-28: about 150 s) run
# first, so that the xdist workers finish together instead of one of them running
# the README tour alone at the end: xdist orders modules by their number of tests
# unless told not to (the Makefile's --no-loadscope-reorder).
SLOW_MODULES = ("tests/spark/test_compaction.py", "tests/spark/test_tiering.py", "tests/test_readme.py",
                "tests/spark/test_tier_fence.py", "tests/spark/test_archive_read.py",
                "tests/spark/test_s3_archive.py", "tests/spark/test_realtime.py", "tests/test_demo.py")


def pytest_collection_modifyitems(config, items):
    first = {module: i for i, module in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::", 1)[0], len(first)))   # stable


def start_cluster(path, nodes: int = 3, groups: int = 3, extra_args=()) -> LocalCluster:
    cluster = LocalCluster(nodes=nodes, groups=groups, data_dir=str(path),
                           extra_args=["--retention-interval", "0.5", "--segment-bytes", str(64 << 10),
                                       *extra_args])
    cluster.start(timeout=90)
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """A 3-node cluster with TLS on every port, a token secret and ACLs (``secure=True``:
    its CA is ``secure.tls.ca``, the admin's token ``secure.token``), one per module."""
    c = LocalCluster(nodes=3, groups=2, data_dir=str(tmp_path_factory.mktemp("secure")), secure=True)
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def secure_admin(secure):
    """The admin's client of the module's secured cluster (TLS, the admin's token)."""
    with Client(secure.endpoints, tls=TlsFiles(secure.tls.ca), token=secure.token) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster.endpoints, timeout=30) as c:
        yield c


@pytest.fixture
def topic(client, request):
    """A fresh topic per test, named after it."""
    full = request.node.name.replace("[", "-").replace("]", "")
    name = "t-" + full[:100] + (f"-{zlib.crc32(full.encode()):08x}" if len(full) > 100 else "")
    name = "".join(ch if ch.isalnum() or ch in "_.-" else "-" for ch in name)
    client.create_topic(name, queues=4)
    return name


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05, what="condition"):
    """``predicate()``'s first true value, polled every ``interval`` for ``timeout`` s;
    else AssertionError naming ``what`` (a string, or a callable giving one then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for "
                                 f"{what() if callable(what) else what}")
        time.sleep(interval)
