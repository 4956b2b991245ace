"""``rmq kv``: a compact topic read and written by key (issue 40, RIP-22).

``put`` and ``delete`` print the new revision; a failed condition
(``--if-revision``/``--if-absent``) exits 1 naming the key and its current
revision. Keys and values are UTF-8 on the command line; ``put`` reads the
value from standard input when it is not given.
"""
from __future__ import annotations

import base64
import json
import sys

from ..client import Client, KvConflict
from ._format import table

__all__ = ["add_parser", "cmd_kv"]


def add_parser(sub) -> None:
    kv = sub.add_parser("kv", help="key-value on a compact topic: put, get, delete, keys, history")
    ks = kv.add_subparsers(dest="action", required=True)
    put = ks.add_parser("put", help="set a key; prints its new revision")
    put.add_argument("topic")
    put.add_argument("key")
    put.add_argument("value", nargs="?", help="the value (default: standard input)")
    cond = put.add_mutually_exclusive_group()
    cond.add_argument("--if-revision", type=int, help="only if the key's live value is at this revision")
    cond.add_argument("--if-absent", action="store_true", help="only if the key has no live value")
    put.add_argument("--ttl", default="0", help="the value expires after this long, e.g. 30s or 1h (default: never)")
    get = ks.add_parser("get", help="a key's value (exit 1 if it has none)")
    get.add_argument("topic")
    get.add_argument("key")
    get.add_argument("--revision", type=int, help="the value the key had at this revision")
    get.add_argument("--json", action="store_true", help="value, revision, queue as JSON")
    d = ks.add_parser("delete", help="delete a key (a tombstone); prints its revision")
    d.add_argument("topic")
    d.add_argument("key")
    d.add_argument("--if-revision", type=int, help="only if the key's live value is at this revision")
    k = ks.add_parser("keys", help="live keys, in key order")
    k.add_argument("topic")
    k.add_argument("--prefix", default="", help="only keys starting with this")
    k.add_argument("--json", action="store_true")
    w = ks.add_parser("watch", help="live keys, then every change as it is committed (Ctrl-C stops)")
    w.add_argument("topic")
    w.add_argument("--prefix", default="", help="only keys starting with this")
    w.add_argument("--from-revision", type=int, help="every change from this revision on, no snapshot")
    w.add_argument("--max", type=int, default=0, help="stop after this many events (default: never)")
    w.add_argument("--json", action="store_true", help="one JSON object per line")
    h = ks.add_parser("history", help="a key's revisions still in the log, oldest first")
    h.add_argument("topic")
    h.add_argument("key")
    h.add_argument("--json", action="store_true")


def _text(b: bytes | None) -> str | None:
    if b is None:
        return None
    try:
        return b.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(b).decode()


def cmd_kv(client: Client, a) -> int:
    if a.action in ("put", "delete") and a.if_revision is not None and a.if_revision < 0:
        print(f"rmq kv {a.action}: --if-revision {a.if_revision}: revisions are 0 or more", file=sys.stderr)
        return 2
    try:
        if a.action == "put":
            from ..units import parse_duration_ms
            try:
                ttl_ms = parse_duration_ms(a.ttl)
            except ValueError as e:
                print(f"rmq kv put: --ttl {a.ttl}: {e}", file=sys.stderr)
                return 2
            value = a.value.encode() if a.value is not None else sys.stdin.buffer.read()
            print(client.kv_put(a.topic, a.key, value, if_revision=a.if_revision, if_absent=a.if_absent,
                                ttl_ms=ttl_ms))
        elif a.action == "delete":
            print(client.kv_delete(a.topic, a.key, if_revision=a.if_revision))
        elif a.action == "get":
            e = client.kv_get(a.topic, a.key, revision=a.revision)
            if e is None:
                print(f"rmq kv get: {a.topic}: key {a.key!r} has no value", file=sys.stderr)
                return 1
            if a.json:
                print(json.dumps({"key": a.key, "value": _text(e.value), "revision": e.revision, "queue": e.queue,
                                  "store_ts": e.store_ts}))
            else:
                print(_text(e.value))
        elif a.action == "keys":
            keys = client.kv_keys(a.topic, a.prefix)
            if a.json:
                print(json.dumps([{"key": _text(k), "revision": r} for k, r in keys]))
            else:
                for k, _ in keys:
                    print(_text(k))
        elif a.action == "watch":
            if a.from_revision is not None and a.from_revision < 0:
                print(f"rmq kv watch: --from-revision {a.from_revision}: revisions are 0 or more", file=sys.stderr)
                return 2
            events = client.kv_watch(a.topic, a.prefix, from_revision=a.from_revision)
            try:
                for n, ev in enumerate(events, 1):
                    if a.json:
                        print(json.dumps({"key": _text(ev.key), "value": _text(ev.value), "revision": ev.revision,
                                          "queue": ev.queue, "type": "delete" if ev.value is None else "put",
                                          "snapshot": ev.snapshot}), flush=True)
                    else:
                        what = "DELETE" if ev.value is None else f"PUT {_text(ev.value)}"
                        print(f"{ev.revision}\t{_text(ev.key)}\t{what}", flush=True)
                    if a.max and n >= a.max:
                        break
            finally:
                events.close()
        elif a.action == "history":
            hist = client.kv_history(a.topic, a.key)
            if a.json:
                print(json.dumps([{"revision": e.revision, "value": _text(e.value), "deleted": e.value is None,
                                   "store_ts": e.store_ts} for e in hist]))
            else:
                print(table([[e.revision, "(deleted)" if e.value is None else _text(e.value)] for e in hist],
                            ["revision", "value"]))
    except KvConflict as e:
        now = "has no live value" if e.current_revision is None else f"is at revision {e.current_revision}"
        print(f"rmq kv {a.action}: conflict: key {a.key!r} {now}; nothing was written", file=sys.stderr)
        return 1
    return 0
