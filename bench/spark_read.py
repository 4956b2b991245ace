#!/usr/bin/env python
"""Spark read benchmark: format("rocketmq") against Parquet and the Arrow API ceiling.

One run measures every row on this machine and prints one table plus the
issue's targets::

    .venv/bin/python bench/spark_read.py                  # 100 B and 1 KiB, about 6 minutes
    .venv/bin/python bench/spark_read.py --quick          # smoke run, ~1 minute
    .venv/bin/python bench/spark_read.py --json bench/results/spark_read.json

For each message size the same messages are read three ways, each into
Spark's ``noop`` sink (every column materialized, nothing written):

1. ``spark.read.format("rocketmq")`` from a 3-node LocalCluster (topic with
   8 queues, so 8 tasks on ``local[2]``). Spark and the nodes share the host,
   so tasks take the short-circuit path (``localReads``, the default: the
   node says where the batches are, the task reads the segment file). The
   row below it reads the same with ``localReads=false``: every byte over
   the network, as from nodes on other hosts (the nodes' produce port; with
   plaintext the node sends the batches from the segment file, ``sendfile``).
2. ``spark.read.parquet`` of the same rows (all ten columns), written once.
3. An in-memory Python data source that yields ready-made Arrow batches of
   the same schema (one real fetched batch, repeated): what any Python data
   source can reach through Spark's API; the ceiling for (1).
4. Apache Kafka 4.4 (3 KRaft brokers on loopback, ``_kafka.py``) holding the
   same messages in a topic of 8 partitions, read with Spark's own Kafka
   source (``spark-sql-kafka-0-10`` 4.2.0) as shipped and with
   ``kafka.fetch.max.wait.ms=10`` (issue 24's "tuned"). ``--skip-kafka`` leaves
   it out.

With ``--secure`` a second cluster made by ``LocalCluster(secure=True)`` (TLS
on every port, ACLs on) holds the same messages, and the rocketmq reads run
against it too, as a principal with only ``consume`` on the topics, its bearer
token in the ``token`` option: ``TLS + token`` rows, in the same alternation.

Then end-to-end streaming latency: one message every 20 ms, produce call ->
visible in a ``foreachBatch`` function, p50/p99.

The reads of a size run in turn (one warm-up each, then ``--repeats``
rounds), so on a shared machine all see the same load. Rates are medians,
with the lowest and highest round; "vs Kafka tuned" compares medians, and
the targets compare each round with the same round's Kafka tuned read.
MB = 10^6 bytes of message values. Progress goes to stderr, the table to stdout.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

from _spark import compile_sources, local_session, setup  # noqa: E402  (next to this file)

log = logging.getLogger("bench.spark_read")
QUEUES = 8
PRODUCE_BATCH = 5000
TARGET_VS_PARQUET = 0.50
TARGET_VS_CEILING = 0.70
TARGET_SECURE = 0.80


def payloads(size: int) -> list[bytes]:
    """The random ``size``-byte values every system gets (2 batches' worth, reused)."""
    rng = np.random.default_rng(size)
    return [bytes(v) for v in rng.integers(0, 256, (PRODUCE_BATCH * 2, size), dtype=np.uint8)]


def produce(client, topic: str, count: int, size: int) -> None:
    """``count`` random ``size``-byte messages over QUEUES queues, 8 producer threads."""
    pool = payloads(size)
    done, lock, t0 = [0], threading.Lock(), time.monotonic()

    def work(q: int) -> None:
        mine = count // QUEUES + (1 if q < count % QUEUES else 0)
        for start in range(0, mine, PRODUCE_BATCH):
            n = min(PRODUCE_BATCH, mine - start)
            k = (start // PRODUCE_BATCH) % 2 * PRODUCE_BATCH
            client.produce(topic, pool[k:k + n], queue=q)
            with lock:
                done[0] += n
                if done[0] // 100_000 != (done[0] - n) // 100_000:
                    log.info("  produce %-6s %10s msgs  %8.0f msgs/s", topic, f"{done[0]:,}",
                             done[0] / (time.monotonic() - t0))

    threads = [threading.Thread(target=work, args=(q,)) for q in range(QUEUES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def fill_kafka(kafka, topic: str, count: int, size: int) -> None:
    """The same messages into Kafka: ``count`` values of ``payloads(size)``, 8 partitions."""
    from _kafka_produce import kafka_fill
    kafka.create_topic(topic, QUEUES)
    pool = payloads(size)
    t0 = time.monotonic()
    batches = (pool[:min(PRODUCE_BATCH * 2, count - i)] for i in range(0, count, PRODUCE_BATCH * 2))
    sent = kafka_fill(kafka.bootstrap, topic, batches, QUEUES)
    log.info("  produced %s msgs into Kafka in %.0f s", f"{sent:,}", time.monotonic() - t0)


def alternate(runs: dict, rows: int, repeats: int) -> dict[str, list[float]]:
    """Rows/s of every round per label: one warm-up each, then ``repeats`` rounds of every run
    in turn, so on a shared machine every row sees the same load. Each timed run
    starts after an (untimed) ``os.sync()``: the page-cache writeback of the run
    before it (hundreds of MB) is not charged to the next one."""
    for run in runs.values():
        run()
    rates: dict[str, list[float]] = {label: [] for label in runs}
    for i in range(repeats):
        for label, run in runs.items():
            os.sync()
            t = time.perf_counter()
            run()
            rates[label].append(rows / (time.perf_counter() - t))
            log.info("  %-28s run %d/%d %12s rows/s", label, i + 1, repeats,
                     f"{rates[label][-1]:,.0f}")
    return rates


def medians(rounds: dict[str, list[float]]) -> dict:
    """``alternate``'s rates -> the median under each label, and every round under
    ``"rounds"`` (tables show the spread; ``round_ratios``)."""
    return {**{label: statistics.median(r) for label, r in rounds.items()}, "rounds": rounds}


def round_ratios(part: dict, key: str, peer: str) -> tuple[float, float]:
    """Lowest and highest ratio of ``key`` to ``peer`` measured in the same round."""
    ratios = [a / b for a, b in zip(part["rounds"][key], part["rounds"][peer])]
    return min(ratios), max(ratios)


def arrow_ceiling_source(template_ipc: bytes):
    """A DataSource class yielding ``template`` batches: no I/O, no decoding."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from rmq_spark.client.arrow import SPARK_DDL

    class MemReader(DataSourceReader):
        def __init__(self, parts):
            self.parts = parts

        def partitions(self):
            return [InputPartition(n) for n in self.parts]

        def read(self, partition):
            import pyarrow as pa
            template = pa.ipc.open_stream(template_ipc).read_next_batch()
            left = partition.value
            while left > 0:
                batch = template.slice(0, min(left, template.num_rows))
                left -= batch.num_rows
                yield batch

    class ArrowMemory(DataSource):
        @classmethod
        def name(cls):
            return "bench_arrow_memory"

        def schema(self):
            return SPARK_DDL

        def reader(self, schema):
            return MemReader(json.loads(self.options["parts"]))

    return ArrowMemory


def template_batch(client, topic: str) -> bytes:
    import pyarrow as pa
    rb, *_ = client.fetch_arrow(topic, 0, 0, max_bytes=8 << 20)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rb.schema) as w:
        w.write_batch(rb)
    return sink.getvalue().to_pybytes()


def measure_size(spark, client, endpoints: str, size: int, count: int, args, root: str,
                 secure=None, kafka=None) -> dict:
    """``secure``: (endpoints, admin client, reader options) of the secured cluster;
    ``kafka``: the Kafka peer (``_kafka.KafkaCluster``) or None."""
    topic = f"read-{size}b"
    client.create_topic(topic, queues=QUEUES)
    log.info("producing %s messages of %d B into %s", f"{count:,}", size, topic)
    produce(client, topic, count, size)
    rows = sum(o.latest for o in client.offsets(topic))
    reader = (spark.read.format("rocketmq").option("endpoints", endpoints).option("topic", topic)
              .option("maxBytesPerFetch", str(args.fetch_bytes)))
    df, network = reader.load(), reader.option("localReads", "false").load()
    extra = {}
    if secure is not None:
        sec_endpoints, admin, options = secure
        admin.create_topic(topic, queues=QUEUES)
        log.info("producing the same into the secured cluster")
        produce(admin, topic, count, size)
        assert sum(o.latest for o in admin.offsets(topic)) == rows
        sec = (spark.read.format("rocketmq").option("endpoints", sec_endpoints).option("topic", topic)
               .option("maxBytesPerFetch", str(args.fetch_bytes)).options(**options))
        tls_df, tls_network = sec.load(), sec.option("localReads", "false").load()
        extra = {"tls": lambda: noop(tls_df), "tls_network": lambda: noop(tls_network)}
    if kafka is not None:
        log.info("producing the same into Kafka")
        fill_kafka(kafka, topic, count, size)
        kr = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap)
              .option("subscribe", topic))
        shipped, tuned = kr.load(), kr.option("kafka.fetch.max.wait.ms", "10").load()
        assert shipped.count() == rows, "Kafka holds another number of messages"
        extra.update(kafka=lambda: noop(shipped), kafka_tuned=lambda: noop(tuned))
    noop = lambda d: d.write.format("noop").mode("overwrite").save()  # noqa: E731
    path = os.path.join(root, f"parquet-{size}")
    network.write.parquet(path)
    parts = [o.latest - o.earliest for o in client.offsets(topic)]
    spark.dataSource.register(arrow_ceiling_source(template_batch(client, topic)))
    mem = spark.read.format("bench_arrow_memory").option("parts", json.dumps(parts)).load()
    log.info("reading %s rows of %d B: rocketmq, rocketmq over the network, %sparquet, ceiling "
             "in turn", f"{rows:,}", size, "Kafka, " if kafka is not None else "")
    rounds = alternate({"rocketmq": lambda: noop(df), "network": lambda: noop(network), **extra,
                        "parquet": lambda: noop(spark.read.parquet(path)),
                        "ceiling": lambda: noop(mem)}, rows, args.repeats)
    return {"size": size, "rows": rows, **medians(rounds),
            **query_cost(spark, reader, noop, size, args)}


def query_cost(spark, reader, noop, size: int, args) -> dict[str, float]:
    """Seconds a query costs beyond its rows: one row per queue of 8 (rocketmq packs
    them into one task, ``packRecordsPerTask``), against the ceiling source's 8
    tasks, alternated, medians."""
    ends = json.dumps({f"read-{size}b": {str(q): 1 for q in range(QUEUES)}})
    tiny = reader.option("endingOffsets", ends).load()
    mem = (spark.read.format("bench_arrow_memory").option("parts", json.dumps([1] * QUEUES))
           .load())
    runs = {"rocketmq": lambda: noop(tiny), "ceiling": lambda: noop(mem)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for i in range(args.repeats * 3 + 1):
        for key, run in runs.items():
            t = time.perf_counter()
            run()
            if i:                                   # the first round warms up
                times[key].append(time.perf_counter() - t)
    out = {f"query_s_{k}": statistics.median(v) for k, v in times.items()}
    log.info("  one row per queue: rocketmq %.0f ms, ceiling %.0f ms a query",
             out["query_s_rocketmq"] * 1e3, out["query_s_ceiling"] * 1e3)
    return out


def measure_latency(spark, client, endpoints: str, seconds: float, root: str) -> dict:
    """Produce one message per 20 ms; latency = foreachBatch time - produce time."""
    topic = "latency"
    client.create_topic(topic, queues=4)
    lat: list[float] = []

    def sink(df, _):
        now = time.time()
        born = df.select("born_timestamp").collect()
        lat.extend(now - r.born_timestamp.timestamp() for r in born)

    q = (spark.readStream.format("rocketmq").option("endpoints", endpoints).option("topic", topic)
         .load().writeStream.foreachBatch(sink)
         .option("checkpointLocation", os.path.join(root, "latency-ck")).start())
    try:
        time.sleep(5)                               # first micro-batches start the workers
        deadline, i = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            client.produce(topic, [f"{i}".encode()], queue=i % 4)
            i += 1
            time.sleep(0.02)
            if i % 100 == 0:
                log.info("  latency: %d produced, %d seen", i, len(lat))
        wait = time.monotonic() + 30
        while len(lat) < i and time.monotonic() < wait:
            time.sleep(0.1)
    finally:
        q.stop()
    ordered = sorted(lat)
    pick = lambda p: ordered[max(0, int(np.ceil(p * len(ordered))) - 1)] * 1e3  # noqa: E731
    return {"messages": len(lat), "p50_ms": pick(0.5), "p99_ms": pick(0.99)} if lat else {}


def render(results: list[dict], latency: dict) -> str:
    head = (f"{'rows':<44}{'msgs/s':>12}{'rounds min-max':>20}{'MB/s':>9}{'vs parquet':>12}"
            f"{'vs ceiling':>12}{'vs Kafka tuned':>16}")
    lines = [head, "-" * len(head)]
    for r in results:
        for key, name in (("rocketmq", "rocketmq (3-node cluster)"),
                          ("network", "  the same, localReads=false"),
                          ("tls", "  TLS + token"),
                          ("tls_network", "  TLS + token, localReads=false"),
                          ("kafka", "Kafka 3 brokers + Spark's Kafka source"),
                          ("kafka_tuned", "  the same, fetch.max.wait.ms=10"),
                          ("parquet", "spark.read.parquet"),
                          ("ceiling", "Arrow in-memory data source")):
            if key not in r:
                continue
            rate, label = r[key], f"{name}, {r['size']} B"
            spread = f"{min(r['rounds'][key]):,.0f}-{max(r['rounds'][key]):,.0f}"
            vs_kafka = f"{rate / r['kafka_tuned']:>15.2f}x" if "kafka_tuned" in r else f"{'':>16}"
            lines.append(f"{label:<44}{rate:>12,.0f}{spread:>20}{rate * r['size'] / 1e6:>9.1f}"
                         f"{rate / r['parquet']:>11.0%} {rate / r['ceiling']:>11.0%}{vs_kafka}")
    lines.append("\nper query, beyond its rows (a read of one row per queue of 8; rocketmq packs "
                 "the 8 small ranges into one task, the ceiling source runs 8): " + ", ".join(
        f"{r['size']} B rocketmq {r['query_s_rocketmq'] * 1e3:.0f} ms, ceiling "
        f"{r['query_s_ceiling'] * 1e3:.0f} ms" for r in results))
    if latency:
        lines.append(f"\nstreaming latency, produce -> foreachBatch: "
                     f"p50 {latency['p50_ms']:.0f} ms, p99 {latency['p99_ms']:.0f} ms "
                     f"({latency['messages']} messages)")
    lines.append("")
    for r in results:
        for key, target in (("parquet", TARGET_VS_PARQUET), ("ceiling", TARGET_VS_CEILING)):
            ratio = r["rocketmq"] / r[key]
            lines.append(f"target: {r['size']} B read >= {target:.0%} of {key}: {ratio:.0%} "
                         f"{'MET' if ratio >= target else 'NOT MET'}")
        if "kafka_tuned" in r:
            for key in ("rocketmq", "network"):
                worst = round_ratios(r, key, "kafka_tuned")[0]
                lines.append(f"target: {r['size']} B read ({key} path) ahead of Kafka tuned in "
                             f"every round: lowest round's ratio {worst:.2f} "
                             f"{'MET' if worst >= 1 else 'NOT MET'}")
        for key, plain in (("tls", "rocketmq"), ("tls_network", "network")):
            if key in r:
                ratio = r[key] / r[plain]
                lines.append(f"target: {r['size']} B read with TLS + token ({plain} path) >= "
                             f"{TARGET_SECURE:.0%} of plaintext: {ratio:.0%} "
                             f"{'MET' if ratio >= TARGET_SECURE else 'NOT MET'}")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small-rows", type=int, default=4_000_000, help="100 B messages")
    p.add_argument("--large-rows", type=int, default=1_000_000, help="1 KiB messages")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--latency-seconds", type=float, default=20)
    p.add_argument("--fetch-bytes", type=int, default=8 << 20, help="maxBytesPerFetch")
    p.add_argument("--quick", action="store_true", help="small data, one repeat")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--secure", action="store_true",
                   help="also read from a cluster with TLS and ACLs, with a token")
    p.add_argument("--skip-kafka", action="store_true", help="no Kafka peer rows")
    a = p.parse_args(argv)
    if a.quick:
        a.small_rows, a.large_rows, a.repeats, a.latency_seconds = 200_000, 50_000, 1, 5
    return a


def main(argv=None) -> int:
    setup()
    args = parse_args(argv)
    compile_sources()
    from rmq_spark.client import Client, TlsFiles
    from storage_service.local import LocalCluster

    with tempfile.TemporaryDirectory(prefix="rmq-bench-") as root, contextlib.ExitStack() as stack:
        kafka, jars = None, []
        if not args.skip_kafka:
            from _kafka import KafkaCluster, ensure_confluent_kafka, spark_kafka_jars
            ensure_confluent_kafka()
            jars = spark_kafka_jars()
            log.info("starting Kafka (3 brokers, KRaft)")
            kafka = stack.enter_context(KafkaCluster(os.path.join(root, "kafka")))
        log.info("starting LocalCluster (3 nodes, 4 groups) and Spark local[2]")
        secure = None
        if args.secure:
            log.info("starting a secured LocalCluster (TLS, ACLs; 3 nodes, 4 groups)")
            sc = stack.enter_context(LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "rmq-secure"),
                                                  secure=True))
            admin = stack.enter_context(Client(sc.endpoints, tls=TlsFiles(sc.tls.ca), token=sc.token))
            token = admin.create_principal("bench-reader")["token"]
            admin.change_acls(True, [dict(principal="bench-reader", resource_type="topic", name="read-",
                                          prefix=True, operations=["consume"])])
            secure = (sc.endpoints, admin, {"tlsCaFile": sc.tls.ca, "token": token})
        with LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "rmq")) as cluster, \
                Client(cluster.endpoints) as client:
            spark = local_session("bench-spark-read", jars)
            try:
                results = [measure_size(spark, client, cluster.endpoints, size, n, args, root, secure,
                                        kafka)
                           for size, n in ((100, args.small_rows), (1024, args.large_rows))]
                log.info("measuring streaming latency for %.0f s", args.latency_seconds)
                latency = measure_latency(spark, client, cluster.endpoints,
                                          args.latency_seconds, root)
            finally:
                spark.stop()
    print(render(results, latency))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"reads": results, "latency": latency, "args": vars(args)}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
