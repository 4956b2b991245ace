"""Key-value on compact topics (issue 40, RIP-22) on a real 3-node cluster: put, get (latest and
at a revision), compare-and-set, delete, keys by prefix, history; conflicts carry the current
revision; bad input and non-compact topics are refused naming what is wrong; concurrent
compare-and-set increments across a leader kill lose no update."""
from __future__ import annotations

import json
import signal
import threading

import pytest

from rmq_spark.client import Client, FailedPrecondition, InvalidArgument, KvConflict, OutOfRange

from .conftest import wait_until
from .fixtures.make_datadir import applied_everywhere
from .wire import leader_of

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kv(cluster):
    with Client(cluster.endpoints, timeout=60) as c:
        c.create_topic("cfg", queues=4, cleanup_policy="compact")
        c.create_topic("plain", queues=1)
        yield cluster, c


def test_put_get_compare_and_set_delete(kv):
    _, c = kv
    r1 = c.kv_put("cfg", "app/db", b"postgres://a", if_absent=True)
    with pytest.raises(KvConflict) as e:
        c.kv_put("cfg", "app/db", b"other", if_absent=True)
    assert e.value.current_revision == r1 and "app/db" in str(e.value)
    with pytest.raises(KvConflict) as e:
        c.kv_put("cfg", "app/db", b"stale", if_revision=r1 + 100)
    assert e.value.current_revision == r1
    r2 = c.kv_put("cfg", "app/db", b"postgres://b", if_revision=r1)
    assert r2 > r1
    got = c.kv_get("cfg", "app/db")
    assert (got.value, got.revision) == (b"postgres://b", r2)
    assert c.kv_get("cfg", "app/db", revision=r1).value == b"postgres://a"
    assert c.kv_get("cfg", "app/db", follower_ok=True) is not None
    r3 = c.kv_delete("cfg", "app/db", if_revision=r2)
    assert c.kv_get("cfg", "app/db") is None
    assert [(h.revision, h.value) for h in c.kv_history("cfg", "app/db")] == \
        [(r1, b"postgres://a"), (r2, b"postgres://b"), (r3, None)]
    with pytest.raises(KvConflict) as e:
        c.kv_put("cfg", "app/db", b"x", if_revision=r2)
    assert e.value.current_revision is None            # deleted: no live revision
    # a put is a message of the topic like any other: consumers read it
    q = got.queue
    assert any(r.key == b"app/db" for r in c.fetch("cfg", q, 0).records)


def test_keys_by_prefix_across_queues(kv):
    _, c = kv
    for i in range(12):
        c.kv_put("cfg", f"svc/{i:02d}", f"{i}".encode())
    c.kv_put("cfg", "other", b"x")
    keys = c.kv_keys("cfg", "svc/", page=2)
    assert [k for k, _ in keys] == [f"svc/{i:02d}".encode() for i in range(12)]
    assert c.kv_get("cfg", "svc/05").revision == dict(keys)[b"svc/05"]


def test_bad_input_and_a_non_compact_topic_are_refused_naming_what_is_wrong(kv):
    _, c = kv
    with pytest.raises(InvalidArgument, match="key is empty"):
        c.kv_put("cfg", b"", b"v")
    with pytest.raises(InvalidArgument, match="the limit is 4096 bytes"):
        c.kv_put("cfg", b"k" * 5000, b"v")
    with pytest.raises(InvalidArgument, match=r"value is 4194304 bytes; .* the limit is 4194304 bytes"):
        c.kv_put("cfg", "big", b"v" * (4 << 20))
    assert c.kv_get("cfg", "big") is None
    with pytest.raises(InvalidArgument, match="if_revision=-3 is negative"):
        c.kv_put("cfg", "k", b"v", if_revision=-3)
    with pytest.raises(InvalidArgument, match="give one condition"):
        c.kv_put("cfg", "k", b"v", if_revision=1, if_absent=True)
    with pytest.raises(FailedPrecondition, match="cleanup policy 'delete'.*--cleanup-policy compact"):
        c.kv_put("plain", "k", b"v")
    with pytest.raises(FailedPrecondition, match="compact topic"):
        c.kv_get("plain", "k")
    r = c.kv_put("cfg", "gone", b"1")
    with pytest.raises(OutOfRange, match="oldest revision kept is"):
        c.kv_get("cfg", "gone", revision=r + 1)


