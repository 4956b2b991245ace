"""``rmq offsets`` and ``rmq cluster status``."""
from __future__ import annotations

import json

from ..client import Client
from ..units import human_bytes
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


def cluster_view(st: dict) -> dict:
    """``Client.cluster_status`` as the CLI shows it: per node its address, pid,
    state, the groups it holds and leads, queues and bytes; per group its
    replicas and leader (the address of the node that reports leading it)."""
    groups: dict[int, dict] = {}
    nodes = []
    for n in st["nodes"]:
        held = n["groups"]
        leads = [g["group"] for g in held if g["leader"] and g["leader"] == n["address"]]
        nodes.append({**n, "state": "up" if n["reachable"] else "down",
                      "groups": [{**g, "role": _role(g["group"])} for g in held],
                      "leaders": leads, "queues": sum(g.get("queues", 0) for g in held),
                      "bytes": sum(g.get("bytes", 0) for g in held)})
        for g in held:
            view = groups.setdefault(g["group"], {"group": g["group"], "role": _role(g["group"]),
                                                  "replicas": [], "leader": "", "term": 0,
                                                  "commit_index": 0})
            view["replicas"].append(n["address"])
            if g["group"] in leads:
                view["leader"], view["commit_index"] = n["address"], g["commit_index"]
            elif not view["leader"] and g["leader"]:
                view["leader"] = g["leader"]          # as a follower sees it
            view["term"] = max(view["term"], g["term"])
    placement = st.get("placement") or {}
    for g, view in groups.items():
        if g in placement:          # as recorded: also the replicas on nodes that did not answer
            view["replicas"] = list(placement[g])
        elif g == META_GROUP:
            view["replicas"] = [n["address"] for n in nodes]      # every node holds one
    return {"data_groups": st["groups"], "metadata_group": META_GROUP, "nodes": nodes,
            "groups": [groups[g] for g in sorted(groups)]}


def cmd_cluster(client: Client, a) -> int:
    view = cluster_view(client.cluster_status())
    if a.json:
        print(json.dumps(view, indent=2))
        return 0
    rows = [[n["node_id"], n["address"], n["pid"] or "-", n["state"].upper() if n["state"] == "down" else "up",
             ",".join(map(str, n["leaders"])) or "-", n["queues"], human_bytes(n["bytes"]),
             n.get("open_files", 0)] for n in view["nodes"]]
    print(table(rows, ["node", "address", "pid", "state", "leads groups", "queues", "bytes", "open files"]))
    print()
    by_node = {n["address"]: n for n in view["nodes"]}
    rows = [[f"{g['group']} ({g['role']})", g["leader"] or "-", g["term"], g["commit_index"] or "-",
             len(g["replicas"]), " ".join(str(by_node[r]["node_id"]) for r in g["replicas"])]
            for g in view["groups"]]
    print(table(rows, ["group", "leader", "term", "commit", "replicas", "on nodes"]))
    print(f"\n{view['data_groups']} data groups (1..{view['data_groups']}) and the metadata group 0")
    return 0
