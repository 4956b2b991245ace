#!/usr/bin/env python
"""Streaming latency: a message produced every 10 ms -> in the sink's hands.

rmq-spark (``format("rocketmq")`` on a 3-node LocalCluster, ``--fsync
always``) against Apache Kafka 4.4 (3 KRaft brokers, ``bench/_kafka.py``)
with Spark's own Kafka source, as shipped and tuned (``kafka.fetch.max.wait.ms
=10``, issue 24). Every query runs with the default trigger (a micro-batch as
soon as the last one ends) into a ``foreachBatch`` function on the driver.
A message's latency is the time its row was in that function's hands (after
``collect``) minus the time its produce call started (acks from all in-sync replicas; rmq: a
majority, fsynced; ``Client.produce_batches``, the produce port). The systems take turns ``--rounds`` times, each round on
fresh clusters; the table shows the median of each round's p50 and p99.

Real-time mode (``trigger(realTime="5 seconds")``, Spark 4.2; issue 41) rows:
``format("rocketmq-rt")`` (the JVM source) and Spark's Kafka source, each into
``LatencyProbe`` (jars/src: a JVM ``ForeachWriter``; real-time mode takes no
``foreachBatch``, and a Python ``foreach`` gets its rows only as the batch ends),
which notes the wall-clock time each row reached it; latency is that minus the
wall-clock time its produce call started. A real-time query holds a task slot
per partition for the whole batch, so the session runs ``local[4]`` (4 queues)::

    .venv/bin/python bench/latency.py                    # 30 s a system, 3 rounds
    .venv/bin/python bench/latency.py --seconds 10 --rounds 1
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import threading
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(BENCH_DIR))

log = logging.getLogger("bench.latency")
RMQ = "rmq-spark 3-node (format rocketmq)"
KAFKA_SHIPPED = "Kafka 4.4 3 brokers + Spark's Kafka source (shipped)"
KAFKA_TUNED = "Kafka 4.4 3 brokers + Spark's Kafka source (fetch.max.wait.ms=10)"
RMQ_RT = "rmq-spark 3-node (format rocketmq-rt, real-time mode)"
RMQ_RT_NOFSYNC = "rmq-spark 3-node --fsync none (Kafka's durability), format rocketmq-rt, real-time mode"
KAFKA_RT = "Kafka 4.4 3 brokers + Spark's Kafka source (real-time mode)"
ROWS = (RMQ, KAFKA_SHIPPED, KAFKA_TUNED, RMQ_RT, RMQ_RT_NOFSYNC, KAFKA_RT)
RT_BATCH = "5 seconds"      # spark.sql.streaming.realTimeMode.minBatchDuration's default
# Spark's StreamingQueryProgress.durationMs parts of a micro-batch, in the order they run.
PHASES = ("latestOffset", "walCommit", "queryPlanning", "addBatch", "commitOffsets",
          "triggerExecution")
QUEUES = 4


def session():
    from _kafka import spark_kafka_jars
    from rmq_spark.spark import delta_jars, session_builder
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (session_builder("rmq-bench-latency", master=f"local[{QUEUES}]")
            .config("spark.jars", ",".join(delta_jars() + spark_kafka_jars()))
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2").getOrCreate())


class Clock:
    """Produce times by message number, and the latencies the sink saw."""

    def __init__(self):
        self.sent: dict[int, float] = {}
        self.seen: list[float] = []
        self.warm = threading.Event()
        self.lock = threading.Lock()

    def sink(self, df, _batch_id) -> None:
        values = [bytes(r.value) for r in df.select("value").collect()]
        now = time.perf_counter()                   # the rows are in the driver's hands
        with self.lock:
            self.seen += [now - self.sent[int(v)] for v in values if int(v) in self.sent]
        if any(int(v) < 0 for v in values):
            self.warm.set()


def every_10_ms(seconds: float, produce, sent: dict, clock) -> int:
    """``produce(i)`` for i = 0, 1, ... every 10 ms for ``seconds``, noting ``clock()`` as
    each call starts in ``sent[i]``; returns how many were sent."""
    i, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        pause = start + i * 0.010 - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        sent[i] = clock()
        produce(i)
        i += 1
    return i


def run(spark, stream, produce, seconds: float, root: str, name: str) -> dict:
    """Start ``stream`` into the clock's sink, produce every 10 ms for ``seconds``."""
    clock = Clock()
    q = (stream.writeStream.foreachBatch(clock.sink)
         .option("checkpointLocation", os.path.join(root, f"ck-{ROWS.index(name)}")).start())
    try:
        # Warm up: the first batch with rows starts Spark's workers (for a Python
        # source its Python worker, about a second); latency is measured after it.
        # (The query picks its "latest" start in its first trigger: send until one arrives.)
        w, give_up = 0, time.monotonic() + 60
        while not clock.warm.wait(0.2):
            if time.monotonic() > give_up:
                raise RuntimeError(f"{name}: no warm-up message arrived within 60 s")
            w += 1
            produce(-w)
        time.sleep(2)
        first_batch = q.lastProgress["batchId"] + 1 if q.lastProgress else 0
        i = every_10_ms(seconds, produce, clock.sent, time.perf_counter)
        wait = time.monotonic() + 30
        while len(clock.seen) < i and time.monotonic() < wait:
            time.sleep(0.1)
    finally:
        q.stop()
    lat = sorted(clock.seen)
    if not lat:
        return {"name": name, "messages": 0}
    measured = [p["durationMs"] for p in q.recentProgress
                if p["batchId"] >= first_batch and p["numInputRows"] > 0]
    phases = {k: statistics.median(d.get(k, 0) for d in measured) for k in PHASES} if measured else {}
    pick = lambda p: lat[max(0, int(p * len(lat) + 0.999999) - 1)] * 1e3  # noqa: E731
    return {"name": name, "messages": len(lat), "sent": i, "p50_ms": pick(0.5), "p99_ms": pick(0.99),
            "phases": phases}


