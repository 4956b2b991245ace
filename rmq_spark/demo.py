"""``make demo``: a local 3-node cluster, end to end, in about a minute.

Starts the cluster, creates a topic, produces messages (progress shown),
kills the leader of a raft group with SIGKILL mid-stream, keeps producing,
restarts the node, and reads everything back to show nothing was lost. Then
Spark: a batch query over the topic with ``format("rocketmq")``, and a
streaming job (``Trigger.AvailableNow``, exactly-once sink) that copies the
TagA messages to a second topic while committing its consumer-group offsets.
Then tiering: a topic tiered to a Delta archive is archived by the tiering
job (``rmq tier``), hot retention drops the archived part from the nodes, and
one ``format("rocketmq")`` query still returns the whole history. Last,
compaction: a change-log of account balances is compacted into a Delta table
(``rmq compact``), the nodes then drop superseded records from the hot log,
and ``rmq get`` looks a key up.
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import time

from storage_service.local import LocalCluster

from .cli._format import table
from .cli._status import cluster_view
from .client import Client, Message

TOPIC = "demo-orders"
QUEUES = 4
ROUNDS = 40
BATCH = 250


def _produce_round(client: Client, r: int) -> int:
    n = 0
    for q in range(QUEUES):
        msgs = [Message(value=f'{{"order": {r * BATCH + i}, "queue": {q}}}'.encode(),
                        key=f"customer-{i % 17}".encode(), tags="TagA" if i % 2 else "TagB")
                for i in range(BATCH)]
        n += client.produce(TOPIC, msgs, queue=q)[0].count
    return n


def _leader_node(client: Client, cluster: LocalCluster, group: int) -> int:
    leader = client.cluster_status()["nodes"][0]["groups"][group]["leader"]
    return cluster.addresses.index(leader)


def main() -> int:
    # Spark's JVM first: launched while the demo's gRPC client had its threads running,
    # it sometimes died at once ("Java gateway process exited before sending its port
    # number", after grpc's "epoll_wait error: Bad file descriptor"); the test suite
    # starts its sessions before its clients too.
    spark = _start_spark()
    try:
        return _main(spark)
    finally:
        spark.stop()


def _start_spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from .spark import session_builder

    print("starting Spark (local[2]) ...")
    spark = session_builder("rmq-demo").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _main(spark) -> int:
    with tempfile.TemporaryDirectory(prefix="rmq-demo-") as tmp:
        print("starting a local 3-node cluster (3 processes, 4 data raft groups + metadata) ...")
        # Small segments and a 1 s retention pass, so tiered data leaves the hot log at once
        # and the balances' superseded values (~45 bytes each) leave it once compacted
        # (only sealed segments are compacted).
        with LocalCluster(nodes=3, groups=4, data_dir=tmp,
                          extra_args=["--segment-bytes", str(64 << 10),
                                      "--retention-interval", "1"]) as cluster:
            print(f"endpoints: {cluster.endpoints}")
            with Client(cluster.endpoints) as client:
                rc = _run(client, cluster)
                return rc or _spark(spark, client, cluster.endpoints, tmp)


def _run(client: Client, cluster: LocalCluster) -> int:
    client.create_topic(TOPIC, queues=QUEUES, retention_ms=7 * 86_400_000)
    acked, t0 = 0, time.monotonic()
    victim = None
    for r in range(ROUNDS):
        acked += _produce_round(client, r)
        if r == ROUNDS // 2:
            group = client.group_of(TOPIC, 0)
            victim = _leader_node(client, cluster, group)
            print(f"  kill -9 node {victim} (pid {cluster.pid(victim)}), leader of raft group {group}")
            cluster.kill(victim, signal.SIGKILL)
        if r % 10 == 9:
            print(f"  produced {acked:,} messages ({acked / (time.monotonic() - t0):,.0f} msg/s)")
    print(f"  restarting node {victim}")
    cluster.start_node(victim)
    cluster.wait_ready(60)
    offsets = client.offsets(TOPIC)
    read = 0
    for o in offsets:
        off = o.earliest
        while off < o.latest:
            res = client.fetch(TOPIC, o.queue, off, max_bytes=4 << 20)
            read += len(res.records)
            off = res.next_offset
    print()
    print(table([[o.queue, o.earliest, o.latest] for o in offsets], ["queue", "earliest", "latest"]))
    print(f"\nacknowledged {acked:,} messages, read back {read:,}: "
          f"{'nothing lost' if read == acked else 'MISMATCH'}")
    print("\nraft groups (leader per group):")
    print(groups_table(client.cluster_status()))
    return 0 if read == acked else 1


def groups_table(status: dict) -> str:
    """Each raft group's leader, term and commit index, from every node that answered
    (``rmq cluster status``'s view): the first node listed may be the one just
    restarted, not yet reachable from the node asked, and report no group."""
    return table([[g["group"], g["leader"] or "-", g["term"], g["commit_index"] or "-"]
                  for g in cluster_view(status)["groups"]], ["group", "leader", "term", "commit"])


def _spark(spark, client: Client, endpoints: str, tmp: str) -> int:
    print()
    df = spark.read.format("rocketmq").option("endpoints", endpoints).option("topic", TOPIC).load()
    print('spark.read.format("rocketmq"): messages per tag and queue')
    df.groupBy("tags", "queue").count().orderBy("tags", "queue").show()
    client.create_topic("demo-taga", queues=2)
    query = (spark.readStream.format("rocketmq").option("endpoints", endpoints)
             .option("topic", TOPIC).option("startingOffsets", "earliest")
             .option("tags", "TagA").option("maxOffsetsPerTrigger", "8000")
             .option("consumerGroup", "demo-copy").load()
             .select("key", "value", "tags")
             .writeStream.format("rocketmq").option("endpoints", endpoints)
             .option("topic", "demo-taga")
             .option("checkpointLocation", os.path.join(tmp, "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    copied = sum(o.latest for o in client.offsets("demo-taga"))
    want = df.where("tags = 'TagA'").count()
    lag = sum(o.latest - client.committed_offsets("demo-copy", TOPIC).get(o.queue, 0)
              for o in client.offsets(TOPIC))
    print(f"streaming copy of TagA messages (exactly-once sink): {copied:,} written, "
          f"{want:,} expected; consumer group demo-copy lag {lag}")
    if copied != want or lag != 0:
        return 1
    return _tiering(spark, client, endpoints, tmp)


def _tiering(spark, client: Client, endpoints: str, tmp: str) -> int:
    from .cli.main import main as rmq
    from .tiering import tier_topic

    topic, archive = "demo-history", os.path.join(tmp, "archive")
    print(f"\ntiering: topic {topic} tiered to delta:{archive}, hot retention 1 ms")
    client.create_topic(topic, queues=QUEUES, tier=f"delta:{archive}", local_retention_ms=1)
    produced = 0
    for r in range(20):
        for q in range(QUEUES):
            msgs = [Message(f'{{"event": {r}.{i}}}'.encode().ljust(512, b" "),
                            tags="old") for i in range(250)]
            produced += client.produce(topic, msgs, queue=q)[0].count
    print(f"  produced {produced:,} messages; archiving (Trigger.AvailableNow) ...")
    tier_topic(spark, endpoints, topic, progress=lambda line: print("  " + line))
    deadline = time.monotonic() + 60
    while any(o.earliest == 0 for o in client.offsets(topic)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for q in range(QUEUES):
        produced += client.produce(topic, [Message(b'{"event": "new"}', tags="new")] * 100,
                                   queue=q)[0].count
    print("  hot retention removed what was archived; 400 new messages are hot only\n")
    rmq(["--endpoints", endpoints, "topic", "describe", topic])
    df = spark.read.format("rocketmq").option("endpoints", endpoints).option("topic", topic).load()
    print('\nspark.read.format("rocketmq") over archive + hot log:')
    df.groupBy("tags").count().orderBy("tags").show()
    total = df.count()
    hot = sum(o.latest - o.earliest for o in client.offsets(topic))
    print(f"whole history: {total:,} read, {produced:,} produced "
          f"({total - hot:,} only in the Delta archive, {hot:,} in the hot log)")
    if total != produced:
        return 1
    return _compaction(spark, client, endpoints, tmp)


def _balances(client: Client, topic: str, updates: int) -> dict[bytes, bytes | None]:
    """Balance updates of 300 accounts, every 50th update closes one (a tombstone)."""
    import random
    import zlib
    rng = random.Random(11)
    latest: dict[bytes, bytes | None] = {}
    pending: dict[int, list[Message]] = {}
    for i in range(updates):
        key = f"account-{rng.randrange(300):04d}".encode()
        if i % 50 == 49:
            value = None
        else:
            # (no padding: `rmq get` prints the value as stored, trailing blanks and all)
            value = f'{{"balance": {rng.randrange(10_000)}, "update": {i}}}'.encode()
        latest[key] = value
        q = zlib.crc32(key) % QUEUES
        pending.setdefault(q, []).append(Message(value, key=key))
        if len(pending[q]) == 200:
            client.produce(topic, pending.pop(q), queue=q)
    for q, msgs in pending.items():
        client.produce(topic, msgs, queue=q)
    return latest


def _compaction(spark, client: Client, endpoints: str, tmp: str) -> int:
    from .cli.main import main as rmq
    from .compaction import compact_topic

    topic, table_path = "demo-balances", os.path.join(tmp, "balances")
    print(f"\ncompaction: topic {topic} (cleanup policy compact) into the Delta table {table_path}")
    client.create_topic(topic, queues=QUEUES, cleanup_policy="compact")
    updates = 12_000
    latest = _balances(client, topic, updates)
    live = {k: v for k, v in latest.items() if v is not None}
    print(f"  produced {updates:,} balance updates of {len(latest)} accounts "
          f"({len(latest) - len(live)} closed); compacting (Trigger.AvailableNow) ...")
    compact_topic(spark, endpoints, topic, table_path, progress=lambda line: print("  " + line))
    table = spark.read.format("delta").load(table_path)
    rows = {bytes(r.key): bytes(r.value) for r in table.select("key", "value").collect()}
    print(f'  spark.read.format("delta"): {len(rows)} rows, one per open account')
    table.selectExpr("cast(key as string) key", "cast(value as string) value", "queue", "offset") \
        .orderBy("key").show(3)
    # The job recorded its watermark: the nodes may now drop superseded records.
    deadline = time.monotonic() + 30
    hot = updates
    while time.monotonic() < deadline and hot >= updates // 2:
        time.sleep(1)
        hot = spark.read.format("rocketmq").option("endpoints", endpoints).option("topic", topic).load().count()
    print(f"  hot log after compaction: {hot:,} of {updates:,} records left, offsets unchanged "
          f"(latest per queue: {[o.latest for o in client.offsets(topic)]})")
    key = sorted(live)[0].decode()
    print(f"\n$ rmq get {topic} {key}")
    rmq(["--endpoints", endpoints, "get", topic, key])
    ok = rows == live and hot < updates
    print(f"\ncompacted table: {len(rows)} keys, {len(live)} expected"
          + ("" if ok else " - MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
