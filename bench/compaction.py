#!/usr/bin/env python
"""Compaction benchmark: compact_topic against a plain Spark recomputation, and point lookups.

One run measures every row on this machine and prints one table plus the
issue's target::

    .venv/bin/python bench/compaction.py                  # 200k records, 1M keys, 10-15 minutes
    .venv/bin/python bench/compaction.py --quick          # smoke run, a few minutes
    .venv/bin/python bench/compaction.py --json bench/results/compaction.json
    .venv/bin/python bench/compaction.py --stages         # also log each run's Spark stages

1. Compaction throughput, input records/s. A 3-node LocalCluster; for each
   update ratio (10% and 90% of the records reuse a key seen before),
   ``repeats + 1`` compact topics of 8 queues, each filled with the same
   ``--records`` keyed ``--size``-byte records before any timing (a key
   always goes to the same queue). Every run needs a topic of its own: a new
   checkpoint resumes at the topic's compaction watermark. Timed:
   ``compact_topic(trigger="available-now")`` into a new table with a new
   checkpoint, end to end. Peer: the same records staged once as Parquet
   (untimed), then ``spark.read.parquet`` -> last record per key by
   (queue, offset) (``max_by``) -> the same columns and ``bucket`` ->
   a new Delta table partitioned by ``bucket``. The table also shows the
   runs counted by their micro-batch time alone (Spark's
   ``triggerExecution``).
2. Point lookups. A compact topic of ``--keys`` distinct keys, compacted by
   ``compact_topic`` into a table of 32 buckets (the build is timed once and
   shown). Then ``KeyLookup.latest`` (what ``rmq get`` runs: one
   ``describe_topic`` RPC for the hot tail, which is empty here, then
   ``CompactedTable.get``) for ``--lookups`` random existing keys and as
   many missing ones, ``CompactedTable.get`` alone, and as the peer
   ``spark.read.format("delta").load(table).where(key = k).collect()`` for
   ``--spark-lookups`` keys. Target: KeyLookup p99 <= 50 ms for 1 million keys.

Runs alternate between a row and its peer (one warm-up each, then
``--repeats`` rounds), so on a shared machine both see the same load; rates
are medians. SparkSession: ``rmq_spark.spark.session_builder(master="local[2]")``.
Progress goes to stderr, the table to stdout; ``--plot`` saves a bar chart.
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
import time
from datetime import datetime

import numpy as np
import pyarrow.parquet as pq

# tiering and spark_read live next to this file; importing them puts the checkout on sys.path.
from spark_read import BENCH_DIR, QUEUES, alternate, medians, round_ratios
from tiering import batch_seconds, check_produced, setup_run, write_json

log = logging.getLogger("bench.compaction")
UPDATE_RATIOS = (0.10, 0.90)
BUCKETS = 32
TARGET_P99_MS = 50.0
TARGET_COMPACT = 1.00           # end to end against the recompute (issue 24)
PRODUCE_BATCH = 1000            # records per (topic, queue) batch in one produce_batches call
LOOKUP_ROWS = (("lookup_hit", "KeyLookup.latest, existing keys"),
               ("lookup_miss", "KeyLookup.latest, missing keys"),
               ("table_hit", "  CompactedTable.get alone (no RPC)"),
               ("spark", 'format("delta").where(key = k) (peer)'))
PLOT_NAMES = ("KeyLookup\nexisting", "KeyLookup\nmissing", "CompactedTable\n.get alone",
              "Spark where\n(peer)")


def key_ids(records: int, update_ratio: float, seed: int) -> np.ndarray:
    """Key id of every record: a new key with probability 1 - ratio, else one seen before."""
    rng = np.random.default_rng(seed)
    new = rng.random(records) >= update_ratio
    new[0] = True
    seen = np.cumsum(new)                           # keys created so far, this record included
    old = (rng.random(records) * seen).astype(np.int64)
    return np.where(new, seen - 1, old)


def key_of(i: int) -> bytes:
    return b"key-%09d" % i


def produce_keyed(client, topics: list[str], ids: np.ndarray, size: int) -> None:
    """The same records into every topic; a key's records go to queue ``id % QUEUES`` in order."""
    from rmq_spark.client import Message

    rng = np.random.default_rng(size)           # distinct random values, as Parquet sees them
    per_queue = [ids[ids % QUEUES == q] for q in range(QUEUES)]
    t0, done = time.monotonic(), 0
    for start in range(0, max(len(p) for p in per_queue), PRODUCE_BATCH):
        batches = []
        for q, mine in enumerate(per_queue):
            chunk = mine[start:start + PRODUCE_BATCH]
            values = rng.integers(0, 256, (len(chunk), size), dtype=np.uint8)
            msgs = [Message(bytes(v), key=key_of(int(k))) for v, k in zip(values, chunk)]
            batches += [(t, q, msgs) for t in topics if msgs]
        client.produce_batches(batches)
        done += sum(len(m) for _, _, m in batches)
        if done // 200_000 != (done - sum(len(m) for _, _, m in batches)) // 200_000:
            log.info("  produced %12s records  %8.0f records/s", f"{done:,}",
                     done / (time.monotonic() - t0))