def run_rt(spark, stream, produce, seconds: float, root: str, name: str) -> dict:
    """``stream`` in real-time mode into the JVM ``LatencyProbe``; produce every 10 ms."""
    import glob
    folder = os.path.join(root, f"probe-{ROWS.index(name)}")
    os.makedirs(folder)
    w = (stream.writeStream.outputMode("update").trigger(realTime=RT_BATCH)
         .option("checkpointLocation", os.path.join(root, f"ck-{ROWS.index(name)}")))
    w._jwrite = w._jwrite.foreach(spark._jvm.io.rmqspark.spark.LatencyProbe(folder))
    q = w.start()

    def seen() -> dict[int, float]:
        out: dict[int, float] = {}
        for path in glob.glob(os.path.join(folder, "*.txt")):
            with open(path) as f:
                for line in f:
                    v, _, us = line.strip().partition(" ")
                    if us:
                        out.setdefault(int(v), int(us) / 1e6)
        return out
    sent: dict[int, float] = {}
    try:
        w_, give_up = 0, time.monotonic() + 90
        while not any(v < 0 for v in seen()):
            if q.exception() is not None:
                raise RuntimeError(f"{name}: the query failed: {q.exception()}")
            if time.monotonic() > give_up:
                raise RuntimeError(f"{name}: no warm-up message arrived within 90 s")
            w_ += 1
            produce(-w_)
            time.sleep(0.2)
        time.sleep(2)
        i = every_10_ms(seconds, produce, sent, time.time)
        wait = time.monotonic() + 30
        while len([v for v in seen() if v >= 0]) < i and time.monotonic() < wait:
            time.sleep(0.2)
    finally:
        q.stop()
    got = seen()
    lat = sorted(got[v] - sent[v] for v in sent if v in got)
    if not lat:
        return {"name": name, "messages": 0}
    pick = lambda p: lat[max(0, int(p * len(lat) + 0.999999) - 1)] * 1e3  # noqa: E731
    return {"name": name, "messages": len(lat), "sent": i, "p50_ms": pick(0.5), "p99_ms": pick(0.99),
            "phases": {}}


def measure_rmq(spark, root: str, seconds: float) -> list[dict]:
    from rmq_spark.client import Client
    from storage_service.local import LocalCluster
    with LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "rmq")) as cluster, \
            Client(cluster.endpoints) as client:
        client.create_topic("latency", queues=QUEUES)
        stream = (spark.readStream.format("rocketmq").option("endpoints", cluster.endpoints)
                  .option("topic", "latency").load())
        # produce_batches: the client's single-call path over the produce port (Kafka's
        # row uses its C producer with linger.ms=0); acknowledged once a majority fsynced
        produce = lambda i: client.produce_batches([("latency", i % QUEUES, [str(i).encode()])])  # noqa: E731
        out = [run(spark, stream, produce, seconds, root, RMQ)]
        rt = (spark.readStream.format("rocketmq-rt").option("endpoints", cluster.endpoints)
              .option("topic", "latency").load())
        out.append(run_rt(spark, rt, produce, seconds, root, RMQ_RT))
    # Kafka's durability (acknowledged in a majority's page cache, no fsync), real-time mode
    with LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "rmq-nofsync"), fsync="none") as cluster, \
            Client(cluster.endpoints) as client:
        client.create_topic("latency", queues=QUEUES)
        produce = lambda i: client.produce_batches([("latency", i % QUEUES, [str(i).encode()])])  # noqa: E731
        rt = (spark.readStream.format("rocketmq-rt").option("endpoints", cluster.endpoints)
              .option("topic", "latency").load())
        out.append(run_rt(spark, rt, produce, seconds, root, RMQ_RT_NOFSYNC))
    return out


