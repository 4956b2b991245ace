"""``rmq offsets`` and ``rmq cluster status``."""
from __future__ import annotations

import json

from ..client import Client
from ._format import table

__all__ = ["add_parsers", "cmd_cluster", "cmd_offsets"]

META_GROUP = 0


def add_parsers(sub) -> None:
    of = sub.add_parser("offsets", help="earliest/latest per queue and consumer-group lag")
    of.add_argument("topic")
    of.add_argument("--json", action="store_true")
    cl = sub.add_parser("cluster", help="cluster status")
    cs = cl.add_subparsers(dest="action", required=True)
    st = cs.add_parser("status", help="nodes, raft groups (group 0 holds metadata), leaders, raft indexes")
    st.add_argument("--json", action="store_true")


def cmd_offsets(client: Client, a) -> int:
    offsets = client.offsets(a.topic)
    groups = {g: client.committed_offsets(g, a.topic) for g in client.consumer_groups(a.topic)}
    if a.json:
        print(json.dumps({"topic": a.topic,
                          "queues": [dict(queue=o.queue, earliest=o.earliest, latest=o.latest) for o in offsets],
                          "consumer_groups": {g: {str(o.queue): dict(committed=c.get(o.queue),
                                                                     lag=o.latest - c.get(o.queue, o.earliest))
                                                  for o in offsets}
                                              for g, c in groups.items()}}, indent=2))
        return 0
    rows = [[o.queue, o.earliest, o.latest, o.latest - o.earliest] for o in offsets]
    print(table(rows, ["queue", "earliest", "latest", "messages"]))
    for g, c in groups.items():
        print(f"\nconsumer group {g}:")
        rows = [[o.queue, c.get(o.queue, "-"), o.latest, o.latest - c.get(o.queue, o.earliest)] for o in offsets]
        print(table(rows, ["queue", "committed", "latest", "lag"]))
    return 0


def _role(group: int) -> str:
    return "metadata" if group == META_GROUP else "data"


def cmd_cluster(client: Client, a) -> int:
    st = client.cluster_status()
    if a.json:
        out = {"data_groups": st["groups"], "metadata_group": META_GROUP,
               "nodes": [{**n, "groups": [{**g, "role": _role(g["group"])} for g in n["groups"]]}
                         for n in st["nodes"]]}
        print(json.dumps(out, indent=2))
        return 0
    rows = []
    for n in st["nodes"]:
        for g in n["groups"] or [{}]:
            group = g.get("group", "-")
            rows.append([n["node_id"], n["address"], n["pid"] or "-", "up" if n["reachable"] else "DOWN",
                         f"{group} ({_role(group)})" if group != "-" else "-", g.get("leader", "-"),
                         g.get("term", "-"), g.get("commit_index", "-"), g.get("applied_index", "-")])
    print(table(rows, ["node", "address", "pid", "state", "group", "leader", "term", "commit", "applied"]))
    print(f"\n{st['groups']} data groups (1..{st['groups']}) and the metadata group 0 on every node")
    return 0
