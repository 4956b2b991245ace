#!/usr/bin/env python
"""Tiering benchmark: the tiering job against a plain Spark copy, archive reads against Delta.

One run measures every row on this machine and prints one table plus the
issue's targets::

    .venv/bin/python bench/tiering.py                     # 400k x 1 KiB, 10-20 minutes
    .venv/bin/python bench/tiering.py --quick             # smoke run, a few minutes
    .venv/bin/python bench/tiering.py --json bench/results/tiering.json
    .venv/bin/python bench/tiering.py --store s3          # archives on a local S3 server

``--store local`` (default) writes archives to a local disk; ``--store s3``
to an S3-compatible server on loopback (moto's, ``tests/s3server.py``) through
S3A and pyarrow, both rows and their peers, and adds the S3 requests each
run made (counted from the server's access log): per tiering micro-batch,
and per full-history read against the direct Delta read of the same table.

1. Tiering throughput. A 3-node LocalCluster; ``repeats + 1`` topics of 8
   queues, each tiered to its own new Delta archive and filled with the same
   ``--rows`` random ``--size``-byte messages before any timing (the archive
   watermark only moves forward, so every run needs a topic of its own).
   Timed: ``rmq_spark.tiering.tier_topic(trigger="available-now")`` with a new
   checkpoint. Peer: the same rows staged once as Parquet (untimed), then
   ``spark.read.parquet`` -> ``archive_frame`` -> Delta write partitioned by
   (topic, date) into a new path. Target: tiering >= 60% of the copy. The
   table also shows the same runs counted by their micro-batch time alone
   (Spark's ``triggerExecution``) and the seconds a run spends outside it.
2. Full-history read. A second LocalCluster with 256 KiB segments and a 1 s
   retention pass; a topic with ``local_retention_ms=1`` is tiered, then the
   benchmark waits until every queue's hot log starts above offset 0. Timed,
   into the ``noop`` sink: ``spark.read.format("rocketmq")`` of the topic
   against ``spark.read.format("delta")`` of the archive (same rows, all
   columns). Target: rocketmq >= 80% of the direct Delta read.

Runs alternate between a row and its peer (one warm-up each, then
``--repeats`` rounds), so on a shared machine both see the same load; rates
are medians. MB = 10^6 bytes of message values. SparkSession:
``rmq_spark.spark.session_builder(master="local[2]")``. Progress goes to
stderr, the table to stdout; ``--plot`` saves a bar chart.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time

# spark_read lives next to this file; importing it also puts the checkout on sys.path.
from spark_read import (BENCH_DIR, QUEUES, alternate, compile_sources, medians, produce,
                        round_ratios)

log = logging.getLogger("bench.tiering")
TARGET_TIERING = 0.80       # issue 24 (0.60 before)
TARGET_HISTORY = 0.80
HOT_RETENTION_MS = 7 * 86_400_000      # part 1: the hot log keeps everything
HISTORY_CLUSTER_ARGS = ["--segment-bytes", str(256 << 10), "--retention-interval", "1"]
# A segment rolls between appends only, and each produce call appends one batch per queue:
# the history topic is produced in rounds so retention has sealed segments to drop.
HISTORY_ROUNDS = 10
# (result key, label, peer key); part 1 rows first, then part 2
ROWS = (("tiering", "tier_topic, available-now", "copy"),
        ("tiering_batches", "  its micro-batches alone", "copy"),
        ("copy", "plain copy: parquet -> Delta", None),
        ("rocketmq", 'full history, format("rocketmq")', "delta"),
        ("delta", 'archive alone, format("delta")', None))
PART1 = ("tiering", "tiering_batches", "copy")
TARGETS = {"tiering": TARGET_TIERING, "rocketmq": TARGET_HISTORY}


def check_produced(client, topic: str, rows: int) -> int:
    got = sum(o.latest for o in client.offsets(topic))
    if got != rows:
        raise RuntimeError(f"{topic} holds {got:,} messages, {rows:,} were produced")
    return got


def delta_rows(spark, path: str) -> int:
    return spark.read.format("delta").load(path).count()


class Store:
    """Where archives go: a local folder, or a bucket on an S3 server this run starts."""

    def __init__(self, kind: str, local_root: str):
        self.kind, self.server = kind, None
        self.root = local_root
        if kind == "s3":
            from tests.s3server import S3Server
            self.server = S3Server.start(os.path.join(local_root, "s3"))
            self.server.export()              # before Spark starts: its JVM inherits it
            self.server.create_bucket("bench")
            self.root = "s3a://bench/run"

    def path(self, name: str) -> str:
        from rmq_spark import fs
        return fs.join(self.root, name)

    def requests(self) -> int:
        return self.server.requests() if self.server else 0

    def stop(self) -> None:
        if self.server:
            self.server.stop()


def fill_topics(client, store: "Store", args) -> list[str]:
    """``repeats + 1`` tiered topics, each with the same ``--rows`` messages (untimed)."""
    topics = [f"tier-{i}" for i in range(args.repeats + 1)]
    for t in topics:
        client.create_topic(t, queues=QUEUES, tier=f"delta:{store.path('ar-' + t)}",
                            local_retention_ms=HOT_RETENTION_MS)
        produce(client, t, args.rows, args.size)
        check_produced(client, t, args.rows)
    return topics


def batch_seconds(query) -> float:
    """Time the query spent in its micro-batches (Spark's ``triggerExecution``)."""
    return sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress) / 1e3


