"""The metadata group's security record: principals (token versions) and ACLs.

Part of ``MetaState``: applied on every node alike, so an ACL granted
through the metadata leader holds on every node once applied there, and a
principal deleted or rotated there stops every token made before.
"""
from __future__ import annotations

from ..security.acl import AclEntry, allows
from .commands import ChangeAcls, SetPrincipal

__all__ = ["SecurityState"]


class SecurityState:
    def __init__(self):
        self.principals: dict[str, dict] = {}     # name -> {"version": raft index, "created_ms": ...}
        self.acls: dict[tuple, AclEntry] = {}     # AclEntry.key() -> entry
        # names deleted and not created again: a superuser's bootstrap (version 0) token
        # must not come back to life when its principal record is deleted
        self.deleted: set[str] = set()

    # ------------------------------------------------------------- commands
    def set_principal(self, raft_index: int, cmd: SetPrincipal):
        cur = self.principals.get(cmd.name)
        if cmd.delete:
            if cur is None:
                return ("error", "NOT_FOUND", f"principal {cmd.name!r} does not exist")
            del self.principals[cmd.name]
            self.deleted.add(cmd.name)
            return ("ok", None)
        if cur is not None and not cmd.rotate:
            return ("error", "ALREADY_EXISTS",
                    f"principal {cmd.name!r} exists: rotate it (rmq principal create --rotate) for a "
                    "new token, which ends every older one")
        created = cur["created_ms"] if cur else cmd.now_ms
        # The version is this entry's raft index: every replica computes the same, and
        # it never repeats, so a deleted-then-recreated principal's old tokens stay dead.
        self.principals[cmd.name] = {"version": raft_index, "created_ms": created, "rotated_ms": cmd.now_ms}
        self.deleted.discard(cmd.name)
        return ("ok", raft_index)

    def change_acls(self, raft_index: int, cmd: ChangeAcls):
        changed = 0
        for raw in cmd.entries:
            e = AclEntry.decode(raw)
            cur = self.acls.get(e.key())
            if cmd.add:
                ops = (cur.operations if cur else frozenset()) | e.operations
                if cur is None or ops != cur.operations:
                    changed += 1
                self.acls[e.key()] = AclEntry(*e.key(), ops)
            elif cur is not None:
                ops = cur.operations - e.operations
                changed += ops != cur.operations
                if ops:
                    self.acls[e.key()] = AclEntry(*e.key(), ops)
                else:
                    del self.acls[e.key()]
        return ("ok", changed)

    # -------------------------------------------------------------- queries
    def version(self, name: str) -> int | None:
        p = self.principals.get(name)
        return None if p is None else p["version"]

    def was_deleted(self, name: str) -> bool:
        return name in self.deleted

    def allows(self, principal: str, operation: str, rtype: str, name: str) -> bool:
        return allows(list(self.acls.values()), principal, operation, rtype, name)

    def entries(self) -> list[AclEntry]:
        return sorted(self.acls.values(), key=lambda e: e.key())

    # ------------------------------------------------------------- snapshot
    def to_json(self) -> dict:
        return {"principals": self.principals, "acls": [e.encode() for e in self.acls.values()],
                "deleted": sorted(self.deleted)}

    def load(self, d: dict | None) -> None:
        d = d or {}
        self.principals = d.get("principals", {})
        self.acls = {e.key(): e for e in (AclEntry.decode(raw) for raw in d.get("acls", []))}
        self.deleted = set(d.get("deleted", []))
