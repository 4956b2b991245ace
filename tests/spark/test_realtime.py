"""format("rocketmq-rt"): the JVM source that Spark's real-time mode accepts (issue 41).

Real Spark with the real trigger (``trigger(realTime=...)``), a real 3-node cluster:
every message read once, positions checkpointed as the Python source writes them (a
query switches source and trigger and resumes where it was), the same rows as
``format("rocketmq")``, and options refused naming what is wrong.
"""
from __future__ import annotations

import glob
import json
import os
import re
import time

import pytest

from rmq_spark.client import Client, Message

from ..conftest import start_cluster, wait_until

pytestmark = pytest.mark.spark


def _files_sink(folder: str):
    """A foreach sink (Python; real-time mode accepts it) writing one file per row."""
    def write(row):
        with open(os.path.join(folder, f"{row.queue}-{row.offset}"), "w") as f:
            f.write(row.value.decode())
    return write


def _run_to_files(spark, cluster, topic: str, checkpoint: str, folder, **opts):
    """An availableNow query of format("rocketmq-rt") from earliest, one file per row in a
    new folder under ``folder``: (the query, that folder)."""
    r = spark.readStream.format("rocketmq-rt").option("endpoints", cluster.endpoints) \
        .option("topic", topic).option("startingOffsets", "earliest").options(**opts)
    out = folder / f"rows-{len([p for p in os.listdir(folder) if p.startswith('rows-')])}"
    out.mkdir()
    q = r.load().writeStream.foreach(_files_sink(str(out))).trigger(availableNow=True) \
        .option("checkpointLocation", checkpoint).start()
    return q, out


def _committed_end(checkpoint: str) -> dict | None:
    """Where the last batch that completed ended (in real-time mode a batch's offsets and
    its commit are written as it ends)."""
    done = glob.glob(os.path.join(checkpoint, "commits", "[0-9]*"))
    if not done:
        return None
    last = max(int(os.path.basename(p)) for p in done)
    with open(os.path.join(checkpoint, "offsets", str(last))) as f:
        return json.loads(f.read().splitlines()[-1])


def _running(query) -> bool:
    """True while the query runs; its error, if it failed, as the test's."""
    if query.exception() is not None:
        raise AssertionError(f"the query failed: {query.exception()}")
    return True


def test_a_real_time_query_reads_every_message_once_and_resumes_with_the_python_source(
        spark, cluster, client, tmp_path):
    client.create_topic("rt-once", queues=2)
    for q in (0, 1):
        client.produce("rt-once", [Message(b"before-%d-%d" % (q, i)) for i in range(3)], queue=q)
    out, chk = tmp_path / "rows", str(tmp_path / "chk")
    out.mkdir()
    query = (spark.readStream.format("rocketmq-rt").option("endpoints", cluster.endpoints)
             .option("topic", "rt-once").option("startingOffsets", "earliest").load()
             .writeStream.foreach(_files_sink(str(out))).outputMode("update")
             .trigger(realTime="5 seconds").option("checkpointLocation", chk).start())
    try:
        sent = {f"{q}-{i}" for q in (0, 1) for i in range(3)}
        for i in range(10):                       # while the tasks wait on their queues
            r = client.produce("rt-once", [Message(b"live-%d" % i)], queue=i % 2)[0]
            sent.add(f"{i % 2}-{r.base_offset}")
            time.sleep(0.1)
        wait_until(lambda: _running(query) and set(os.listdir(out)) >= sent, timeout=120,
                   what="every message in the sink")
        # a batch that ended after the last message: its end is checkpointed
        wait_until(lambda: _running(query) and _committed_end(chk) == {"rt-once": {"0": 8, "1": 8}}, timeout=60,
                   what="the positions after every message in the checkpoint")
    finally:
        query.stop()
    assert set(os.listdir(out)) == sent                    # nothing else, no offset twice
    assert open(out / "0-3").read() == "live-0"
    # The same checkpoint, now read by the Python source in a micro-batch: only what came since.
    client.produce("rt-once", [Message(b"after-0")], queue=0)
    client.produce("rt-once", [Message(b"after-1")], queue=1)
    after = (spark.readStream.format("rocketmq").option("endpoints", cluster.endpoints)
             .option("topic", "rt-once").load()
             .writeStream.foreach(_files_sink(str(tmp_path / "after"))).trigger(availableNow=True)
             .option("checkpointLocation", chk).start())
    (tmp_path / "after").mkdir()
    after.awaitTermination(120)
    assert after.exception() is None
    assert {n: (tmp_path / "after" / n).read_text() for n in os.listdir(tmp_path / "after")} == \
        {"0-8": "after-0", "1-8": "after-1"}


