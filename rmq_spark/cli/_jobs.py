"""``rmq tier``, ``rmq compact`` (Spark streaming jobs) and ``rmq get`` (key lookups)."""
from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Callable

from ..client import Client
from ..units import parse_duration_ms

__all__ = ["add_parsers", "cmd_compact", "cmd_get", "cmd_tier"]


def _streaming_job_args(p, verb: str, home: str) -> None:
    """Trigger, checkpoint and batch-size arguments shared by the Spark job commands."""
    when = p.add_mutually_exclusive_group()
    when.add_argument("--available-now", action="store_true",
                      help=f"{verb} what is there, then stop (the default)")
    when.add_argument("--trigger", default=None, help="run continuously, a batch every e.g. 30s")
    p.add_argument("--checkpoint", default=None,
                   help=f"checkpoint directory (default: {home}/_rmq_checkpoints/TOPIC)")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None,
                   help="at most N messages per micro-batch")
    p.add_argument("--lease-ttl", default="30s",
                   help="TTL of the job's lease on the topic, 3s-24h (default 30s): a job that "
                        "died holds the topic this long")


def add_parsers(sub) -> None:
    ti = sub.add_parser("tier", help="archive a delete topic into Delta/Parquet (Spark streaming job)")
    ti.add_argument("topic")
    ti.add_argument("--archive", default=None,
                    help="archive directory or s3a://BUCKET/PREFIX (default: the topic's tier "
                         "config; recorded there if the topic has none)")
    ti.add_argument("--format", choices=["delta", "parquet"], default=None,
                    help="archive format (default: the topic's, else delta)")
    _streaming_job_args(ti, "archive", "ARCHIVE")
    ti.add_argument("--vacuum-retain", default="168h",
                    help="Delta archive retention: VACUUM retain period (default 168h)")
    cp = sub.add_parser("compact", help="keep a compact topic's latest value per key in Delta "
                                        "(Spark streaming job)")
    cp.add_argument("topic")
    cp.add_argument("--table", default=None,
                    help="Delta table directory or s3a://BUCKET/PREFIX (default: the topic's; "
                         "recorded there if none)")
    _streaming_job_args(cp, "compact", "TABLE")
    cp.add_argument("--buckets", type=int, default=32,
                    help="key buckets (partitions) of a new table, for point lookups")
    g = sub.add_parser("get", help="latest value of a key in a compact topic (or --prefix scan)")
    g.add_argument("topic")
    g.add_argument("key")
    g.add_argument("--prefix", action="store_true", help="every key starting with KEY")
    g.add_argument("--table", default=None, help="compacted table (default: the topic's)")
    g.add_argument("--limit", type=int, default=100)
    g.add_argument("--json", action="store_true")