def test_concurrent_increments_across_a_leader_kill_lose_no_update(kv):
    """Compare-and-set increments of one counter from 4 threads while the counter's
    leader is killed with SIGKILL and restarted: every increment that returned is
    counted once, so the final value is the number of successful increments."""
    cluster, c = kv
    c.kv_put("cfg", "counter", b"0")
    done = []
    lock = threading.Lock()

    def worker():
        with Client(cluster.endpoints, timeout=60) as w:
            for _ in range(15):
                while True:
                    cur = w.kv_get("cfg", "counter")
                    try:
                        w.kv_put("cfg", "counter", str(int(cur.value) + 1).encode(), if_revision=cur.revision)
                        break
                    except KvConflict:
                        continue
                with lock:
                    done.append(1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    q = c.kv_get("cfg", "counter").queue
    victim = leader_of(c, "cfg", q)
    cluster.kill(victim, signal.SIGKILL)
    cluster.start_node(victim)
    for t in threads:
        t.join(timeout=180)
    assert not any(t.is_alive() for t in threads)
    assert int(c.kv_get("cfg", "counter").value) == len(done) == 60


def test_the_rmq_kv_cli(kv):
    cluster, _ = kv
    from .test_cli import rmq
    r1 = int(rmq(cluster, "kv", "put", "cfg", "cli/a", "one", "--if-absent").stdout)
    p = rmq(cluster, "kv", "put", "cfg", "cli/a", "two", "--if-absent", check=False)
    assert p.returncode == 1 and f"key 'cli/a' is at revision {r1}; nothing was written" in p.stderr
    r2 = int(rmq(cluster, "kv", "put", "cfg", "cli/a", "--if-revision", str(r1), stdin="two").stdout)
    assert rmq(cluster, "kv", "get", "cfg", "cli/a").stdout == "two\n"
    got = json.loads(rmq(cluster, "kv", "get", "cfg", "cli/a", "--revision", str(r1), "--json").stdout)
    assert (got["value"], got["revision"]) == ("one", r1)
    rmq(cluster, "kv", "put", "cfg", "cli/b", "x")
    assert rmq(cluster, "kv", "keys", "cfg", "--prefix", "cli/").stdout == "cli/a\ncli/b\n"
    int(rmq(cluster, "kv", "delete", "cfg", "cli/a", "--if-revision", str(r2)).stdout)
    p = rmq(cluster, "kv", "get", "cfg", "cli/a", check=False)
    assert p.returncode == 1 and "has no value" in p.stderr
    hist = json.loads(rmq(cluster, "kv", "history", "cfg", "cli/a", "--json").stdout)
    assert [(h["value"], h["deleted"]) for h in hist] == [("one", False), ("two", False), (None, True)]
    p = rmq(cluster, "kv", "put", "plain", "k", "v", check=False)
    assert p.returncode == 1 and "--cleanup-policy compact" in p.stderr


def test_kv_over_http_with_if_match_and_if_none_match(kv):
    import requests
    from storage_service.protocol.placement import http_address
    cluster, c = kv
    base = f"http://{http_address(cluster.addresses[0])}/v1/kv/cfg"

    def put(key, value, **headers):      # followed to the leader (307) by requests
        return requests.put(f"{base}/{key}", json={"value": value}, headers=headers, timeout=30)
    r = put("http/a", "one", **{"If-None-Match": "*"})
    assert r.status_code == 200, r.text
    rev = r.json()["revision"]
    r = put("http/a", "again", **{"If-None-Match": "*"})
    assert r.status_code == 412 and f"current revision {rev}" in r.json()["error"]["message"]
    r = put("http/a", "two", **{"If-Match": str(rev + 50)})
    assert r.status_code == 412
    r = put("http/a", "two", **{"If-Match": str(rev)})
    assert r.status_code == 200
    got = requests.get(f"{base}/http/a", timeout=30).json()
    assert got["value"] == "two" and got["revision"] == r.json()["revision"]
    assert c.kv_get("cfg", "http/a").value == b"two"                  # the same key as the client's
    assert requests.get(f"{base}/http/a?revision={rev}", timeout=30).json()["value"] == "one"
    r = requests.delete(f"{base}/http/a", headers={"If-Match": str(rev)}, timeout=30)
    assert r.status_code == 412
    assert requests.delete(f"{base}/http/a", timeout=30).status_code == 200
    r = requests.get(f"{base}/http/a", timeout=30)
    assert r.status_code == 404 and "has no value" in r.json()["error"]["message"]
    r = requests.put(f"{base}/x", json={"val": 1}, timeout=30)
    assert r.status_code == 400 and "value" in r.text
    r = put("x", "v", **{"If-Match": "abc"})
    assert r.status_code == 400 and "If-Match" in r.text


def test_a_ttl_expires_the_value_and_the_leader_commits_its_delete(kv):
    _, c = kv
    r = c.kv_put("cfg", "session/1", b"alive", ttl_ms=300)
    keep = c.kv_put("cfg", "session/2", b"stays")
    # past its TTL the key reads as absent, and the leader's upkeep (every 0.5 s here)
    # commits a delete conditioned on that revision: the history ends in it
    wait_until(lambda: [h.value for h in c.kv_history("cfg", "session/1")] == [b"alive", None],
               timeout=60, what="the expired key's delete committed")
    assert c.kv_get("cfg", "session/1") is None
    assert c.kv_history("cfg", "session/1")[0].revision == r
    assert c.kv_get("cfg", "session/2").revision == keep
    assert c.kv_put("cfg", "session/1", b"again", if_absent=True) > r
    with pytest.raises(InvalidArgument, match="ttl_ms=-5"):
        c.kv_put("cfg", "session/3", b"x", ttl_ms=-5)


def test_watch_gives_a_snapshot_then_every_change_without_gaps(kv):
    _, c = kv
    c.kv_put("cfg", "w/a", b"1")
    rb = c.kv_put("cfg", "w/b", b"1")
    c.kv_put("cfg", "x/other", b"1")
    watch = c.kv_watch("cfg", "w/")
    snap = [next(watch), next(watch)]
    assert [(e.key, e.value, e.snapshot) for e in snap] == [(b"w/a", b"1", True), (b"w/b", b"1", True)]
    ra2 = c.kv_put("cfg", "w/a", b"2")
    rc = c.kv_put("cfg", "w/c", b"1")
    rd = c.kv_delete("cfg", "w/b")
    c.kv_put("cfg", "x/other", b"2")                       # not under the prefix
    got = sorted((e.key, e.value, e.revision) for e in [next(watch), next(watch), next(watch)])
    assert got == [(b"w/a", b"2", ra2), (b"w/b", None, rd), (b"w/c", b"1", rc)]
    watch.close()
    # from a revision: every change at or after it (here, of one key's queue)
    q = c.kv_get("cfg", "w/a").queue
    replay = c.kv_watch("cfg", "w/a", from_revision=0)
    seen = [next(replay) for _ in range(2)]
    replay.close()
    assert [e.value for e in seen] == [b"1", b"2"] and all(e.queue == q and not e.snapshot for e in seen)
    assert rb < rd


def test_rmq_kv_watch_prints_the_snapshot_and_changes(kv):
    cluster, c = kv
    from .test_cli import rmq
    c.kv_put("cfg", "cw/1", b"a")
    c.kv_put("cfg", "cw/1", b"b")
    out = rmq(cluster, "kv", "watch", "cfg", "--prefix", "cw/", "--from-revision", "0", "--max", "2",
              "--json").stdout
    assert [(json.loads(line)["value"], json.loads(line)["type"]) for line in out.splitlines()] == \
        [("a", "put"), ("b", "put")]


def test_a_compact_topics_queue_count_cannot_grow(kv):
    """A key's queue is crc32(key) % queues: more queues would send its next value
    elsewhere (two live values, gets that miss)."""
    _, c = kv
    with pytest.raises(FailedPrecondition, match="growing it would move keys"):
        c.alter_topic("cfg", queues=8)
    assert c.describe_topic("cfg")["queues"] == 4


def test_kv_calls_are_counted_by_method_and_outcome(kv):
    """/metrics: rmq_requests_total{method="KvPut"|"KvRead", code=...} and their latency
    histograms, like every call of the node."""
    from .scrape import total
    cluster, c = kv
    before = total(cluster, "rmq_requests_total", method="KvPut", code="ABORTED")
    reads = total(cluster, "rmq_requests_total", method="KvRead", code="OK")
    r = c.kv_put("cfg", "metered", b"1")
    with pytest.raises(KvConflict):
        c.kv_put("cfg", "metered", b"2", if_revision=r + 1)
    c.kv_get("cfg", "metered")
    assert total(cluster, "rmq_requests_total", method="KvPut", code="ABORTED") - before == 1
    assert total(cluster, "rmq_requests_total", method="KvRead", code="OK") - reads >= 1
    assert total(cluster, "rmq_request_duration_seconds_count", method="KvPut") >= 2


def test_one_register_is_linearizable_across_a_leader_kill(kv):
    """4 clients read, write and compare-and-set one key while its leader is killed with
    SIGKILL and restarted; the history (each call's start, end and answer, an unknown
    outcome where a call failed) is checked by a single-register model
    (tests/linearizable.py, Porcupine-style)."""
    import random
    import time as _time

    from rmq_spark.client import RmqError

    from .linearizable import Op, linearizable
    cluster, c = kv
    c.kv_put("cfg", "register", b"init")
    history: list[Op] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        rng = random.Random(n)
        with Client(cluster.endpoints, timeout=30) as w:
            for i in range(25):
                kind = rng.choice(["read", "write", "cas"])
                t0 = _time.monotonic()
                try:
                    if kind == "read":
                        e = w.kv_get("cfg", "register")
                        op = Op(n, "read", None, e.value if e else None, t0, _time.monotonic())
                    elif kind == "write":
                        v = f"w{n}-{i}".encode()
                        try:
                            w.kv_put("cfg", "register", v)
                            op = Op(n, "write", v, True, t0, _time.monotonic())
                        except RmqError:
                            op = Op(n, "write", v, None, t0, None)
                    else:
                        cur = w.kv_get("cfg", "register")
                        t0 = _time.monotonic()             # the cas is the call measured
                        v = f"c{n}-{i}".encode()
                        try:
                            w.kv_put("cfg", "register", v, if_revision=cur.revision)
                            op = Op(n, "cas", (cur.value, v), True, t0, _time.monotonic())
                        except KvConflict:
                            op = Op(n, "cas", (cur.value, v), False, t0, _time.monotonic())
                        except RmqError:
                            op = Op(n, "cas", (cur.value, v), None, t0, None)
                except RmqError:
                    continue                                # a read that failed says nothing
                with lock:
                    history.append(op)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    victim = leader_of(c, "cfg", c.kv_get("cfg", "register").queue)
    cluster.kill(victim, signal.SIGKILL)
    cluster.start_node(victim)
    for t in threads:
        t.join(timeout=180)
    assert len(history) >= 60
    assert linearizable([Op(-1, "write", b"init", True, -2.0, -1.0)] + history, initial=None)


def test_a_condition_meeting_a_rotten_batch_waits_for_its_repair_and_decides_as_its_peers(tmp_path):
    """A replica whose key index must be rebuilt from a log with a rotten batch (here:
    the index file gone and a byte flipped in a sealed segment) cannot decide a
    compare-and-set from its own copy. It puts the apply off, repairs the segment
    from a peer, then applies the write as its peers did: its own answer (a follower
    read) shows the value, and nothing is wedged."""
    import glob
    import os

    from rmq_spark.client import Message
    from storage_service.local import LocalCluster

    from .node_faults import flip, sealed_segments

    cluster = LocalCluster(nodes=3, groups=1, data_dir=str(tmp_path), extra_args=["--segment-bytes", "262144"])
    cluster.start(timeout=90)
    try:
        with Client(cluster.endpoints, timeout=60) as c:
            c.create_topic("rot", queues=1, cleanup_policy="compact")
            first = c.kv_put("rot", "target", b"first")
            for n in range(100):            # about 700 KB of other keys: sealed segments
                c.produce("rot", [Message(b"x" * 200, key=b"k%d-%d" % (n, i)) for i in range(30)], queue=0)
            rev = c.kv_put("rot", "target", b"second", if_revision=first)
            # node 0 opens its index deciding that write; followers learn a commit a moment
            # after their leader
            wait_until(lambda: applied_everywhere(c), timeout=60, what="every replica applied every entry")
        cluster.stop()
        victim = os.path.join(cluster.data_dir, "node-0")
        os.remove(glob.glob(os.path.join(victim, "group-1", "queues", "kv-index.sqlite3"))[0])
        # Early in the first segment: a start checks a sealed segment from its last
        # offset-index entry (every 64 KiB) on, so this rot is met first by the key
        # index's rebuild.
        flip(sealed_segments(victim, 1)[0], 1000)
        cluster.start(timeout=90)
        with Client(cluster.endpoints, timeout=60) as c:
            third = c.kv_put("rot", "target", b"third", if_revision=rev)
            assert c.kv_get("rot", "target").value == b"third"
        with Client([cluster.endpoints.split(",")[0]], timeout=60) as own:
            wait_until(lambda: (e := own.kv_get("rot", "target", follower_ok=True)) is not None
                       and (e.value, e.revision) == (b"third", third), timeout=60)
            assert own.kv_get("rot", "target", revision=first, follower_ok=True).value == b"first"
        with open(os.path.join(cluster.log_dir, "node-0.log")) as f:
            text = f.read()
        assert "being repaired from a peer" in text      # the apply was put off, not wedged
    finally:
        cluster.stop()