def last_per_key_to_delta(spark, staging: str, path: str) -> None:
    """The peer: the last record per key, recomputed from scratch, written to a new Delta table."""
    from pyspark.sql import functions as F

    from rmq_spark.compaction.table import TABLE_DDL

    columns = [c.split()[0] for c in TABLE_DDL.split(", ") if not c.startswith("bucket ")]
    newest = F.max_by(F.struct(*columns), F.struct("queue", "offset")).alias("newest")
    table = (spark.read.parquet(staging).groupBy("key").agg(newest).select("newest.*")
             .withColumn("bucket", F.pmod(F.crc32("key"), F.lit(BUCKETS)).cast("int")))
    table.write.format("delta").partitionBy("bucket").save(path)


def completed_stages(spark) -> list[dict]:
    """Spark's completed stages (its REST API; the UI is on only with ``--stages``)."""
    import json
    import urllib.request

    sc = spark.sparkContext
    with urllib.request.urlopen(f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}"
                                "/stages?status=complete", timeout=30) as r:
        return json.load(r)


def log_stages(spark, since: int, what: str, seconds: float) -> int:
    """Log the stages after stage id ``since``: wall time, tasks, task time, rows
    read, shuffle; the last stage id."""
    def at(t: str) -> float:
        return datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fGMT").timestamp()

    stages = sorted((st for st in completed_stages(spark) if st["stageId"] > since),
                    key=lambda st: st["stageId"])
    log.info("  stages of %s (%.2f s in all): %.2f s in stages", what, seconds,
             sum(at(st["completionTime"]) - at(st["submissionTime"]) for st in stages))
    for st in stages:
        log.info("    stage %4d %6.2f s  %3d tasks  task time %6.2f s  rows read %8d  "
                 "shuffle read %6.1f MB  write %6.1f MB",
                 st["stageId"], at(st["completionTime"]) - at(st["submissionTime"]), st["numTasks"],
                 st["executorRunTime"] / 1e3, st["inputRecords"], st["shuffleReadBytes"] / 1e6,
                 st["shuffleWriteBytes"] / 1e6)
    return max([since] + [st["stageId"] for st in stages])


def table_files(path: str) -> list[str]:
    """The live Parquet files of the Delta table at ``path``, from its log (no Spark)."""
    from rmq_spark.archive.reader import delta_file_path, delta_log

    adds, _ = delta_log(path) or ([], {})
    return [delta_file_path(path, a) for a in adds]


def table_rows(path: str) -> int:
    """Rows of a Delta table without deletion vectors (the compacted table turns them off)."""
    return sum(pq.ParquetFile(f).metadata.num_rows for f in table_files(path))