def _run_until_signalled(query) -> None:
    """Let a streaming query run until it ends or Ctrl-C / SIGTERM; then stop it
    between checks (pyspark's own Ctrl-C handler interrupts a py4j call and
    prints tracebacks)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while query.isActive and not stop.is_set():
        query.awaitTermination(1)           # raises if the query failed
    query.stop()


def _spark(client: Client, name: str):
    from ..spark import session_builder

    client.close()          # no live gRPC channels while Spark forks its JVM; reopened lazily
    spark = session_builder(name).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _report(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run_job(client: Client, cmd: str, verb: str, topic: str, available_now: bool,
             start: Callable, done: Callable[[], str]) -> int:
    """Start the job's query on a fresh SparkSession, let it run (until Ctrl-C when
    not available-now), print ``done()``; exit 1 naming the failure."""
    spark = _spark(client, f"rmq-{cmd}")
    try:
        query = start(spark)
        if not available_now:
            _run_until_signalled(query)
            outcome = getattr(query, "rmq_outcome", None)
            failure = outcome() if outcome else None
            if failure is not None:
                raise failure
        print(done())
        return 0
    except Exception as e:        # the query failed; what it committed stays (watermarks)
        print(f"rmq {cmd}: {verb} {topic} failed: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        spark.stop()


def _lease_ttl_s(a) -> float:
    """``--lease-ttl`` in seconds (the job's settings check its range)."""
    try:
        return parse_duration_ms(a.lease_ttl, no_limit=False) / 1000
    except ValueError:
        raise ValueError(f"--lease-ttl {a.lease_ttl}: give a duration such as 10s or 2m "
                         "(3s-24h)") from None


def cmd_tier(client: Client, a) -> int:
    """Check everything (exit 2 on bad input, nothing changed), then run the Spark job."""
    from ..tiering import AVAILABLE_NOW, TierConfigError, TierSettings, start_tiering

    if a.vacuum_retain.strip().lower() in ("forever", "none"):
        # the duration grammar reads these as 0 = no limit; a retain period of 0 is the opposite
        print(f"rmq tier: --vacuum-retain {a.vacuum_retain}: give a period such as 168h or 30d "
              "(files older than it may be vacuumed)", file=sys.stderr)
        return 2
    try:
        settings = TierSettings.create(
            client, a.endpoints, a.topic, a.archive, a.format, a.trigger or AVAILABLE_NOW,
            a.checkpoint, a.max_offsets_per_trigger,
            vacuum_retain_hours=parse_duration_ms(a.vacuum_retain) / 3_600_000,
            lease_ttl_s=_lease_ttl_s(a))
    except (TierConfigError, ValueError) as e:
        print(f"rmq tier: {e}", file=sys.stderr)
        return 2
    print(f"tiering {a.topic} into {settings.tier} (checkpoint {settings.checkpoint})", file=sys.stderr)

    def done() -> str:      # the job moved the watermark under its lease, up to its last batch
        end = {q["queue"]: q["archived"] for q in client.describe_topic(a.topic)["queue_info"]
               if q["archived"] >= 0}
        return f"archived {a.topic} to " + (" ".join(f"q{q}={o}" for q, o in sorted(end.items())) or "-")

    return _run_job(client, "tier", "tiering", a.topic, settings.available_now,
                    lambda spark: start_tiering(spark, settings, _report), done)


def cmd_compact(client: Client, a) -> int:
    """Check everything (exit 2 on bad input, nothing changed), then run the Spark job."""
    from ..compaction import CompactionConfigError, CompactSettings, compact_topic
    from ..jobs import AVAILABLE_NOW

    try:
        s = CompactSettings.create(client, a.endpoints, a.topic, a.table,
                                   a.trigger or AVAILABLE_NOW, a.checkpoint, a.buckets,
                                   a.max_offsets_per_trigger, _lease_ttl_s(a))
    except (CompactionConfigError, ValueError) as e:
        print(f"rmq compact: {e}", file=sys.stderr)
        return 2
    return _run_job(client, "compact", "compacting", a.topic, s.available_now,
                    lambda spark: compact_topic(spark, a.endpoints, a.topic, s.table, a.trigger or AVAILABLE_NOW,
                                                s.checkpoint, s.buckets, s.max_offsets_per_trigger, _report,
                                                tls=client.tls, token=client.token,
                                                lease_ttl_s=s.lease_ttl_s),
                    lambda: f"compacted {a.topic} into {s.table}")


def cmd_get(client: Client, a) -> int:
    """The key's latest value: the hot tail first, then the compacted table if there is one."""
    from ..compaction import CompactionConfigError, KeyLookup

    key = a.key.encode()
    try:
        look = KeyLookup(client, a.topic, a.table)
        rows = look.scan(key, a.limit) if a.prefix else [r for r in [look.latest(key)] if r]
    except CompactionConfigError as e:       # also a table that turns out not to be one
        print(f"rmq get: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"rmq get: no value for key {a.key!r} in {a.topic}", file=sys.stderr)
        return 1
    for r in rows:
        if a.json:
            print(json.dumps({"key": r.key.decode(errors="replace"),
                              "value": r.value.decode(errors="replace"), "queue": r.queue,
                              "offset": r.offset, "timestamp": r.timestamp_ms, "tags": r.tags,
                              "properties": r.properties}))
        else:
            print(f"{r.key.decode(errors='replace')}\t{r.value.decode(errors='replace')}")
    return 0
