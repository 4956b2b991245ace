"""What a new user meets first with ``rmq`` (issue 17): data kept intact in JSON,
compact topics apart from tiering, a producer that streams and stops cleanly,
a consumer that says where it ends, fast errors for wrong endpoints."""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import zlib

import pytest

from .conftest import wait_until

pytestmark = pytest.mark.integration
BIN = os.path.dirname(sys.executable)
RMQ = os.path.join(BIN, "rmq")


def rmq(cluster, *args, stdin=None, check=True, timeout=60) -> subprocess.CompletedProcess:
    env = dict(os.environ, RMQ_ENDPOINTS=cluster.endpoints)
    kw = {"stdin": stdin} if hasattr(stdin, "fileno") else {"input": stdin}
    p = subprocess.run([RMQ, *args], capture_output=True, text=not hasattr(stdin, "fileno"), env=env,
                       timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"rmq {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p


def spawn(cluster, *args) -> subprocess.Popen:
    env = dict(os.environ, RMQ_ENDPOINTS=cluster.endpoints, PYTHONFAULTHANDLER="1")
    return subprocess.Popen([RMQ, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _unread(pipe) -> int:
    """Bytes written to ``pipe`` that its reader has not read yet (FIONREAD)."""
    import fcntl
    import struct
    import termios
    return struct.unpack("i", fcntl.ioctl(pipe.fileno(), termios.FIONREAD, b"\0" * 4))[0]


def consume_json(cluster, topic) -> list[dict]:
    return [json.loads(x) for x in rmq(cluster, "consume", topic, "--json").stdout.splitlines()]


# ------------------------------------------------------------------ 1. JSON data
def test_json_null_is_a_tombstone_and_objects_keep_their_json_text(cluster, client):
    rmq(cluster, "topic", "create", "fh-balances", "--queues", "2", "--cleanup-policy", "compact")
    lines = [{"key": "acct-1", "value": {"a": 1, "b": [True, None]}},
             {"key": "acct-2", "value": 42},
             {"key": "acct-3", "value": "kept"},
             {"key": "acct-3", "value": None}]
    rmq(cluster, "produce", "fh-balances", "--json", stdin="".join(json.dumps(x) + "\n" for x in lines))
    stored = {(r.key, r.value) for q in range(2) for r in client.fetch("fh-balances", q, 0).records}
    assert (b"acct-1", b'{"a":1,"b":[true,null]}') in stored
    assert (b"acct-2", b"42") in stored
    assert (b"acct-3", None) in stored                   # a tombstone, not the 4 bytes "None"
    # The README's example: a deleted key has no value, before any compaction job ran.
    got = rmq(cluster, "get", "fh-balances", "acct-3", check=False)
    assert got.returncode == 1 and "no value for key 'acct-3'" in got.stderr
    assert rmq(cluster, "get", "fh-balances", "acct-1").stdout == 'acct-1\t{"a":1,"b":[true,null]}\n'


def test_consume_json_piped_to_produce_json_copies_a_topic_exactly(cluster, client):
    from rmq_spark.client import Message
    rmq(cluster, "topic", "create", "fh-src", "--queues", "1")
    rmq(cluster, "topic", "create", "fh-dst", "--queues", "1")
    src = [Message(value=b"\xff\x00binary", key=b"\x80k", tags="T", properties={"p": "1"}, born_timestamp=1234),
           Message(value=None, key=b"gone"), Message(value="héllo".encode(), key=None),
           Message(value=b"", key=b"")]
    client.produce("fh-src", src, queue=0)
    out = rmq(cluster, "consume", "fh-src", "--json").stdout
    first = json.loads(out.splitlines()[0])
    assert first["value"] == {"base64": base64.b64encode(b"\xff\x00binary").decode()}
    assert first["key"] == {"base64": base64.b64encode(b"\x80k").decode()}
    assert json.loads(out.splitlines()[1])["value"] is None
    rmq(cluster, "produce", "fh-dst", "--json", stdin=out)
    def fields(topic):
        return [(r.key, r.value, r.tags, r.properties, r.born_timestamp)
                for r in client.fetch(topic, 0, 0).records]
    assert fields("fh-dst") == fields("fh-src")


@pytest.mark.parametrize("content,why", [
    (b'{"value": "a"}\nnot json\n{"value": "c"}\n', "line 2: not valid JSON"),
    (b'{"value": "a"}\n{"value": {"base64": "@@"}}\n', "line 2: value: not valid base64"),
    (b'{"value": "a"}\n{"valu": "b"}\n', 'line 2: expected an object with at least "value"'),
    (b'{"value": "a"}\n{"value": "b", "colour": 1}\n', "line 2: unknown fields ['colour']"),
])
def test_a_bad_json_line_in_a_file_is_refused_before_anything_is_sent(cluster, client, tmp_path, content, why):
    name = f"fh-bad-{zlib.crc32(content)}"
    rmq(cluster, "topic", "create", name, "--queues", "1")
    path = tmp_path / "in.jsonl"
    path.write_bytes(content)
    with open(path, "rb") as f:
        p = rmq(cluster, "produce", name, "--json", stdin=f, check=False)
    assert p.returncode == 2 and why in p.stderr.decode()
    assert client.offsets(name)[0].latest == 0           # nothing of the file was stored


def test_invalid_utf8_is_named_or_skipped_with_a_count(cluster, client, tmp_path):
    rmq(cluster, "topic", "create", "fh-utf8", "--queues", "1")
    path = tmp_path / "in.txt"
    path.write_bytes(b"ok 1\nbad \xff\xfe\nok 3\n")
    with open(path, "rb") as f:
        p = rmq(cluster, "produce", "fh-utf8", stdin=f, check=False)
    assert p.returncode == 2 and "line 2: not valid UTF-8" in p.stderr.decode()
    assert client.offsets("fh-utf8")[0].latest == 0
    with open(path, "rb") as f:
        p = rmq(cluster, "produce", "fh-utf8", "--skip-bad", stdin=f)
    assert "skipped 1 bad lines (first: line 2" in p.stderr.decode()
    assert [r.value for r in client.fetch("fh-utf8", 0, 0).records] == [b"ok 1", b"ok 3"]


# ------------------------------------------------------- 2. compaction vs tiering
def test_compact_topics_have_their_own_table_field_and_refuse_tiering(cluster, client):
    rmq(cluster, "topic", "create", "fh-kv", "--queues", "1", "--cleanup-policy", "compact")
    started = time.monotonic()
    p = rmq(cluster, "tier", "fh-kv", "--archive", "/tmp/fh-kv-archive", check=False)
    assert p.returncode == 2 and "cleanup policy compact" in p.stderr and "rmq compact fh-kv" in p.stderr
    assert time.monotonic() - started < 15                # refused before Spark starts
    rmq(cluster, "topic", "create", "fh-del", "--queues", "1")
    p = rmq(cluster, "tier", "fh-del", "--archive", "/tmp/fh-del-archive", "--vacuum-retain", "forever", check=False)
    assert p.returncode == 2 and "--vacuum-retain forever: give a period" in p.stderr
    assert client.describe_topic("fh-del")["tier"] == ""                 # nothing recorded
    bad = rmq(cluster, "topic", "alter", "fh-kv", "--tier", "delta:/tmp/x", check=False)
    assert bad.returncode != 0 and "has cleanup policy compact" in bad.stderr
    rmq(cluster, "topic", "alter", "fh-kv", "--compacted-table", "/tmp/fh-kv-table")
    d = client.describe_topic("fh-kv")
    assert (d["compacted_table"], d["tier"]) == ("delta:/tmp/fh-kv-table", "")
    client.produce("fh-kv", [{"value": b"v", "key": b"k"}] * 3, queue=0)
    client.set_watermark("fh-kv", "compaction", {0: 2}, client.lease("fh-kv", "compact", "job", 60_000)[3])
    out = rmq(cluster, "topic", "describe", "fh-kv").stdout
    assert "compacted table delta:/tmp/fh-kv-table" in out
    header, row = out.splitlines()[1], out.splitlines()[3]
    assert "compacted to" in header and "compaction lag" in header and "archived to" not in header
    at = header.index("compacted to")
    assert row[at:].split()[:2] == ["2", "1"]              # compacted to 2, 1 message above it


# ------------------------------------------------------------- 5. produce pipeline
def test_a_slow_stream_is_stored_line_by_line(cluster, client):
    rmq(cluster, "topic", "create", "fh-slow", "--queues", "1")
    p = spawn(cluster, "produce", "fh-slow")
    try:
        p.stdin.write("first\n")
        p.stdin.flush()
        wait_until(lambda: client.offsets("fh-slow")[0].latest == 1, timeout=5, what="first line stored")
        assert p.poll() is None                           # still reading
        p.stdin.write("second\n")
        p.stdin.close()
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
    assert [r.value for r in client.fetch("fh-slow", 0, 0).records] == [b"first", b"second"]


def test_ctrl_c_sends_what_was_read_and_exits_130(cluster, client):
    rmq(cluster, "topic", "create", "fh-int", "--queues", "2")
    p = spawn(cluster, "produce", "fh-int", "--linger", "10s")   # nothing would leave for 10 s
    p.stdin.write("".join(f"m{i}\n" for i in range(300)))
    p.stdin.flush()
    # Ctrl-C once it has read the input (the pipe is empty), not after a fixed sleep: on a
    # busy machine the process was still starting after 1 s ("rmq: interrupted", nothing read)
    wait_until(lambda: _unread(p.stdin) == 0, timeout=60, interval=0.05, what="rmq produce reading its input")
    p.send_signal(signal.SIGINT)
    err = p.communicate(timeout=30)[1]
    assert p.returncode == 130
    assert "interrupted; 300 of 300 messages read were acknowledged" in err and "Traceback" not in err
    assert sum(o.latest for o in client.offsets("fh-int")) == 300


def test_order_per_queue_keys_by_hash_and_unkeyed_lines_spread(cluster, client):
    rmq(cluster, "topic", "create", "fh-order", "--queues", "4")
    rmq(cluster, "produce", "fh-order", "--batch", "50", stdin="".join(f"{i}\n" for i in range(2000)))
    per_queue = [[int(r.value) for r in _all(client, "fh-order", q)] for q in range(4)]
    assert sorted(v for q in per_queue for v in q) == list(range(2000))
    assert all(q == sorted(q) for q in per_queue) and sum(1 for q in per_queue if q) >= 2
    rmq(cluster, "topic", "create", "fh-keys", "--queues", "4")
    keyed = "".join(json.dumps({"key": f"k{i % 10}", "value": str(i)}) + "\n" for i in range(200))
    rmq(cluster, "produce", "fh-keys", "--json", stdin=keyed)
    for q in range(4):
        for r in _all(client, "fh-keys", q):
            assert zlib.crc32(r.key) % 4 == q


def _all(client, topic, q):
    out, off = [], 0
    while True:
        res = client.fetch(topic, q, off)
        if not res.records:
            return out
        out += res.records
        off = res.next_offset


# -------------------------------------------------------------------- 6. consume
def test_consume_says_where_the_end_is_merges_queues_by_time_and_prints_offsets(cluster, client):
    rmq(cluster, "topic", "create", "fh-cons", "--queues", "2")
    client.produce("fh-cons", [b"old-1", b"old-2"], queue=1)
    time.sleep(0.01)
    client.produce("fh-cons", [b"new-1"], queue=0)
    # Store timestamps come from each queue's leader (the cluster's time as that node
    # sees it: peers' clocks heard late on a loaded machine); the two queues may have
    # different leaders, so the order is the one their timestamps give, which is
    # queue 1's first unless the leaders' clocks differ by more than the 10 ms between.
    stamped = sorted((r.store_timestamp, q, r.offset, r.value.decode())
                     for q in (0, 1) for r in _all(client, "fh-cons", q))
    p = rmq(cluster, "consume", "fh-cons", "--max", "2", "--print-offsets")
    assert p.stdout == "".join(f"{q}:{o}\t{v}\n" for _, q, o, v in stamped[:2])   # the oldest first
    p = rmq(cluster, "consume", "fh-cons", "--from", "latest")
    assert p.stdout == "" and "end of fh-cons after 0 messages (next offsets q0=1 q1=2)" in p.stderr


def test_consume_follow_stops_on_ctrl_c_without_a_traceback(cluster, client):
    rmq(cluster, "topic", "create", "fh-follow", "--queues", "1")
    p = spawn(cluster, "consume", "fh-follow", "--follow")
    try:
        client.produce("fh-follow", [b"live"], queue=0)
        assert p.stdout.readline() == "live\n"
        p.send_signal(signal.SIGINT)
        try:
            err = p.communicate(timeout=30)[1]
        except subprocess.TimeoutExpired:        # where it hangs: every thread's stack
            p.send_signal(signal.SIGABRT)        # (PYTHONFAULTHANDLER, spawn's environment)
            raise AssertionError(f"rmq consume --follow ignored Ctrl-C: {p.communicate(timeout=30)[1]}")
    finally:
        p.kill()
    assert p.returncode == 130 and "Traceback" not in err, err


# ---------------------------------------------------------- 7, 11. endpoints, help
def test_a_wrong_endpoint_fails_fast_naming_it():
    started = time.monotonic()
    p = subprocess.run([RMQ, "--endpoints", "127.0.0.1:1", "topic", "list"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "no node answered at 127.0.0.1:1" in p.stderr
    assert time.monotonic() - started < 10
    p = subprocess.run([RMQ, "--endpoints", "127.0.0.1:99999", "topic", "list"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "port 99999 is out of range (1-65535)" in p.stderr


def test_help_is_plain_text_and_cluster_status_names_the_metadata_group(cluster):
    out = subprocess.run([RMQ, "--help"], capture_output=True, text=True).stdout
    assert "``" not in out and "RMQ_ENDPOINTS" in out
    for cmd in (["rmq-storage", "--help"], ["rmq", "produce", "--help"], ["rmq", "topic", "--help"]):
        out = subprocess.run([os.path.join(BIN, cmd[0]), *cmd[1:]], capture_output=True, text=True).stdout
        assert out and "``" not in out, cmd
    st = json.loads(rmq(cluster, "cluster", "status", "--json").stdout)
    assert st["metadata_group"] == 0 and st["data_groups"] == cluster.groups
    roles = {g["group"]: g["role"] for g in st["nodes"][0]["groups"]}
    assert roles == {0: "metadata", **{g: "data" for g in range(1, cluster.groups + 1)}}


# ------------------------------------------------------------------ the demo's output
def test_the_demos_groups_table_lists_every_group_with_a_node_down(tmp_path):
    """``make demo`` prints the raft groups after restarting a node; the node listed first
    may be that one, not yet reachable, reporting no group: the table printed its
    header and no rows. It takes the groups from every node that answered."""
    from rmq_spark.client import Client
    from rmq_spark.demo import groups_table
    from storage_service.local import LocalCluster
    with LocalCluster(nodes=3, groups=2, data_dir=str(tmp_path)) as c, Client(c.endpoints) as client:
        c.kill(0, signal.SIGKILL)
        st = wait_until(lambda: (lambda s: s if not s["nodes"][0]["reachable"] else None)(client.cluster_status()),
                        timeout=60, what="node 0 reported down")
        assert st["nodes"][0]["groups"] == []          # what the demo's table was made of
        rows = groups_table(st).splitlines()[2:]
        assert [r.split()[0] for r in rows] == ["0", "1", "2"], groups_table(st)


def test_the_demos_balances_print_without_trailing_blanks(cluster, client):
    """The demo's `rmq get` printed a value padded with ~200 blanks (its data was padded)."""
    from rmq_spark.demo import _balances
    client.create_topic("fh-demo-balances", queues=4, cleanup_policy="compact")
    latest = _balances(client, "fh-demo-balances", 200)
    key, value = next((k, v) for k, v in sorted(latest.items()) if v is not None)
    out = rmq(cluster, "get", "fh-demo-balances", key.decode()).stdout
    assert out == f"{key.decode()}\t{value.decode()}\n" and not out.rstrip("\n").endswith(" "), repr(out)
