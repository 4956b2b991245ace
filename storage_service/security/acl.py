"""Access control lists: who may do what to which topic, consumer group or the cluster.

An entry allows a principal (or ``*``, any authenticated principal) a set
of operations on a resource: a topic, a consumer group (by name, or every
name starting with a prefix) or the cluster. Only allows exist: what no
entry allows is denied (Kafka's model without its deny entries). ``produce``,
``consume`` and ``alter`` each imply ``describe`` on the same resource;
``all`` is every operation. What each RPC needs is in ``security/authz.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OPERATIONS", "RESOURCE_TYPES", "AclEntry", "allows", "check_entry"]

OPERATIONS = ("produce", "consume", "describe", "alter")
RESOURCE_TYPES = ("topic", "group", "cluster")
_IMPLY_DESCRIBE = {"produce", "consume", "alter"}
MAX_NAME = 512


@dataclass(frozen=True)
class AclEntry:
    principal: str          # a principal's name, or "*"
    resource_type: str      # topic, group, cluster
    name: str               # the topic's or group's name (or prefix); "" for the cluster
    prefix: bool            # name is a prefix
    operations: frozenset   # of OPERATIONS

    def key(self) -> tuple:
        return (self.principal, self.resource_type, self.name, self.prefix)

    def encode(self) -> tuple:
        return (*self.key(), tuple(sorted(self.operations)))

    @classmethod
    def decode(cls, raw) -> "AclEntry":
        principal, rtype, name, prefix, ops = raw
        return cls(principal, rtype, name, bool(prefix), frozenset(ops))

    def covers(self, rtype: str, name: str) -> bool:
        if rtype != self.resource_type:
            return False
        if rtype == "cluster":
            return True
        return name.startswith(self.name) if self.prefix else name == self.name

    def describe(self) -> str:
        what = "the cluster" if self.resource_type == "cluster" else \
            f"{self.resource_type}{'s starting with' if self.prefix else ''} {self.name!r}"
        return f"{self.principal}: {','.join(sorted(self.operations))} on {what}"


def allows(entries, principal: str, operation: str, rtype: str, name: str) -> bool:
    for e in entries:
        if e.principal not in (principal, "*") or not e.covers(rtype, name):
            continue
        if operation in e.operations or (operation == "describe" and e.operations & _IMPLY_DESCRIBE):
            return True
    return False


def check_entry(principal: str, rtype: str, name: str, prefix: bool, operations) -> AclEntry:
    """A valid entry, or ValueError naming what is wrong and what is allowed."""
    if not principal or len(principal) > MAX_NAME or any(c.isspace() for c in principal):
        raise ValueError(f"principal {principal!r}: give a name of 1-{MAX_NAME} characters "
                         "without spaces, or * for every authenticated principal")
    if rtype not in RESOURCE_TYPES:
        raise ValueError(f"resource type {rtype!r}: allowed {', '.join(RESOURCE_TYPES)}")
    if rtype == "cluster":
        if name or prefix:
            raise ValueError("the cluster resource has no name or prefix")
    elif not name and not prefix:
        raise ValueError(f"a {rtype} ACL needs the {rtype}'s name (or --prefix with a prefix, "
                         "an empty prefix being every name)")
    elif len(name) > MAX_NAME:
        raise ValueError(f"{rtype} name of {len(name)} characters: at most {MAX_NAME}")
    ops = set(operations)
    if "all" in ops:
        ops = (ops - {"all"}) | set(OPERATIONS)
    bad = ops - set(OPERATIONS)
    if bad or not ops:
        raise ValueError(f"operations {', '.join(sorted(bad)) or '(none)'}: allowed "
                         f"{', '.join(OPERATIONS)}, all")
    return AclEntry(principal, rtype, name, prefix, frozenset(ops))
