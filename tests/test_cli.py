"""The `rmq` and `rmq-storage` command lines against a real cluster."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from .conftest import wait_until

pytestmark = pytest.mark.integration
BIN = os.path.dirname(sys.executable)


def rmq(cluster, *args, stdin: str | None = None, check: bool = True,
        timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, RMQ_ENDPOINTS=cluster.endpoints)
    p = subprocess.run([os.path.join(BIN, "rmq"), *args], input=stdin, capture_output=True, text=True,
                       env=env, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"rmq {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p


def test_topic_lifecycle(cluster):
    out = rmq(cluster, "topic", "create", "cli-t", "--queues", "3", "--retention", "12h",
              "--retention-bytes", "10GB").stdout
    assert "created topic cli-t with 3 queues" in out
    assert "cli-t" in rmq(cluster, "topic", "list").stdout
    d = json.loads(rmq(cluster, "topic", "describe", "cli-t", "--json").stdout)
    assert (d["queues"], d["retention_ms"], d["retention_bytes"]) == (3, 12 * 3600_000, 10 << 30)
    assert len(d["queue_info"]) == 3
    rmq(cluster, "topic", "delete", "cli-t")
    assert "cli-t" not in rmq(cluster, "topic", "list").stdout


def test_produce_consume_offsets(cluster):
    rmq(cluster, "topic", "create", "cli-pc", "--queues", "2")
    lines = "".join(f"line {i}\n" for i in range(25))
    assert "produced 25 messages" in rmq(cluster, "produce", "cli-pc", "--queue", "1", stdin=lines).stdout
    js = '{"value": "v1", "key": "k", "tags": "TagA", "properties": {"p": "1"}}\n'
    rmq(cluster, "produce", "cli-pc", "--json", stdin=js)
    got = [json.loads(x) for x in rmq(cluster, "consume", "cli-pc", "--json").stdout.splitlines()]
    assert len(got) == 26
    assert [g["value"] for g in got if g["queue"] == 1 and g["key"] is None] == [f"line {i}" for i in range(25)]
    [kv] = [g for g in got if g["key"] == "k"]
    assert (kv["value"], kv["tags"], kv["properties"]) == ("v1", "TagA", {"p": "1"})
    assert rmq(cluster, "consume", "cli-pc", "--max", "3").stdout.count("\n") == 3
    offs = json.loads(rmq(cluster, "offsets", "cli-pc", "--json").stdout)
    assert sum(q["latest"] for q in offs["queues"]) == 26


def test_consumer_group_lag_shows_in_offsets(cluster, client):
    rmq(cluster, "topic", "create", "cli-lag", "--queues", "1")
    rmq(cluster, "produce", "cli-lag", "--queue", "0", stdin="a\nb\nc\nd\n")
    client.commit_offsets("analytics", "cli-lag", {0: 1})
    offs = json.loads(rmq(cluster, "offsets", "cli-lag", "--json").stdout)
    assert offs["consumer_groups"]["analytics"]["0"] == {"committed": 1, "lag": 3}
    assert "lag" in rmq(cluster, "offsets", "cli-lag").stdout


def test_cluster_status_json(cluster, client):
    client.create_topic("cli-status", queues=cluster.groups)
    for q in range(cluster.groups):
        client.produce("cli-status", [b"x" * 1000] * 10, queue=q)
    st = json.loads(rmq(cluster, "cluster", "status", "--json").stdout)
    assert sorted(n["pid"] for n in st["nodes"]) == sorted(cluster.pid(i) for i in range(3))
    assert all(g["leader"] for n in st["nodes"] for g in n["groups"])
    # per group: its replicas and leader; per node: state, groups it leads, queues, bytes
    assert [g["group"] for g in st["groups"]] == list(range(cluster.groups + 1))
    for g in st["groups"]:
        assert sorted(g["replicas"]) == sorted(cluster.addresses) and g["leader"] in cluster.addresses
    leads = sorted(gid for n in st["nodes"] for gid in n["leaders"])
    assert leads == list(range(cluster.groups + 1))                 # every group led once
    for n in st["nodes"]:
        assert n["state"] == "up" and n["address"] in cluster.addresses
        assert n["queues"] >= cluster.groups and n["bytes"] >= 10_000
    assert "leads groups" in rmq(cluster, "cluster", "status").stdout


@pytest.mark.parametrize("args, stdin, text", [
    (["topic", "create", "bad name"], None, "topic name"),
    (["topic", "create", "x", "--retention", "7 days"], None, "duration"),
    (["topic", "create", "x", "--retention-bytes", "lots"], None, "size"),
    (["produce", "nope"], "x\n", "does not exist"),
    (["produce", "cli-bad", "--json"], "not json\n", "line 1: not valid JSON"),
    (["consume", "cli-bad", "--from", "middle"], None, "--from"),
])
def test_bad_cli_input_is_explained(cluster, client, args, stdin, text):
    if "cli-bad" not in {t["name"] for t in client.list_topics()}:
        client.create_topic("cli-bad", queues=1)
    p = rmq(cluster, *args, stdin=stdin, check=False)
    assert p.returncode != 0
    assert text in p.stderr
    assert "x" not in {t["name"] for t in client.list_topics()}


def test_missing_endpoints_is_explained():
    env = {k: v for k, v in os.environ.items() if k != "RMQ_ENDPOINTS"}
    p = subprocess.run([os.path.join(BIN, "rmq"), "topic", "list"], capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "RMQ_ENDPOINTS" in p.stderr


def test_rmq_storage_local_prints_endpoints_and_stops_on_sigterm(tmp_path):
    p = subprocess.Popen([os.path.join(BIN, "rmq-storage"), "local", "--nodes", "3", "--groups", "2",
                          "--data-dir", str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        line = wait_until(lambda: p.stdout.readline(), timeout=60, what="endpoints line")
        assert line.startswith("endpoints: ") and line.count(",") == 2
        endpoints = line.split(": ", 1)[1].strip()
        env = dict(os.environ, RMQ_ENDPOINTS=endpoints)
        subprocess.run([os.path.join(BIN, "rmq"), "topic", "create", "keep", "--queues", "1"], env=env,
                       check=True, capture_output=True, timeout=60)
        subprocess.run([os.path.join(BIN, "rmq"), "produce", "keep", "--queue", "0"], input="persisted\n",
                       text=True, env=env, check=True, capture_output=True, timeout=60)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    # restart with the same data directory: same endpoints, same data
    p = subprocess.Popen([os.path.join(BIN, "rmq-storage"), "local", "--data-dir", str(tmp_path)],
                         stdout=subprocess.PIPE, text=True)
    try:
        line = wait_until(lambda: p.stdout.readline(), timeout=60, what="endpoints line")
        assert line.split(": ", 1)[1].strip() == endpoints
        env = dict(os.environ, RMQ_ENDPOINTS=endpoints)
        out = subprocess.run([os.path.join(BIN, "rmq"), "consume", "keep"], env=env, capture_output=True,
                             text=True, timeout=60).stdout
        assert out == "persisted\n"
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0


def test_tiered_topic_create_and_alter(cluster):
    rmq(cluster, "topic", "create", "cli-tier", "--queues", "1", "--tier", "delta:/tmp/a",
        "--local-retention", "1h", "--retention", "30d")
    d = json.loads(rmq(cluster, "topic", "describe", "cli-tier", "--json").stdout)
    assert (d["tier"], d["local_retention_ms"], d["retention_ms"]) == ("delta:/tmp/a", 3600_000, 30 * 86400_000)
    out = rmq(cluster, "topic", "alter", "cli-tier", "--local-retention", "2h").stdout
    assert "local retention 2h" in out
    bad = rmq(cluster, "topic", "alter", "cli-tier", "--tier", "s3only", check=False)
    assert bad.returncode != 0 and "delta:PATH or parquet:PATH" in bad.stderr
    d = json.loads(rmq(cluster, "topic", "describe", "cli-tier", "--json").stdout)
    assert (d["tier"], d["local_retention_ms"]) == ("delta:/tmp/a", 2 * 3600_000)
    # a relative PATH means the current directory's, recorded absolute
    rmq(cluster, "topic", "alter", "cli-tier", "--tier", "parquet:rel-archive")
    d = json.loads(rmq(cluster, "topic", "describe", "cli-tier", "--json").stdout)
    assert d["tier"] == f"parquet:{os.path.abspath('rel-archive')}"