def measure_tiering(spark, root: str, store: Store, args) -> dict:
    """Part 1: tier_topic against a Parquet -> Delta copy of the same rows."""
    from rmq_spark.archive import layout
    from rmq_spark.client import Client
    from rmq_spark.tiering import tier_topic
    from storage_service.local import LocalCluster

    log.info("part 1: LocalCluster (3 nodes, 4 groups), %d topics of %s x %d B, archives in %s",
             args.repeats + 1, f"{args.rows:,}", args.size, store.root)
    with LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "rmq-tier")) as cluster, \
            Client(cluster.endpoints) as client:
        ep, topics = cluster.endpoints, fill_topics(client, store, args)
        staging = os.path.join(root, "staging")          # the copy's source: a local disk
        log.info("staging %s rows of %s as Parquet (untimed)", f"{args.rows:,}", topics[0])
        spark.read.format("rocketmq").option("endpoints", ep).option("topic", topics[0]) \
            .load().write.parquet(staging)
        pending, copies, split = list(topics), [], []     # split: (total s, in batches s)
        requests = {"tiering": [], "copy": []}            # (requests, micro-batches) a run

        def tier() -> None:
            t, t0, r0 = pending.pop(0), time.perf_counter(), store.requests()
            ck = os.path.join(root, "ck-" + t) if args.local_checkpoint else store.path("ck-" + t)
            q = tier_topic(spark, ep, t, trigger="available-now", checkpoint=ck, progress=log.info)
            split.append((time.perf_counter() - t0, batch_seconds(q)))
            requests["tiering"].append((store.requests() - r0, len(q.recentProgress)))

        def copy() -> None:
            copies.append(store.path(f"copy-{len(copies)}"))
            r0 = store.requests()
            (layout.archive_frame(spark.read.parquet(staging))
             .write.format("delta").partitionBy(*layout.PARTITION_COLUMNS).save(copies[-1]))
            requests["copy"].append((store.requests() - r0, 1))

        out = medians(alternate({"tiering": tier, "copy": copy}, args.rows, args.repeats))
        for path in [store.path("ar-" + t) for t in topics] + copies:
            if (got := delta_rows(spark, path)) != args.rows:
                raise RuntimeError(f"{path} holds {got:,} rows, expected {args.rows:,}")
    timed = split[1:]                                     # [0] is the warm-up
    batches = [args.rows / b for _, b in timed]
    out["rounds"]["tiering_batches"] = batches
    return {"rows": args.rows, **out, "tiering_batches": statistics.median(batches),
            "tiering_outside_batches_s": statistics.median(t - b for t, b in timed),
            "requests": {k: {"per_run": statistics.median(r for r, _ in v[1:] or v),
                             "batches": statistics.median(n for _, n in v[1:] or v)}
                         for k, v in requests.items()}}


def wait_trimmed(client, topic: str, timeout: float = 120.0) -> list:
    """Until hot retention has dropped the first segment of every queue."""
    deadline = time.monotonic() + timeout
    while (offs := client.offsets(topic)) and any(o.earliest == 0 for o in offs):
        if time.monotonic() > deadline:
            raise RuntimeError(f"hot retention did not trim {topic} within {timeout:.0f} s: "
                               f"{[(o.queue, o.earliest) for o in offs]}")
        time.sleep(0.5)
    return offs


