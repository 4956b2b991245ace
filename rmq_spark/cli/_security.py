"""``rmq principal`` and ``rmq acl``: who may use a secured cluster, and for what."""
from __future__ import annotations

import json
import sys

from ..client import Client
from ._format import table

__all__ = ["add_parsers", "cmd_acl", "cmd_principal"]

OPS_HELP = "operations, comma-separated: produce, consume, describe, alter, all"


def add_parsers(sub) -> None:
    pr = sub.add_parser("principal", help="principals and their bearer tokens (admin)")
    ps = pr.add_subparsers(dest="action", required=True)
    c = ps.add_parser("create", help="create a principal and print its bearer token")
    c.add_argument("name")
    c.add_argument("--rotate", action="store_true",
                   help="an existing principal: a new token; every older one stops working")
    c.add_argument("--ttl", default="0", help="the token's lifetime, e.g. 90d or 12h (default: no expiry)")
    c.add_argument("--json", action="store_true")
    d = ps.add_parser("delete", help="delete a principal: its tokens stop working (its ACLs stay)")
    d.add_argument("name")
    ls = ps.add_parser("list", help="principals with tokens, and the nodes' superusers")
    ls.add_argument("--json", action="store_true")
    ps.add_parser("whoami", help="who the cluster takes this caller for")

    acl = sub.add_parser("acl", help="allow principals operations on topics, consumer groups, the cluster")
    acs = acl.add_subparsers(dest="action", required=True)
    for name, help_ in (("add", "allow operations"), ("remove", "stop allowing operations")):
        a = acs.add_parser(name, help=help_)
        a.add_argument("principal", help="a principal's name, or '*' for every authenticated principal")
        what = a.add_mutually_exclusive_group(required=True)
        what.add_argument("--topic", help="a topic (with --prefix: every topic whose name starts with it)")
        what.add_argument("--group", help="a consumer group (with --prefix: a prefix of names)")
        what.add_argument("--cluster", action="store_true", help="the cluster (status, principals, ACLs, "
                                                                "replica moves)")
        a.add_argument("--prefix", action="store_true", help="--topic/--group is a prefix of names")
        a.add_argument("--allow", dest="ops", required=True,
                       help=OPS_HELP + ("" if name == "add" else " (those to stop allowing)"))
    ls = acs.add_parser("list", help="the ACLs")
    ls.add_argument("--principal", default="", help="only this principal's")
    ls.add_argument("--json", action="store_true")


def cmd_principal(client: Client, a) -> int:
    if a.action == "create":
        from ..units import parse_duration_ms
        try:
            ttl_ms = parse_duration_ms(a.ttl)
        except ValueError as e:
            print(f"rmq principal create: --ttl {a.ttl}: {e}", file=sys.stderr)
            return 2
        if 0 < ttl_ms < 1000:
            print(f"rmq principal create: --ttl {a.ttl}: give 1s or more (0: no expiry)", file=sys.stderr)
            return 2
        out = client.create_principal(a.name, rotate=a.rotate, ttl_seconds=ttl_ms // 1000)
        _unconfirmed(out["unconfirmed"])
        if a.json:
            print(json.dumps(out))
        else:
            print(out["token"])      # alone on stdout: `rmq principal create bob > bob.token`
            print(f"principal {out['name']} (token version {out['version']}"
                  + (f", expires {out['expires_ms']} ms)" if out["expires_ms"] else ", no expiry)"),
                  file=sys.stderr)
        return 0
    if a.action == "delete":
        _unconfirmed(client.delete_principal(a.name))
        print(f"deleted principal {a.name}: its tokens no longer work")
        return 0
    if a.action == "whoami":
        me = client.whoami()
        print(f"{me['principal'] or '(anonymous)'} by {me['how']}"
              + (", superuser" if me["superuser"] else "")
              + ("" if me["authorize"] else " (this cluster does not check ACLs)"))
        return 0
    out = client.list_principals()
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print(table([[p["name"], p["version"], "yes" if p["superuser"] else ""] for p in out["principals"]],
                ["principal", "token version", "superuser"]))
    print(f"\nsuperusers (node configuration): {', '.join(out['superusers']) or '(none)'}")
    return 0


def _unconfirmed(nodes) -> None:
    if nodes:
        print(f"rmq: warning: not yet applied on {', '.join(nodes)} (down or cut off); "
              "they apply it when they are back", file=sys.stderr)


def _entry(a) -> dict:
    ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    if a.cluster:
        if a.prefix:
            raise ValueError("--prefix goes with --topic or --group, not --cluster")
        return dict(principal=a.principal, resource_type="cluster", name="", prefix=False, operations=ops)
    rtype, name = ("topic", a.topic) if a.topic is not None else ("group", a.group)
    return dict(principal=a.principal, resource_type=rtype, name=name, prefix=a.prefix, operations=ops)


def cmd_acl(client: Client, a) -> int:
    if a.action in ("add", "remove"):
        try:
            entry = _entry(a)
        except ValueError as e:
            print(f"rmq acl {a.action}: {e}", file=sys.stderr)
            return 2
        lagging: list[str] = []
        changed = client.change_acls(a.action == "add", [entry], lagging)
        _unconfirmed(lagging)
        print(f"{'allowed' if a.action == 'add' else 'no longer allowed'}: {a.principal} "
              f"{','.join(entry['operations'])} on "
              + ("the cluster" if a.cluster else
                 f"{entry['resource_type']} {entry['name']}{' (prefix)' if entry['prefix'] else ''}")
              + ("" if changed else " (no change)"))
        return 0
    entries = client.list_acls(a.principal)
    if a.json:
        print(json.dumps(entries, indent=2))
        return 0
    print(table([[e["principal"], e["resource_type"], e["name"] + ("*" if e["prefix"] else ""),
                  ",".join(e["operations"])] for e in entries],
                ["principal", "resource", "name", "operations"]))
    return 0
