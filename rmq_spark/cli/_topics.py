"""``rmq topic ...``: create, alter, list, describe and delete topics."""
from __future__ import annotations

import json

from ..archive.layout import absolute_tier
from ..client import Client
from ..units import human_bytes, human_duration, parse_duration_ms, parse_size_bytes, utc_text
from ._format import table

__all__ = ["add_parser", "cmd_topic"]


def add_parser(sub) -> None:
    topic = sub.add_parser("topic", help="create, list, describe, delete topics")
    ts = topic.add_subparsers(dest="action", required=True)
    c = ts.add_parser("create", help="create a topic")
    c.add_argument("name")
    c.add_argument("--queues", type=int, default=4)
    c.add_argument("--retention", default="7d", help="time retention, e.g. 7d, 12h, 0 = forever")
    c.add_argument("--retention-bytes", default="0", help="per-queue size retention, e.g. 10GB; 0 = none")
    c.add_argument("--cleanup-policy", choices=["delete", "compact"], default="delete")
    c.add_argument("--tier", default="", help="delete topics: archive to delta:PATH or parquet:PATH")
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
    al.add_argument("--tier", default=None, help="delete topics: delta:PATH or parquet:PATH")
    al.add_argument("--local-retention", default=None)
    al.add_argument("--delete-retention", default=None)
    al.add_argument("--min-compaction-lag", default=None)
    al.add_argument("--compacted-table", default=None,
                    help="compact topics: the Delta table `rmq compact` keeps (PATH)")
    al.add_argument("--queues", type=int, default=None, help="grow the topic to N queues")
    ts.add_parser("list", help="list topics")
    d = ts.add_parser("describe", help="config and per-queue offsets")
    d.add_argument("name")
    d.add_argument("--json", action="store_true")
    rm = ts.add_parser("delete", help="delete a topic and its data")
    rm.add_argument("name")


def _compaction_settings(cfg: dict) -> str:
    if cfg["cleanup_policy"] != "compact":
        return ""
    return (f", compacted table {cfg['compacted_table'] or 'none yet'}, delete retention "
            f"{human_duration(cfg['delete_retention_ms'], zero='0')}, "
            f"min compaction lag {human_duration(cfg['min_compaction_lag_ms'], zero='0')}")


def _table_path(value: str | None) -> str | None:
    if value is None:
        return None
    return absolute_tier(value if value.startswith("delta:") else f"delta:{value}")


def _create(client: Client, a) -> None:
    cfg = client.create_topic(a.name, queues=a.queues, retention_ms=parse_duration_ms(a.retention),
                              retention_bytes=parse_size_bytes(a.retention_bytes),
                              cleanup_policy=a.cleanup_policy, tier=absolute_tier(a.tier),
                              local_retention_ms=parse_duration_ms(a.local_retention),
                              delete_retention_ms=parse_duration_ms(a.delete_retention),
                              min_compaction_lag_ms=parse_duration_ms(a.min_compaction_lag))
    print(f"created topic {cfg['name']} with {cfg['queues']} queues")


def _alter(client: Client, a) -> None:
    opt = lambda v, f: None if v is None else f(v)  # noqa: E731
    cfg = client.alter_topic(a.name, retention_ms=opt(a.retention, parse_duration_ms),
                             retention_bytes=opt(a.retention_bytes, parse_size_bytes),
                             tier=absolute_tier(a.tier),
                             local_retention_ms=opt(a.local_retention, parse_duration_ms),
                             queues=a.queues,
                             delete_retention_ms=opt(a.delete_retention, parse_duration_ms),
                             min_compaction_lag_ms=opt(a.min_compaction_lag, parse_duration_ms),
                             compacted_table=_table_path(a.compacted_table))
    print(f"altered topic {cfg['name']}: {cfg['queues']} queues, retention {human_duration(cfg['retention_ms'])}"
          + (f", tier {cfg['tier'] or 'none'}, local retention {human_duration(cfg['local_retention_ms'])}"
             if cfg["cleanup_policy"] != "compact" else "")
          + _compaction_settings(cfg))


def _lag_columns(d: dict, q: dict) -> list:
    """Tier columns (delete topics with a tier) or compaction columns (compact topics)."""
    def opt_off(v):
        return v if v >= 0 else "-"
    if d["cleanup_policy"] == "compact":
        return [opt_off(q["compacted"]), q["latest"] - max(q["compacted"], q["earliest"], 0)]
    if d["tier"]:
        return [opt_off(q["archive_earliest"]), opt_off(q["archived"]), q["latest"] - max(q["archived"], 0)]
    return []


def _describe(client: Client, a) -> None:
    d = client.describe_topic(a.name)
    if a.json:
        print(json.dumps(d, indent=2))
        return
    print(f"topic {d['name']}: {d['queues']} queues, policy {d['cleanup_policy']}, "
          f"retention {human_duration(d['retention_ms'])}, retention-bytes "
          f"{human_bytes(d['retention_bytes']) if d['retention_bytes'] else 'none'}"
          + (f", tier {d['tier']}, local retention {human_duration(d['local_retention_ms'])}" if d["tier"] else "")
          + _compaction_settings(d))
    rows = [[q["queue"], q["group"], q["earliest"], q["latest"], human_bytes(q["size_bytes"])]
            + _lag_columns(d, q) + [q["leader"]] for q in d["queue_info"]]
    head = ["queue", "group", "hot earliest", "hot latest", "hot size"]
    if d["cleanup_policy"] == "compact":
        head += ["compacted to", "compaction lag"]
    elif d["tier"]:
        head += ["archive earliest", "archived to", "tier lag"]
    print(table(rows, head + ["leader"]))
    if d["cleanup_policy"] == "compact" and not d["compacted_table"]:
        print(f"compaction: no table yet (`rmq compact {d['name']} --table PATH` makes one)")
    elif d["tier"]:
        print(f"tiering job: checkpoint {d['tier_job']} (lease renewed while it runs, until "
              f"{utc_text(d['tier_job_expires_ms'])})" if d["tier_job"] else
              "tiering job: none running (hot data above the archived offsets stays)")


def cmd_topic(client: Client, a) -> int:
    if a.action == "create":
        _create(client, a)
    elif a.action == "alter":
        _alter(client, a)
    elif a.action == "list":
        rows = [[t["name"], t["queues"], t["cleanup_policy"], human_duration(t["retention_ms"])]
                for t in client.list_topics()]
        print(table(rows, ["topic", "queues", "policy", "retention"]))
    elif a.action == "describe":
        _describe(client, a)
    elif a.action == "delete":
        client.delete_topic(a.name)
        print(f"deleted topic {a.name}")
    return 0
