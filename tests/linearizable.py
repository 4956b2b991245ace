"""A linearizability checker for one register (issue 40), in the manner of Porcupine
(Wing and Gong's search, with Lowe's memoization of the states already tried).

A history is a list of ``Op``: who called what, when it was called and when it
returned (``returned`` None: the outcome is unknown, a timeout or a lost answer:
it may have taken effect at any point after its call, or never). The register
holds a value; every write writes a value no other write writes, so a
compare-and-set on a revision is one on the value read with that revision.

* ``("read", None) -> value``    (None: the key has no value)
* ``("write", v) -> True``
* ``("cas", (expected, v)) -> True | False``   (False: a conflict, nothing written)

``linearizable(history)`` says whether some order of the operations, each
taking effect between its call and its return, explains every result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Op", "linearizable"]


@dataclass(frozen=True)
class Op:
    client: int
    kind: str                      # read, write, cas
    arg: Any
    result: Any
    called: float
    returned: float | None         # None: unknown outcome


def _step(state, op: Op):
    """(ok, the state after ``op``) under the register model."""
    if op.kind == "read":
        return op.result == state, state
    if op.kind == "write":
        return True, op.arg
    expected, value = op.arg
    if op.returned is None:          # unknown: it took effect only if it could
        return state == expected, value
    if op.result:
        return state == expected, value
    return state != expected, state


def linearizable(history: list[Op], initial: Any = None) -> bool:
    ops = list(history)
    done = [i for i, o in enumerate(ops) if o.returned is not None]
    inf = float("inf")
    ret = [o.returned if o.returned is not None else inf for o in ops]
    seen: set[tuple[frozenset, Any]] = set()
    # Depth-first: linearize a pending op whose call comes before every pending op's
    # return (else that op would have to take effect after a return that followed it).
    stack = [(frozenset(), initial)]
    while stack:
        taken, state = stack.pop()
        if all(i in taken for i in done):
            return True
        if (taken, state) in seen:
            continue
        seen.add((taken, state))
        pending = [i for i in range(len(ops)) if i not in taken]
        horizon = min(ret[i] for i in pending)
        for i in pending:
            if ops[i].called > horizon:
                continue
            ok, after = _step(state, ops[i])
            if ok:
                stack.append((taken | {i}, after))
    return False