def test_micro_batches_read_the_rows_the_python_source_reads(spark, cluster, client):
    client.create_topic("rt-rows", queues=2)
    client.produce("rt-rows", [Message(b"v-%d" % i, key=b"k-%d" % i, tags="TagA",
                                       properties={"p": str(i)}) for i in range(5)], queue=0)
    client.produce("rt-rows", [Message(b"\xff\x00binary", key=None), Message(None, key=b"gone")], queue=1)
    got = {}
    for fmt in ("rocketmq", "rocketmq-rt"):
        name = "rows_" + fmt.replace("-", "_")
        q = (spark.readStream.format(fmt).option("endpoints", cluster.endpoints).option("topic", "rt-rows")
             .option("startingOffsets", "earliest").load()
             .writeStream.format("memory").queryName(name).trigger(availableNow=True).start())
        q.awaitTermination(120)
        got[fmt] = sorted((tuple(r) for r in spark.sql(f"select * from {name}").collect()), key=lambda r: (r[3], r[4]))
    assert len(got["rocketmq"]) == 7
    assert got["rocketmq-rt"] == got["rocketmq"]
    assert spark.readStream.format("rocketmq-rt").option("endpoints", cluster.endpoints) \
        .option("topic", "rt-rows").load().schema == \
        spark.readStream.format("rocketmq").option("endpoints", cluster.endpoints) \
        .option("topic", "rt-rows").load().schema


_EP = {"endpoints": "127.0.0.1:1"}


@pytest.mark.parametrize("options", [
    {"topic": "t"},
    _EP,
    dict(_EP, topic="t", topics="t,u"),
    dict(_EP, topics=" , "),
    dict(_EP, endpoints="nohost", topic="t"),
    dict(_EP, topic="t", startingOffsets='{"t": {"x": 1}}'),
    dict(_EP, topic="t", startingOffsets='{"t": {"0": -3}}'),
    dict(_EP, topic="t", startingOffsets='{"t": {"0": "a"}}'),
    dict(_EP, topic="t", startingOffsets='{"t": 5}'),
    dict(_EP, topic="t", startingOffsets="{}"),
    dict(_EP, topic="t", startingOffsets='{"u": {"0": 1}}'),
    dict(_EP, topic="t", startingOffsets="soon"),
    dict(_EP, topic="t", failOnDataLoss="maybe"),
    dict(_EP, topic="t", token="a", tokenFile="/x"),
    dict(_EP, topic="t", tokenFile="/nonexistent/token"),
    dict(_EP, topic="t", tlsCaFile="/nonexistent/ca.pem"),
    dict(_EP, topic="t", tlsCertFile="/c.pem", tlsKeyFile="/k.pem"),
    dict(_EP, topic="t", tlsCaFile="/nonexistent/ca.pem", tlsCertFile="/c.pem"),
    {"endpoints": ",", "topic": "t"},
    {"endpoints": "h:70000", "topic": "t"},
    {"endpoints": ":5", "topic": "t"},
    dict(_EP, topic="a,b"),
    dict(_EP, topic=""),
    dict(_EP, topics="t", subscribe="u"),
    {},
    dict(_EP, topic="t", tokenFile="/dev/null"),
    dict(_EP, topic="t", token=""),
    dict(_EP, topic="t", tokenFile="relative/token"),
    dict(_EP, topic="t", startingOffsets=" soon "),
    dict(_EP, topic="t", startingOffsets='{"t": {"0": true}}'),
    dict(_EP, topic="t", startingOffsets='{"t": {"0": null}}'),
    dict(_EP, topics=" t , u ", startingOffsets='{"v": {"0": 1}}'),
    {"topic": "t", "endpoints": "nohost", "failOnDataLoss": "maybe"},      # which mistake is named first
    {"topic": "t", "endpoints": "nohost", "startingOffsets": "soon"},
    dict(_EP, topic="t", startingOffsets='{"v": {"0": 1}}', token=""),
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items() if k != "endpoints" or v != "127.0.0.1:1"))
def test_bad_options_are_refused_at_load_in_the_python_sources_words(spark, options):
    """Both sources refuse the same bad option with the same message (issue 41: "same
    errors"); the classes differ (a JVM IllegalArgumentException, a Python OptionError)."""
    said = {}
    for fmt in ("rocketmq", "rocketmq-rt"):
        with pytest.raises(Exception) as e:
            spark.readStream.format(fmt).options(**options).load()
        found = re.search(r"option '\w+': .*", str(e.value))
        assert found, f"{fmt}: {e.value}"
        said[fmt] = found.group(0).splitlines()[0].strip()
    # One difference, on purpose: the JVM source takes no topicPattern, subscribePattern or
    # assign, so its list of the topic options leaves them out.
    python = said["rocketmq"].replace(', topicPattern or subscribePattern (regex), assign (JSON {"topicA": '
                                      '[0, 1], "topicB": [2]})', "")
    assert said["rocketmq-rt"] == python


