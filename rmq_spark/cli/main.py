"""``rmq``: topics, produce, consume, offsets and cluster status from the shell.

Endpoints come from ``--endpoints`` or the ``RMQ_ENDPOINTS`` environment
variable (``host:port,host:port,...``).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import sys
import threading
import time

from ..archive.layout import absolute_tier
from ..client import Client, Message, RmqError
from ..units import human_bytes, human_duration, parse_duration_ms, parse_size_bytes, utc_text
from ._format import table

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rmq", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoints", default=os.environ.get("RMQ_ENDPOINTS", ""),
                   help="host:port,... of the storage nodes (default: $RMQ_ENDPOINTS)")
    sub = p.add_subparsers(dest="cmd", required=True)

    _topic_parser(sub)

    pr = sub.add_parser("produce", help="one message per stdin line")
    pr.add_argument("topic")
    pr.add_argument("--json", action="store_true",
                    help='lines are JSON objects {"value", "key", "tags", "properties"}')
    pr.add_argument("--queue", type=int, default=None, help="target queue (default: by key hash)")
    pr.add_argument("--batch", type=int, default=500, help="messages per produce call")

    co = sub.add_parser("consume", help="print messages")
    co.add_argument("topic")
    co.add_argument("--from", dest="start", default="earliest", help="earliest | latest | OFFSET")
    co.add_argument("--max", type=int, default=0, help="stop after N messages (0 = all available)")
    co.add_argument("--queue", type=int, default=None, help="only this queue")
    co.add_argument("--json", action="store_true")
    co.add_argument("--follow", action="store_true", help="keep waiting for new messages")

    of = sub.add_parser("offsets", help="earliest/latest per queue and consumer-group lag")
    of.add_argument("topic")
    of.add_argument("--json", action="store_true")

    _tier_parser(sub)
    _compact_parser(sub)

    cl = sub.add_parser("cluster", help="cluster status")
    cs = cl.add_subparsers(dest="action", required=True)
    st = cs.add_parser("status", help="nodes, groups, leaders, raft indexes")
    st.add_argument("--json", action="store_true")
    return p


def _topic_parser(sub) -> None:
    topic = sub.add_parser("topic", help="create, list, describe, delete topics")
    ts = topic.add_subparsers(dest="action", required=True)
    c = ts.add_parser("create", help="create a topic")
    c.add_argument("name")
    c.add_argument("--queues", type=int, default=4)
    c.add_argument("--retention", default="7d", help="time retention, e.g. 7d, 12h, 0 = forever")
    c.add_argument("--retention-bytes", default="0", help="per-queue size retention, e.g. 10GB; 0 = none")
    c.add_argument("--cleanup-policy", choices=["delete", "compact"], default="delete")
    c.add_argument("--tier", default="", help="tiered storage: delta:PATH or parquet:PATH")
    c.add_argument("--local-retention", default="0",
                   help="hot retention on the nodes for a tiered topic, e.g. 1h (0 = --retention)")
    c.add_argument("--delete-retention", default="24h",
                   help="compact topics: how long a tombstone stays readable in the log")
    c.add_argument("--min-compaction-lag", default="0",
                   help="compact topics: records younger than this are never compacted away")
    al = ts.add_parser("alter", help="change retention, tiering or compaction settings of a topic")
    al.add_argument("name")
    al.add_argument("--retention", default=None)
    al.add_argument("--retention-bytes", default=None)
    al.add_argument("--tier", default=None)
    al.add_argument("--local-retention", default=None)
    al.add_argument("--delete-retention", default=None)
    al.add_argument("--min-compaction-lag", default=None)
    al.add_argument("--queues", type=int, default=None, help="grow the topic to N queues")
    ts.add_parser("list", help="list topics")
    d = ts.add_parser("describe", help="config and per-queue offsets")
    d.add_argument("name")
    d.add_argument("--json", action="store_true")
    rm = ts.add_parser("delete", help="delete a topic and its data")
    rm.add_argument("name")


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


def _tier_parser(sub) -> None:
    ti = sub.add_parser("tier", help="archive a topic into Delta/Parquet (Spark streaming job)")
    ti.add_argument("topic")
    ti.add_argument("--archive", default=None,
                    help="archive directory (default: the topic's tier config; recorded there "
                         "if the topic has none)")
    ti.add_argument("--format", choices=["delta", "parquet"], default=None,
                    help="archive format (default: the topic's, else delta)")
    _streaming_job_args(ti, "archive", "ARCHIVE")
    ti.add_argument("--vacuum-retain", default="168h",
                    help="Delta archive retention: VACUUM retain period (default 168h)")


def _compact_parser(sub) -> None:
    cp = sub.add_parser("compact", help="keep a compact topic's latest value per key in Delta "
                                        "(Spark streaming job)")
    cp.add_argument("topic")
    cp.add_argument("--table", default=None,
                    help="Delta table directory (default: the topic's; recorded there if none)")
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


# ---------------------------------------------------------------------- topic
def _compaction_settings(cfg: dict) -> str:
    if cfg["cleanup_policy"] != "compact":
        return ""
    return (f", delete retention {human_duration(cfg['delete_retention_ms'], zero='0')}, "
            f"min compaction lag {human_duration(cfg['min_compaction_lag_ms'], zero='0')}")


def cmd_topic(client: Client, a) -> int:
    if a.action == "create":
        cfg = client.create_topic(a.name, queues=a.queues, retention_ms=parse_duration_ms(a.retention),
                                  retention_bytes=parse_size_bytes(a.retention_bytes),
                                  cleanup_policy=a.cleanup_policy, tier=absolute_tier(a.tier),
                                  local_retention_ms=parse_duration_ms(a.local_retention),
                                  delete_retention_ms=parse_duration_ms(a.delete_retention),
                                  min_compaction_lag_ms=parse_duration_ms(a.min_compaction_lag))
        print(f"created topic {cfg['name']} with {cfg['queues']} queues")
    elif a.action == "alter":
        opt = lambda v, f: None if v is None else f(v)  # noqa: E731
        cfg = client.alter_topic(a.name, retention_ms=opt(a.retention, parse_duration_ms),
                                 retention_bytes=opt(a.retention_bytes, parse_size_bytes),
                                 tier=absolute_tier(a.tier),
                                 local_retention_ms=opt(a.local_retention, parse_duration_ms),
                                 queues=a.queues,
                                 delete_retention_ms=opt(a.delete_retention, parse_duration_ms),
                                 min_compaction_lag_ms=opt(a.min_compaction_lag, parse_duration_ms))
        print(f"altered topic {cfg['name']}: {cfg['queues']} queues, retention {human_duration(cfg['retention_ms'])}, "
              f"tier {cfg['tier'] or 'none'}, local retention {human_duration(cfg['local_retention_ms'])}"
              + _compaction_settings(cfg))
    elif a.action == "list":
        rows = [[t["name"], t["queues"], t["cleanup_policy"], human_duration(t["retention_ms"])]
                for t in client.list_topics()]
        print(table(rows, ["topic", "queues", "policy", "retention"]))
    elif a.action == "describe":
        d = client.describe_topic(a.name)
        if a.json:
            print(json.dumps(d, indent=2))
            return 0
        print(f"topic {d['name']}: {d['queues']} queues, policy {d['cleanup_policy']}, "
              f"retention {human_duration(d['retention_ms'])}, retention-bytes "
              f"{human_bytes(d['retention_bytes']) if d['retention_bytes'] else 'none'}"
              + (f", tier {d['tier']}, local retention {human_duration(d['local_retention_ms'])}" if d["tier"] else "")
              + _compaction_settings(d))
        def opt_off(v):
            return v if v >= 0 else "-"
        rows = [[q["queue"], q["group"], q["earliest"], q["latest"], human_bytes(q["size_bytes"])]
                + ([opt_off(q["archive_earliest"]), opt_off(q["archived"]),
                    q["latest"] - max(q["archived"], 0)] if d["tier"] else []) + [q["leader"]]
                for q in d["queue_info"]]
        head = ["queue", "group", "hot earliest", "hot latest", "hot size"]
        if d["tier"]:
            head += ["archive earliest", "archived to", "tier lag"]
        print(table(rows, head + ["leader"]))
        if d["tier"]:
            print(f"tiering job: checkpoint {d['tier_job']} (lease renewed while it runs, until "
                  f"{utc_text(d['tier_job_expires_ms'])})" if d["tier_job"] else
                  "tiering job: none running (hot data above the archived offsets stays)")
    elif a.action == "delete":
        client.delete_topic(a.name)
        print(f"deleted topic {a.name}")
    return 0


# -------------------------------------------------------------------- produce
def _parse_line(line: str, as_json: bool, lineno: int) -> Message:
    if not as_json:
        return Message(value=line.encode())
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise SystemExit(f"line {lineno}: not valid JSON ({e})")
    if not isinstance(obj, dict) or "value" not in obj:
        raise SystemExit(f'line {lineno}: expected an object with at least "value"')
    unknown = set(obj) - {"value", "key", "tags", "properties"}
    if unknown:
        raise SystemExit(f"line {lineno}: unknown fields {sorted(unknown)}; allowed: value, key, tags, properties")
    key = obj.get("key")
    return Message(value=str(obj["value"]).encode(), key=None if key is None else str(key).encode(),
                   tags=obj.get("tags") or "", properties={str(k): str(v) for k, v in (obj.get("properties") or {}).items()})


def cmd_produce(client: Client, a) -> int:
    sent, started, last_report = 0, time.monotonic(), time.monotonic()
    batch: list[Message] = []

    def flush():
        nonlocal sent
        if batch:
            client.produce(a.topic, batch, queue=a.queue)
            sent += len(batch)
            batch.clear()

    for lineno, line in enumerate(sys.stdin, 1):
        line = line.rstrip("\n")
        if not line:
            continue
        batch.append(_parse_line(line, a.json, lineno))
        if len(batch) >= a.batch:
            flush()
        if time.monotonic() - last_report >= 1.0:
            last_report = time.monotonic()
            rate = sent / max(1e-9, last_report - started)
            print(f"\rproduced {sent} messages ({rate:,.0f} msg/s)", end="", file=sys.stderr, flush=True)
    flush()
    if last_report != started:
        print(file=sys.stderr)
    print(f"produced {sent} messages to {a.topic}")
    return 0


# -------------------------------------------------------------------- consume
def _record_json(r) -> str:
    def txt(b):
        if b is None:
            return None
        try:
            return b.decode()
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(b).decode()
    return json.dumps({"topic": r.topic, "queue": r.queue, "offset": r.offset, "key": txt(r.key),
                       "value": txt(r.value), "tags": r.tags, "properties": r.properties,
                       "born_timestamp": r.born_timestamp, "store_timestamp": r.store_timestamp,
                       "msg_id": r.msg_id})


def cmd_consume(client: Client, a) -> int:
    offsets = client.offsets(a.topic)
    queues = [o for o in offsets if a.queue is None or o.queue == a.queue]
    if a.queue is not None and not queues:
        raise SystemExit(f"queue {a.queue} does not exist in {a.topic} (0..{len(offsets) - 1})")
    pos = {}
    for o in queues:
        if a.start == "earliest":
            pos[o.queue] = o.earliest
        elif a.start == "latest":
            pos[o.queue] = o.latest
        elif a.start.isdigit():
            pos[o.queue] = max(o.earliest, int(a.start))
        else:
            raise SystemExit(f"--from {a.start!r}: use earliest, latest or an offset")
    ends = {o.queue: o.latest for o in queues}
    printed = 0
    while True:
        progressed = False
        for q in sorted(pos):
            if not a.follow and pos[q] >= ends[q]:
                continue
            res = client.fetch(a.topic, q, pos[q], max_bytes=1 << 20, wait_ms=200 if a.follow else 0)
            for r in res.records:
                print(_record_json(r) if a.json else r.value.decode(errors="replace"))
                printed += 1
                if a.max and printed >= a.max:
                    return 0
            progressed |= bool(res.records)
            pos[q] = res.next_offset
        if not a.follow and not progressed:
            return 0


# ------------------------------------------------------------ offsets, status
def cmd_offsets(client: Client, a) -> int:
    offsets = client.offsets(a.topic)
    groups = {g: client.committed_offsets(g, a.topic) for g in client.consumer_groups(a.topic)}
    if a.json:
        print(json.dumps({"topic": a.topic,
                          "queues": [dict(queue=o.queue, earliest=o.earliest, latest=o.latest) for o in offsets],
                          "consumer_groups": {g: {str(q): dict(committed=c.get(q), lag=o.latest - c.get(q, o.earliest))
                                                  for o in offsets for q in [o.queue]}
                                              for g, c in groups.items()}}, indent=2))
        return 0
    rows = [[o.queue, o.earliest, o.latest, o.latest - o.earliest] for o in offsets]
    print(table(rows, ["queue", "earliest", "latest", "messages"]))
    for g, c in groups.items():
        print(f"\nconsumer group {g}:")
        rows = [[o.queue, c.get(o.queue, "-"), o.latest, o.latest - c.get(o.queue, o.earliest)] for o in offsets]
        print(table(rows, ["queue", "committed", "latest", "lag"]))
    return 0


def cmd_cluster(client: Client, a) -> int:
    st = client.cluster_status()
    if a.json:
        print(json.dumps(st, indent=2))
        return 0
    rows = []
    for n in st["nodes"]:
        for g in n["groups"] or [{}]:
            rows.append([n["node_id"], n["address"], n["pid"] or "-", "up" if n["reachable"] else "DOWN",
                         g.get("group", "-"), g.get("leader", "-"), g.get("term", "-"),
                         g.get("commit_index", "-"), g.get("applied_index", "-")])
    print(table(rows, ["node", "address", "pid", "state", "group", "leader", "term", "commit", "applied"]))
    return 0


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


def cmd_tier(client: Client, a) -> int:
    """Check everything (exit 2 on bad input, nothing changed), then run the Spark job."""
    from ..tiering import AVAILABLE_NOW, TierConfigError, TierSettings, start_tiering, sync_watermark

    try:
        settings = TierSettings.create(
            client, a.endpoints, a.topic, a.archive, a.format, a.trigger or AVAILABLE_NOW,
            a.checkpoint, a.max_offsets_per_trigger,
            vacuum_retain_hours=parse_duration_ms(a.vacuum_retain) / 3_600_000)
    except (TierConfigError, ValueError) as e:
        print(f"rmq tier: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from ..spark import session_builder

    client.close()          # no live gRPC channels while Spark forks its JVM; reopened lazily
    spark = session_builder("rmq-tier").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print(f"tiering {a.topic} into {settings.tier} (checkpoint {settings.checkpoint})",
          file=sys.stderr)
    report = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        query = start_tiering(spark, settings, report)
        if not settings.available_now:
            _run_until_signalled(query)
        end = sync_watermark(client, a.topic, settings.checkpoint) or {}
        print(f"archived {a.topic} to " + (" ".join(f"q{q}={o}" for q, o in sorted(end.items())) or "-"))
        return 0
    except Exception as e:        # the query failed; what it committed is in the watermark
        print(f"rmq tier: tiering {a.topic} failed: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        spark.stop()


def cmd_compact(client: Client, a) -> int:
    """Check everything (exit 2 on bad input, nothing changed), then run the Spark job."""
    from ..compaction import CompactionConfigError, CompactSettings, compact_topic
    from ..jobs import AVAILABLE_NOW

    try:
        s = CompactSettings.create(client, a.endpoints, a.topic, a.table,
                                   a.trigger or AVAILABLE_NOW, a.checkpoint, a.buckets,
                                   a.max_offsets_per_trigger)
    except (CompactionConfigError, ValueError) as e:
        print(f"rmq compact: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from ..spark import session_builder

    client.close()
    spark = session_builder("rmq-compact").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    report = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        query = compact_topic(spark, a.endpoints, a.topic, s.table, a.trigger or AVAILABLE_NOW,
                              s.checkpoint, s.buckets, s.max_offsets_per_trigger, report)
        if not s.available_now:
            try:
                query.awaitTermination()
            except KeyboardInterrupt:
                query.stop()
        print(f"compacted {a.topic} into {s.table}")
        return 0
    except Exception as e:
        print(f"rmq compact: compacting {a.topic} failed: {str(e).splitlines()[0]}",
              file=sys.stderr)
        return 1
    finally:
        spark.stop()


def cmd_get(client: Client, a) -> int:
    from ..compaction import CompactionConfigError, KeyLookup

    try:
        look = KeyLookup(client, a.topic, a.table)
    except CompactionConfigError as e:
        print(f"rmq get: {e}", file=sys.stderr)
        return 2
    key = a.key.encode()
    rows = look.scan(key, a.limit) if a.prefix else [r for r in [look.latest(key)] if r]
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


COMMANDS = {"topic": cmd_topic, "produce": cmd_produce, "consume": cmd_consume,
            "offsets": cmd_offsets, "cluster": cmd_cluster, "tier": cmd_tier,
            "compact": cmd_compact, "get": cmd_get}


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    if not a.endpoints:
        print("rmq: no endpoints: pass --endpoints host:port,... or set RMQ_ENDPOINTS", file=sys.stderr)
        return 2
    try:
        with Client(a.endpoints) as client:
            return COMMANDS[a.cmd](client, a)
    except (RmqError, ValueError) as e:
        print(f"rmq: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
