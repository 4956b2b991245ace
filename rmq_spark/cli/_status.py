"""``rmq offsets`` and ``rmq cluster status``."""
from __future__ import annotations

import json
import sys
import time

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
    de = cs.add_parser("decommission", help="move every replica off a node, then take it out of the cluster")
    de.add_argument("node", help="the node's address, as rmq cluster status shows it")
    de.add_argument("--wait", action="store_true", help="return once the node is out (it can then be stopped)")
    de.add_argument("--ignore-racks", action="store_true",
                    help="even if it is the last node of its rack and groups can then not be on distinct racks")
    de.add_argument("--timeout", type=float, default=3600.0, help="seconds --wait waits (default 3600)")
    mv = cs.add_parser("move", help="move one replica of a data group to another node")
    mv.add_argument("group", type=int)
    mv.add_argument("node", help="the node whose replica moves (address as cluster status shows it)")
    mv.add_argument("to", help="the node that takes it")
    mv.add_argument("--wait", action="store_true", help="return once the move is done")
    mv.add_argument("--timeout", type=float, default=3600.0, help="seconds --wait waits (default 3600)")
    rb = cs.add_parser("rebalance", help="move replicas, then leaderships, until nodes differ by at most one")
    rb.add_argument("--wait", action="store_true", help="return once the cluster is balanced")
    rb.add_argument("--timeout", type=float, default=3600.0, help="seconds --wait waits (default 3600)")


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
    membership = {m["address"]: m["state"] for m in st.get("members") or ()}
    for n in st["nodes"]:
        held = n["groups"]
        leads = [g["group"] for g in held if g["leader"] and g["leader"] == n["address"]]
        nodes.append({**n, "state": "up" if n["reachable"] else "down",
                      "membership": membership.get(n["address"], "active"),
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
    for g in placement:
        groups.setdefault(g, {"group": g, "role": "data", "replicas": [], "leader": "", "term": 0,
                              "commit_index": 0})        # no replica of it answered
    moving = set(moving_groups(st))
    for g, view in groups.items():
        view["moving"] = g in moving
        if g in placement:          # as recorded: also the replicas on nodes that did not answer
            view["replicas"] = list(placement[g])
        elif g == META_GROUP:
            view["replicas"] = [n["address"] for n in nodes]      # every node holds one
    return {"data_groups": max(len(placement), st["groups"]), "metadata_group": META_GROUP, "nodes": nodes,
            "groups": [groups[g] for g in sorted(groups)], "controller": st.get("controller", "")}


def moving_groups(st: dict) -> list[int]:
    """Data groups whose voters, as their leader reports them, are not yet the recorded replicas."""
    out = []
    for g, want in (st.get("placement") or {}).items():
        lead = next((x for n in st["nodes"] for x in n["groups"]
                     if x["group"] == g and x["leader"] and x["leader"] == n["address"]), None)
        if lead is None or sorted(lead.get("replicas") or ()) != sorted(want):
            out.append(g)
    return out


def _wait_for(client: Client, done, what: str, timeout: float) -> int:
    """Poll cluster status until ``done(status)``, printing progress when it changes."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        st = client.cluster_status()
        if done(st):
            print(f"{what}: done")
            return 0
        moving = moving_groups(st)
        line = f"{what}: {len(moving)} group(s) moving {moving or ''} {st.get('controller') or ''}".rstrip()
        if line != last:
            print(line, flush=True)
            last = line
        if time.monotonic() > deadline:
            print(f"{what}: not done after {timeout:.0f}s (rmq cluster status shows where it is)", file=sys.stderr)
            return 1
        time.sleep(1.0)


def cmd_cluster(client: Client, a) -> int:
    if a.action == "decommission":
        print(client.cluster_command("decommission", a.node, ignore_racks=a.ignore_racks))
        if not a.wait:
            return 0
        return _wait_for(client, lambda st: any(m["address"] == a.node and m["state"] == "removed"
                                                for m in st["members"]) and not moving_groups(st),
                         f"decommission {a.node}", a.timeout)
    if a.action == "move":
        print(client.cluster_command("move", a.node, a.group, a.to))
        if not a.wait:
            return 0
        return _wait_for(client, lambda st: a.group not in moving_groups(st), f"move of group {a.group}",
                         a.timeout)
    if a.action == "rebalance":
        print(client.cluster_command("rebalance"))
        if not a.wait:
            return 0
        return _wait_for(client, lambda st: st["rebalance_done"] >= st["rebalance_asked"] and not moving_groups(st),
                         "rebalance", a.timeout)
    view = cluster_view(client.cluster_status())
    if a.json:
        print(json.dumps(view, indent=2))
        return 0
    rows = [[n["node_id"], n["address"], n.get("rack") or "-", n["pid"] or "-",
             n["state"].upper() if n["state"] == "down" else "up",
             n["membership"], len([g for g in n["groups"] if g["group"] != META_GROUP]),
             ",".join(map(str, n["leaders"])) or "-", n["queues"], human_bytes(n["bytes"]),
             n.get("open_files", 0), n.get("http") or "-"] for n in view["nodes"]]
    print(table(rows, ["node", "address", "rack", "pid", "state", "member", "replicas", "leads groups",
                       "queues", "bytes", "open files", "http"]))
    print()
    by_node = {n["address"]: n for n in view["nodes"]}
    rows = [[f"{g['group']} ({g['role']})", g["leader"] or "-", g["term"], g["commit_index"] or "-",
             len(g["replicas"]), " ".join(str(by_node[r]["node_id"]) if r in by_node else r for r in g["replicas"]),
             "moving" if g.get("moving") else ""]
            for g in view["groups"]]
    print(table(rows, ["group", "leader", "term", "commit", "replicas", "on nodes", ""]))
    print(f"\n{view['data_groups']} data groups (1..{view['data_groups']}) and the metadata group 0"
          + (f"; controller: {view['controller']}" if view["controller"] else ""))
    return 0