def measure_history(spark, root: str, store: Store, args) -> dict:
    """Part 2: format("rocketmq") over a trimmed tiered topic against the archive alone."""
    from rmq_spark.client import Client
    from rmq_spark.tiering import tier_topic
    from storage_service.local import LocalCluster

    log.info("part 2: LocalCluster with 256 KiB segments, hot retention 1 ms")
    topic, archive = "history", store.path("ar-history")
    with LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "rmq-history"),
                      extra_args=HISTORY_CLUSTER_ARGS) as cluster, \
            Client(cluster.endpoints) as client:
        client.create_topic(topic, queues=QUEUES, tier=f"delta:{archive}", local_retention_ms=1)
        for r in range(HISTORY_ROUNDS):
            # A Client per round: producer ids are per thread ident, which Python reuses
            # once a thread ends, so a second round through one Client would be taken
            # for retries of the first and dropped as duplicates.
            with Client(cluster.endpoints) as once:
                produce(once, topic, args.rows // HISTORY_ROUNDS
                        + (args.rows % HISTORY_ROUNDS if r == 0 else 0), args.size)
        check_produced(client, topic, args.rows)
        tier_topic(spark, cluster.endpoints, topic, progress=log.info)
        offs = wait_trimmed(client, topic)
        rmq = (spark.read.format("rocketmq").option("endpoints", cluster.endpoints)
               .option("topic", topic).load())
        delta = spark.read.format("delta").load(archive)
        rows, archived = rmq.count(), delta.count()
        if rows != sum(o.latest for o in offs):
            raise RuntimeError(f"format('rocketmq') read {rows:,} rows, the topic holds "
                               f"{sum(o.latest for o in offs):,}")
        out = {"rows": rows, "from_archive": archived, "from_hot": rows - archived,
               "only_in_archive": sum(o.earliest for o in offs),
               "hot_log_rows": sum(o.latest - o.earliest for o in offs)}
        log.info("  %s rows: %s only in the archive, %s still in the hot log too",
                 f"{rows:,}", f"{out['only_in_archive']:,}", f"{out['hot_log_rows']:,}")
        requests: dict[str, list[int]] = {"rocketmq": [], "delta": []}

        def read(name: str, df) -> None:
            r0 = store.requests()
            df.write.format("noop").mode("overwrite").save()
            requests[name].append(store.requests() - r0)

        out.update(medians(alternate({"rocketmq": lambda: read("rocketmq", rmq),
                                      "delta": lambda: read("delta", delta)}, rows, args.repeats)))
        out["requests"] = {k: statistics.median(v) for k, v in requests.items()}
    return out


def render(tiering: dict, history: dict, size: int, load: dict, store: str = "local") -> str:
    head = (f"{'row (archives on ' + store + ')':<36}{'rows':>9}{'msgs/s':>10}{'MB/s':>8}{'vs peer':>9}"
            f"{'rounds':>12}{'target':>8}  result")
    lines = [head, "-" * len(head)]
    for key, name, peer in ROWS:
        part = tiering if key in PART1 else history
        rate = part[key]
        cells = f"{name:<36}{part['rows']:>9,}{rate:>10,.0f}{rate * size / 1e6:>8.1f}"
        if peer:
            lo, hi = round_ratios(part, key, peer)
            cells += f"{rate / part[peer]:>9.0%}{f'{lo:.0%}-{hi:.0%}':>12}"
        else:
            cells += f"{'peer':>9}{'':>12}"
        if peer and key in TARGETS:
            ratio, target = rate / part[peer], TARGETS[key]
            cells += (f"{'>=' + format(target, '.0%'):>8}  "
                      f"{'MET' if ratio >= target else 'NOT MET'}")
        lines.append(cells)
    lines.append(f"\ntier_topic outside its micro-batches (lease, checkpoint, query start "
                 f"and stop): {tiering['tiering_outside_batches_s']:.1f} s a run")
    lines.append(f"full history: {history['from_archive']:,} rows read from the archive "
                 f"({history['only_in_archive']:,} of them only there, trimmed from the hot "
                 f"log), {history['from_hot']:,} from the hot log")
    if store == "s3":
        rq, hq = tiering["requests"], history["requests"]
        lines.append(
            f"S3 requests: tier_topic {rq['tiering']['per_run']:,.0f} a run of "
            f"{rq['tiering']['batches']:.0f} micro-batches "
            f"(~{rq['tiering']['per_run'] / max(1, rq['tiering']['batches']):,.0f} a batch, job start "
            f"included); the copy {rq['copy']['per_run']:,.0f}; full-history read "
            f"{hq['rocketmq']:,.0f}, the direct Delta read {hq['delta']:,.0f}")
    lines.append(f"load average (1 min) at start {load['start']:.1f}, at end {load['end']:.1f}"
                 f" on {os.cpu_count()} cores")
    return "\n".join(lines)