def measure_ratio(spark, cluster, client, root: str, ratio: float, args) -> dict:
    """compact_topic against the plain recomputation, one update ratio."""
    from rmq_spark.compaction import compact_topic

    tag = f"u{int(ratio * 100)}"
    ids = key_ids(args.records, ratio, seed=int(ratio * 100))
    keys = len(np.unique(ids))
    topics = [f"{tag}-{i}" for i in range(args.repeats + 1)]
    log.info("update ratio %.0f%%: %d topics of %s records, %s keys", ratio * 100, len(topics),
             f"{args.records:,}", f"{keys:,}")
    for t in topics:
        client.create_topic(t, queues=QUEUES, cleanup_policy="compact")
    produce_keyed(client, topics, ids, args.size)
    for t in topics:
        check_produced(client, t, args.records)
    staging = os.path.join(root, f"staging-{tag}")
    spark.read.format("rocketmq").option("endpoints", cluster.endpoints) \
        .option("topic", topics[0]).load().write.parquet(staging)
    pending, tables, copies, split = list(topics), [], [], []

    last_stage = max([-1] + [st["stageId"] for st in completed_stages(spark)]) if args.stages else -1

    def compact() -> None:
        nonlocal last_stage
        t, t0 = pending.pop(0), time.perf_counter()
        tables.append(os.path.join(root, "table-" + t))
        q = compact_topic(spark, cluster.endpoints, t, tables[-1], buckets=BUCKETS,
                          checkpoint=os.path.join(root, "ck-" + t), progress=log.debug)
        split.append((time.perf_counter() - t0, batch_seconds(q)))
        if args.stages:
            last_stage = log_stages(spark, last_stage, f"compact_topic {t} (micro-batch "
                                       f"{split[-1][1]:.2f} s)", split[-1][0])

    def copy() -> None:
        nonlocal last_stage
        copies.append(os.path.join(root, f"copy-{tag}-{len(copies)}"))
        t0 = time.perf_counter()
        last_per_key_to_delta(spark, staging, copies[-1])
        if args.stages:
            last_stage = log_stages(spark, last_stage, "the peer", time.perf_counter() - t0)

    out = medians(alternate({"compact": compact, "peer": copy}, args.records, args.repeats))
    for path in tables + copies:
        if (got := table_rows(path)) != keys:
            raise RuntimeError(f"{path} holds {got:,} rows, expected {keys:,} keys")
    timed = split[1:]                                     # [0] is the warm-up
    batches = [args.records / b for _, b in timed]
    out["rounds"]["compact_batches"] = batches
    return {"ratio": ratio, "records": args.records, "keys": keys, **out,
            "compact_batches": float(np.median(batches)),
            "compact_outside_batches_s": float(np.median([t - b for t, b in timed]))}


def build_lookup_table(spark, cluster, client, root: str, args) -> tuple[str, str, dict]:
    """A compact topic of ``--keys`` distinct keys, compacted into a table by compact_topic."""
    from rmq_spark.compaction import compact_topic

    topic, table = "lookup", os.path.join(root, "table-lookup")
    client.create_topic(topic, queues=QUEUES, cleanup_policy="compact")
    log.info("lookups: producing %s distinct keys", f"{args.keys:,}")
    produce_keyed(client, [topic], np.arange(args.keys), args.size)
    check_produced(client, topic, args.keys)
    t0 = time.perf_counter()
    compact_topic(spark, cluster.endpoints, topic, table, buckets=BUCKETS, progress=log.info)
    build_s = time.perf_counter() - t0
    files = table_files(table)
    info = {"keys": args.keys, "build_s": build_s, "files": len(files), "buckets": BUCKETS,
            "row_groups": sum(pq.ParquetFile(f).metadata.num_row_groups for f in files),
            "table_mb": sum(os.path.getsize(f) for f in files) / 1e6}
    log.info("  table built in %.1f s: %d files, %d row groups, %.1f MB", build_s,
             info["files"], info["row_groups"], info["table_mb"])
    return topic, table, info


def latencies_ms(*calls: tuple) -> list[list[float]]:
    """``calls``: (get, keys, expect_hit). The i-th lookup of every call in turn, so all see
    the same load; each result is checked (a value for a hit, None for a miss)."""
    out: list[list[float]] = [[] for _ in calls]
    for i in range(len(calls[0][1])):
        for (get, keys, expect_hit), ms in zip(calls, out):
            t = time.perf_counter()
            row = get(keys[i])
            ms.append((time.perf_counter() - t) * 1e3)
            if (row is not None) != expect_hit:
                raise RuntimeError(f"lookup of {keys[i]!r} returned {row!r}")
    return out