def measure_kafka(spark, root: str, seconds: float) -> list[dict]:
    from _kafka import KafkaCluster
    from confluent_kafka import Producer
    out = []
    with KafkaCluster(os.path.join(root, "kafka")) as k:
        k.create_topic("latency", QUEUES)
        p = Producer({"bootstrap.servers": k.bootstrap, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 0})

        def produce(i: int) -> None:
            p.produce("latency", str(i).encode(), partition=i % QUEUES)
            p.poll(0)
        for name, extra in ((KAFKA_SHIPPED, {}), (KAFKA_TUNED, {"kafka.fetch.max.wait.ms": "10"})):
            reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", k.bootstrap)
                      .option("subscribe", "latency").option("startingOffsets", "latest"))
            for key, value in extra.items():
                reader = reader.option(key, value)
            out.append(run(spark, reader.load(), produce, seconds, root, name))
        reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", k.bootstrap)
                  .option("subscribe", "latency").option("startingOffsets", "latest"))
        out.append(run_rt(spark, reader.load(), produce, seconds, root, KAFKA_RT))
        p.flush(30)
    return out


def main(argv=None) -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--seconds", type=float, default=30.0, help="producing time per system (default 30)")
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--skip-kafka", action="store_true", help="measure rmq-spark only")
    args = a.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)     # (a line per foreachBatch callback)
    from _kafka import ensure_confluent_kafka
    ensure_confluent_kafka()
    spark = session()
    rounds: list[dict[str, dict]] = []
    try:
        for r in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="rmq-latency-") as root:
                order = (measure_rmq, measure_kafka) if r % 2 == 0 else (measure_kafka, measure_rmq)
                order = [m for m in order if not (args.skip_kafka and m is measure_kafka)]
                got = {}
                for measure in order:
                    log.info("round %d: %s", r + 1, measure.__name__)
                    for row in measure(spark, root, args.seconds):
                        got[row["name"]] = row
                rounds.append(got)
    finally:
        spark.stop()
    print(f"\nstreaming latency, produce -> sink (foreachBatch with the default trigger; LatencyProbe "
          f"in real-time mode, {RT_BATCH} batches), a message every 10 ms; "
          f"{args.seconds:g} s a system, {args.rounds} round(s), median of the rounds' figures\n")
    print("| system | p50 ms | p99 ms | rounds' p50 | rounds' p99 | messages seen / sent (per round) |\n"
          "|---|---:|---:|---|---|---|")
    med = {}
    for name in ROWS:
        rows = [rd[name] for rd in rounds if rd.get(name, {}).get("messages")]
        if not rows:
            print(f"| {name} | n/a | n/a | |")
            continue
        med[name] = (statistics.median(x["p50_ms"] for x in rows), statistics.median(x["p99_ms"] for x in rows))
        counts = ", ".join(f"{x['messages']}/{x['sent']}" for x in rows)
        each = [", ".join(f"{x[k]:.0f}" for x in rows) for k in ("p50_ms", "p99_ms")]
        print(f"| {name} | {med[name][0]:.0f} | {med[name][1]:.0f} | {each[0]} | {each[1]} | {counts} |")
    print("\nwhere a micro-batch's time goes: Spark's durationMs per phase, median over the "
          "measured batches with rows, median of the rounds (ms)\n")
    print("| system | " + " | ".join(PHASES) + " |\n|---|" + "---:|" * len(PHASES))
    for name in ROWS:
        rows = [rd[name]["phases"] for rd in rounds if rd.get(name, {}).get("phases")]
        if rows:
            cells = " | ".join(f"{statistics.median(x[k] for x in rows):.0f}" for k in PHASES)
            print(f"| {name} | {cells} |")
    if RMQ in med and KAFKA_TUNED in med:
        print(f"\nrmq / Kafka tuned: p50 {med[RMQ][0] / med[KAFKA_TUNED][0]:.2f}, "
              f"p99 {med[RMQ][1] / med[KAFKA_TUNED][1]:.2f} (target: <= 1.00 both)")
    for name in (RMQ_RT, RMQ_RT_NOFSYNC):
        if name in med and KAFKA_RT in med:
            print(f"{name} / Kafka real-time: p50 {med[name][0] / med[KAFKA_RT][0]:.2f}, "
                  f"p99 {med[name][1] / med[KAFKA_RT][1]:.2f} (target: <= 1.00 both)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
