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
    # Ops in call order; ``taken`` is a bit mask of the ops already linearized.
    ops = sorted(history, key=lambda o: o.called)
    inf = float("inf")
    ret = [o.returned if o.returned is not None else inf for o in ops]
    known = sum(1 for o in ops if o.returned is not None)
    seen: set[tuple[int, Any]] = set()
    # Depth-first: linearize a pending op whose call comes before every pending op's
    # return (else that op would have to take effect after a return that followed it).
    # Scanning in call order, the window ends at the first op called after the
    # smallest return seen so far: no later op can return earlier than it is called.
    stack = [(0, 0, 0, initial)]          # (taken, known ops taken, first op not taken, state)
    while stack:
        taken, done, first, state = stack.pop()
        if done == known:
            return True
        if (taken, state) in seen:
            continue
        seen.add((taken, state))
        while taken >> first & 1:
            first += 1
        horizon = inf
        for i in range(first, len(ops)):
            if ops[i].called > horizon:
                break
            if taken >> i & 1:
                continue
            horizon = min(horizon, ret[i])
        for i in range(first, len(ops)):
            if ops[i].called > horizon:
                break
            if taken >> i & 1:
                continue
            ok, after = _step(state, ops[i])
            if ok:
                stack.append((taken | 1 << i, done + (ops[i].returned is not None), first, after))
    return False