def summarize(ms: list[float]) -> dict:
    return {"count": len(ms), "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(max(ms))}


def measure_lookups(spark, cluster, client, root: str, args) -> dict:
    from pyspark.sql import functions as F

    from rmq_spark.compaction import KeyLookup

    topic, table, info = build_lookup_table(spark, cluster, client, root, args)
    rng = random.Random(11)
    hits = [key_of(rng.randrange(args.keys)) for _ in range(args.lookups)]
    misses = [key_of(args.keys + rng.randrange(10 * args.keys)) for _ in range(args.lookups)]
    look = KeyLookup(client, topic)
    t = time.perf_counter()
    row = look.latest(hits[0])                 # reads and caches the Delta log
    info["first_lookup_ms"] = (time.perf_counter() - t) * 1e3
    if row is None or row.key != hits[0]:
        raise RuntimeError(f"first lookup of {hits[0]!r} returned {row!r}")
    measured = latencies_ms((look.latest, hits, True), (look.latest, misses, False),
                            (look.table.get, hits, True))
    out = {"table": info, **{key: summarize(ms) for key, ms in
                             zip(("lookup_hit", "lookup_miss", "table_hit"), measured)}}
    delta = spark.read.format("delta").load(table)

    def spark_get(k: bytes):
        return delta.where(F.col("key") == F.lit(k)).collect() or None

    spark_get(hits[0])                         # warm-up
    out["spark"] = summarize(latencies_ms((spark_get, hits[:args.spark_lookups], True))[0])
    for key, name in LOOKUP_ROWS:
        log.info("  %-40s p50 %8.2f ms  p99 %8.2f ms", name, out[key]["p50_ms"],
                 out[key]["p99_ms"])
    return out


def measure_all(root: str, args) -> tuple[list[dict], dict]:
    """Both parts on one LocalCluster and one SparkSession (local[2], UTC as the job sets)."""
    from rmq_spark.client import Client
    from rmq_spark.spark import session_builder
    from storage_service.local import LocalCluster

    log.info("LocalCluster (3 nodes, 4 groups) and Spark local[2]; %s x %d B records per topic",
             f"{args.records:,}", args.size)
    with LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "rmq")) as cluster, \
            Client(cluster.endpoints) as client:
        spark = (session_builder("bench-compaction").config("spark.ui.enabled", str(args.stages).lower())
                 .config("spark.driver.memory", "4g")
                 .config("spark.sql.session.timeZone", "UTC").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            ratios = [measure_ratio(spark, cluster, client, root, r, args) for r in UPDATE_RATIOS]
            return ratios, measure_lookups(spark, cluster, client, root, args)
        finally:
            spark.stop()


def render(ratios: list[dict], lookups: dict, load: dict) -> str:
    head = (f"{'row':<44}{'updates':>8}{'records':>11}{'keys':>11}{'records/s':>11}"
            f"{'vs peer':>9}{'rounds':>12}{'target':>8}  result")
    lines = [head, "-" * len(head)]
    for r in ratios:
        for key, name in (("compact", "compact_topic, available-now"),
                          ("compact_batches", "  its micro-batches alone"),
                          ("peer", "last per key: parquet -> Delta (peer)")):
            if key == "peer":
                vs = f"{'peer':>9}"
            else:
                lo, hi = round_ratios(r, key, "peer")
                vs = f"{r[key] / r['peer']:>9.0%}{f'{lo:.0%}-{hi:.0%}':>12}"
            if key == "compact":
                met = r[key] / r["peer"] >= TARGET_COMPACT
                vs += f"{'>=' + format(TARGET_COMPACT, '.0%'):>8}  {'MET' if met else 'NOT MET'}"
            lines.append(f"{name:<44}{r['ratio']:>8.0%}{r['records']:>11,}{r['keys']:>11,}"
                         f"{r[key]:>11,.0f}{vs}")
    t = lookups["table"]
    head = (f"\n{'lookup, ' + format(t['keys'], ',') + ' keys':<44}{'count':>9}{'p50 ms':>9}"
            f"{'p99 ms':>9}{'target':>9}  result")
    lines += [head, "-" * (len(head) - 1)]
    for key, name in LOOKUP_ROWS:
        s = lookups[key]
        cells = f"{name:<44}{s['count']:>9,}{s['p50_ms']:>9.2f}{s['p99_ms']:>9.2f}"
        if key.startswith("lookup_"):
            cells += f"{'<=' + format(TARGET_P99_MS, '.0f'):>9}  " + \
                ("MET" if s["p99_ms"] <= TARGET_P99_MS else "NOT MET")
        lines.append(cells)
    outside = ", ".join(f"{r['compact_outside_batches_s']:.1f} s ({r['ratio']:.0%})"
                        for r in ratios)
    lines.append(f"\ncompact_topic outside its micro-batches (table check, query start and "
                 f"stop): {outside} a run")
    lines.append(f"lookup table: built by compact_topic from a topic of {t['keys']:,} records "
                 f"in {t['build_s']:.0f} s; {t['buckets']} buckets, {t['files']} Parquet files "
                 f"({t['row_groups']} row groups), {t['table_mb']:.0f} MB; first lookup (reads the Delta log) "
                 f"{t['first_lookup_ms']:.0f} ms")
    lines.append(f"load average (1 min) at start {load['start']:.1f}, at end {load['end']:.1f}"
                 f" on {os.cpu_count()} cores")
    return "\n".join(lines)


def plot(ratios: list[dict], lookups: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    x = np.arange(len(ratios))
    for i, (key, label, color) in enumerate((("compact", "compact_topic", "tab:blue"),
                                             ("compact_batches", "its micro-batches",
                                              "tab:cyan"),
                                             ("peer", "plain last-per-key (peer)",
                                              "tab:gray"))):
        left.bar(x + (i - 1) * 0.27, [r[key] for r in ratios], 0.27, label=label, color=color)
    left.set_xticks(x, [f"{r['ratio']:.0%} updates" for r in ratios])
    left.set_ylabel("input records/s")
    left.set_title(f"compaction, {ratios[0]['records']:,} records", fontsize=10)
    left.legend(fontsize=8)
    names = PLOT_NAMES
    for key, offset, color in (("p50_ms", -0.2, "tab:blue"), ("p99_ms", 0.2, "tab:orange")):
        right.bar(np.arange(len(names)) + offset, [lookups[k][key] for k, _ in LOOKUP_ROWS],
                  0.4, label=key.split("_")[0], color=color)
    right.axhline(TARGET_P99_MS, color="tab:red", ls="--", lw=1, label="target p99")
    right.set_yscale("log")
    right.set_xticks(np.arange(len(names)), names, fontsize=8)
    right.set_ylabel("ms per lookup (log scale)")
    right.set_title(f"point lookups, {lookups['table']['keys']:,} keys", fontsize=10)
    right.legend(fontsize=8)
    fig.suptitle("rmq-spark compaction, local[2]", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # bench/results/ is not in git
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=200_000, help="records per compact topic")
    p.add_argument("--size", type=int, default=100, help="record value bytes")
    p.add_argument("--keys", type=int, default=1_000_000, help="keys in the lookup table")
    p.add_argument("--lookups", type=int, default=2000, help="KeyLookup calls per row")
    p.add_argument("--spark-lookups", type=int, default=20, help="Spark lookups (peer row)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true",
                   help="10k records, 50k keys, 500 lookups, 5 Spark lookups, one repeat")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--stages", action="store_true",
                   help="log every compaction and peer run's Spark stages (Spark's UI on)")
    p.add_argument("--plot", default=os.path.join(BENCH_DIR, "results", "compaction.png"),
                   help="bar chart PNG ('' for none)")
    a = p.parse_args(argv)
    if a.quick:
        a.records, a.keys, a.lookups, a.spark_lookups, a.repeats = 10_000, 50_000, 500, 5, 1
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_run()
    load = {"start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="rmq-bench-compact-") as root:
        ratios, lookups = measure_all(root, args)
    load["end"] = os.getloadavg()[0]
    print(render(ratios, lookups, load))
    if args.json:
        write_json(args.json, {"compaction": ratios, "lookups": lookups}, load, args)
    if args.plot:
        plot(ratios, lookups, args.plot)
        log.info("chart saved to %s", args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