@pytest.mark.parametrize("options, says", [
    ({"endpoints": "127.0.0.1:1", "topic": "t", "maxOffsetsPerTrigger": "5"},
     "option 'maxOffsetsPerTrigger': not taken by format(\"rocketmq-rt\")"),
    ({"endpoints": "127.0.0.1:1", "topic": "t", "maxMessagesPerFetch": "0"},
     "option 'maxMessagesPerFetch': '0' is not an integer from 1 to 10000"),
])
def test_options_of_one_source_only_are_refused_naming_the_option(spark, options, says):
    with pytest.raises(Exception, match=re.escape(says)):
        spark.readStream.format("rocketmq-rt").options(**options).load()


def _copy(cluster, src: str, dst: str, checkpoint: str):
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.Popen([sys.executable, os.path.join(here, "_realtime_copy.py"), cluster.endpoints,
                             src, dst, checkpoint], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _values(client, topic: str) -> list[bytes]:
    out = []
    for o in client.offsets(topic):
        at = o.earliest
        while at < o.latest:
            got = client.fetch(topic, o.queue, at)
            out += [r.value for r in got.records]
            at = got.next_offset
    return out


def test_a_real_time_copy_killed_and_restarted_writes_an_exact_copy(cluster, client, tmp_path):
    """The JVM sink (rmq_spark.realtime.to_rocketmq): a real-time query copying one topic
    into another, its driver and Spark killed with SIGKILL mid-copy and started again on
    its checkpoint: every message once in the copy (the batch cut short is replayed; the
    rows it had written come back with their producer id and sequence and are dropped)."""
    import signal
    client.create_topic("rt-src", queues=2)
    client.create_topic("rt-dst", queues=2)
    sent = []

    def produce(n0: int, n: int) -> None:
        for i in range(n0, n0 + n, 20):
            batch = [Message(b"m-%04d" % j, key=b"k-%d" % j, tags="T") for j in range(i, min(i + 20, n0 + n))]
            client.produce("rt-src", batch, queue=(i // 20) % 2)
            sent.extend(m.value for m in batch)
    produce(0, 200)
    chk = str(tmp_path / "chk")
    first = _copy(cluster, "rt-src", "rt-dst", chk)
    try:
        wait_until(lambda: first.poll() is None and len(_values(client, "rt-dst")) >= 100, timeout=180,
                   interval=0.2, what="the copy under way")
        produce(200, 100)                          # while it copies
    finally:
        os.killpg(first.pid, signal.SIGKILL)       # the driver and its Spark JVM, at once
        first.wait(30)
    produce(300, 100)
    second = _copy(cluster, "rt-src", "rt-dst", chk)
    try:
        wait_until(lambda: second.poll() is None and set(_values(client, "rt-dst")) >= set(sent), timeout=240,
                   interval=0.5, what="every message copied")
        time.sleep(6)                              # a batch more: anything written twice would show
    finally:
        os.killpg(second.pid, signal.SIGKILL)
        second.wait(30)
    copied = _values(client, "rt-dst")
    assert sorted(copied) == sorted(sent)          # each message once: no loss, no duplicate


def test_a_real_time_copy_keeps_going_through_a_leader_kill_a_replica_move_and_a_decommission(
        spark, tmp_path):
    """A real-time query (the JVM source into the JVM sink) copying a topic on a 4-node
    cluster while messages keep coming: the source's leader is killed with SIGKILL and
    restarted, a replica of the copy's group moves to the node without one, and a node
    is decommissioned and stopped. The copy holds every message once and the query never
    fails (its fetches and produces find the new leaders)."""
    import signal
    import threading

    from rmq_spark.cli._status import moving_groups
    from rmq_spark.realtime import to_rocketmq

    from ..workload import leader_index

    cluster = start_cluster(tmp_path / "nodes", nodes=4, groups=3)
    client = Client(cluster.endpoints, timeout=60)
    stop, sent, lock = threading.Event(), [], threading.Lock()

    def produce() -> None:
        n = 0
        while not stop.is_set():
            batch = [Message(b"f-%05d" % (n + j), key=b"k-%d" % (n + j)) for j in range(10)]
            client.produce("rtf-src", batch, queue=(n // 10) % 2)    # retried inside until acknowledged
            with lock:
                sent.extend(m.value for m in batch)
            n += 10
            stop.wait(0.05)

    def settled() -> bool:
        return not moving_groups(client.cluster_status())

    query = None
    try:
        client.create_topic("rtf-src", queues=2)
        client.create_topic("rtf-dst", queues=2)
        rows = (spark.readStream.format("rocketmq-rt").option("endpoints", cluster.endpoints)
                .option("topic", "rtf-src").option("startingOffsets", "earliest").load().select("key", "value"))
        query = to_rocketmq(rows.writeStream.outputMode("update").trigger(realTime="5 seconds")
                            .option("checkpointLocation", str(tmp_path / "chk")), cluster.endpoints,
                            "rtf-dst").start()
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        wait_until(lambda: _running(query) and len(_values(client, "rtf-dst")) >= 50, timeout=120,
                   what="the copy under way")
        # 1. the source's leader, killed and restarted
        victim = leader_index(client, cluster, client.group_of("rtf-src", 0))
        cluster.kill(victim, signal.SIGKILL)
        time.sleep(2)
        cluster.start_node(victim)
        cluster.wait_ready(90)
        # 2. a replica of the copy's group moves to the node without one
        g = client.group_of("rtf-dst", 0)
        st = client.cluster_status()
        giver = st["placement"][g][0]
        taker = next(a for a in cluster.addresses if a not in st["placement"][g])
        client.cluster_command("move", giver, g, taker)
        wait_until(lambda: _running(query) and settled(), timeout=120, interval=0.5, what="the move done")
        # 3. a node decommissioned, then stopped
        gone = cluster.addresses[3]
        client.cluster_command("decommission", gone)
        wait_until(lambda: _running(query) and any(
            m["address"] == gone and m["state"] == "removed" for m in client.cluster_status()["members"])
            and settled(), timeout=180, interval=0.5, what="the decommission done")
        cluster.kill(3, signal.SIGKILL)
        time.sleep(3)
        stop.set()
        producer.join(60)
        wait_until(lambda: _running(query) and set(_values(client, "rtf-dst")) >= set(sent), timeout=180,
                   interval=0.5, what="every message copied")
        time.sleep(6)                      # a batch more: anything written twice would show
        _running(query)
        copied = _values(client, "rtf-dst")
    finally:
        stop.set()
        if query is not None:
            query.stop()
        client.close()
        cluster.stop()
    assert sorted(copied) == sorted(sent)          # each message once: no loss, no duplicate


def test_offsets_retention_removed_fail_the_query_naming_them_or_are_skipped(spark, cluster, client, tmp_path):
    """A checkpoint whose next offsets retention has cut since: the query fails naming the
    queue and the missing range (failOnDataLoss, default true), as the Python source; with
    failOnDataLoss=false it goes on from the queue's earliest offset."""
    client.create_topic("rt-cut", queues=1)
    client.produce("rt-cut", [Message(b"first")], queue=0)

    def run(chk: str, **opts):
        return _run_to_files(spark, cluster, "rt-cut", chk, tmp_path, **opts)
    chk_fail, chk_skip = str(tmp_path / "chk-fail"), str(tmp_path / "chk-skip")
    for chk in (chk_fail, chk_skip):
        q, out = run(chk)
        q.awaitTermination(120)
        assert q.exception() is None and os.listdir(out) == ["0-0"]
    # ~512 KiB more in 64 KiB segments, then a retention of 128 KiB: offsets 1.. are cut
    for _ in range(8):
        client.produce("rt-cut", [Message(b"x" * 1024) for _ in range(64)], queue=0)
    client.alter_topic("rt-cut", retention_bytes=128 << 10)
    wait_until(lambda: client.offsets("rt-cut")[0].earliest > 1, timeout=60, what="retention to cut")
    earliest = client.offsets("rt-cut")[0].earliest
    q, _ = run(chk_fail)
    with pytest.raises(Exception, match=re.escape(f"data loss: topic 'rt-cut' queue 0: offsets [1, {earliest}) were "
                                                  f"removed by retention before they were read")):
        q.awaitTermination(120)
    q, out = run(chk_skip, failOnDataLoss="false")
    q.awaitTermination(120)
    assert q.exception() is None
    assert min(int(n.split("-")[1]) for n in os.listdir(out)) == earliest
    assert len(os.listdir(out)) == 513 - earliest


def test_a_topic_made_again_behind_the_querys_back_is_data_loss_as_with_the_python_source(
        spark, cluster, client, tmp_path):
    """Micro-batches of format("rocketmq-rt") after the topic was deleted and created again
    (its queues went back): the query fails naming the offsets, in the Python source's
    words; with failOnDataLoss=false it reads the new queues from their earliest offset."""
    client.create_topic("rt-again", queues=2)
    for q in (0, 1):
        client.produce("rt-again", [Message(b"old-%d-%d" % (q, i)) for i in range(20)], queue=q)

    def run(**opts):
        return _run_to_files(spark, cluster, "rt-again", str(tmp_path / "chk"), tmp_path, **opts)
    q, out = run()
    q.awaitTermination(120)
    assert q.exception() is None and len(os.listdir(out)) == 40
    client.delete_topic("rt-again")
    client.create_topic("rt-again", queues=2)
    for q in (0, 1):
        client.produce("rt-again", [Message(b"new-%d-%d" % (q, i)) for i in range(5)], queue=q)
    q, _ = run()
    with pytest.raises(Exception, match=re.escape("data loss: topic 'rt-again' queue 0: offsets from 20 on are gone: "
                                                  "the queue went back to 5")):
        q.awaitTermination(120)
    q, out = run(failOnDataLoss="false")
    q.awaitTermination(120)
    assert q.exception() is None
    assert sorted(os.listdir(out)) == sorted(f"{q}-{i}" for q in (0, 1) for i in range(5))