def plot(tiering: dict, history: dict, size: int, path: str, store: str = "local") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, part, rows, title in (
            (axes[0], tiering, ROWS[:3], "tiering into a Delta archive"),
            (axes[1], history, ROWS[3:], "full-history read (noop sink)")):
        mb = [part[key] * size / 1e6 for key, _, _ in rows]
        key, peer = rows[0][0], rows[-1][0]
        ax.bar([name.strip().replace(", ", ",\n").replace(": ", ":\n") for _, name, _ in rows],
               mb, color=["tab:blue", "tab:cyan"][:len(rows) - 1] + ["tab:gray"])
        ax.axhline(TARGETS[key] * mb[-1], color="tab:red", ls="--", lw=1,
                   label=f"target {TARGETS[key]:.0%} of peer")
        ax.set_title(f"{title}: {part[key] / part[peer]:.0%} of peer", fontsize=10)
        ax.set_ylim(0, max(mb) * 1.25)          # room for the legend above the bars
        ax.set_ylabel("MB/s of message values")
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(fontsize=8, loc="upper right")
    fig.suptitle(f"rmq-spark tiering, {part['rows']:,} x {size} B, local[2], archives on {store}",
                 fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # bench/results/ is not in git
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=400_000, help="messages per topic")
    p.add_argument("--size", type=int, default=1024, help="message value bytes")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed rounds after the warm-up (default 5: runs vary by up to 1.5x here)")
    p.add_argument("--quick", action="store_true", help="40k messages, one repeat")
    p.add_argument("--store", choices=("local", "s3"), default="local",
                   help="archives on a local disk, or on an S3 server on loopback (moto)")
    p.add_argument("--local-checkpoint", action="store_true",
                   help="with --store s3: the tiering checkpoints on the local disk")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--plot", default=None, help="bar chart PNG ('' for none; default "
                   "bench/results/tiering.png, tiering-s3.png with --store s3)")
    a = p.parse_args(argv)
    if a.plot is None:
        a.plot = os.path.join(BENCH_DIR, "results", "tiering-s3.png" if a.store == "s3" else "tiering.png")
    if a.quick:
        a.rows, a.repeats = 40_000, 1
    return a


def setup_run() -> None:
    """Progress lines on stderr; Spark's Python workers run this interpreter."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    compile_sources()


def write_json(path: str, results: dict, load: dict, args) -> None:
    with open(path, "w") as f:
        json.dump({**results, "load_average": load, "cores": os.cpu_count(), "args": vars(args)},
                  f, indent=2)


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_run()
    from rmq_spark.spark import session_builder

    load = {"start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="rmq-bench-tier-") as root:
        store = Store(args.store, root)
        spark = (session_builder("bench-tiering", master="local[2]")
                 .config("spark.ui.enabled", "false")
                 .config("spark.driver.memory", "4g")
                 # as the tiering query sets on its own session: the copy does the same work
                 .config("spark.sql.session.timeZone", "UTC")
                 .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            tiering = measure_tiering(spark, root, store, args)
            history = measure_history(spark, root, store, args)
        finally:
            spark.stop()
            store.stop()
    load["end"] = os.getloadavg()[0]
    print(render(tiering, history, args.size, load, args.store))
    if args.json:
        write_json(args.json, {"tiering": tiering, "history": history}, load, args)
    if args.plot:
        plot(tiering, history, args.size, args.plot, args.store)
        log.info("chart saved to %s", args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
