"""The offsets codec: ``{"topic": {"queue": offset}}`` JSON <-> ``{topic: {queue: offset}}``.

The same shape carries the user's ``startingOffsets``/``endingOffsets``
(where -2 means earliest and -1 latest), the ``...ByTimestamp`` options
(milliseconds instead of offsets) and the streaming offsets Spark writes to
the checkpoint (always concrete offsets: the next offset to read).

Spark compares streaming offsets as JSON text, so ``to_spark`` always emits
topics and queues in sorted order: equal positions give equal text.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

__all__ = ["Positions", "EARLIEST", "LATEST", "parse_json", "to_spark", "from_spark", "dumps"]

Positions = dict[str, dict[int, int]]
EARLIEST = -2
LATEST = -1


def parse_json(text: str, option: str, minimum: int) -> Positions:
    """Parse and check an offsets (or timestamps) JSON option.

    Raises ``ValueError`` with the reason; the caller names the option.
    ``minimum`` is the smallest value allowed (-2, -1 or 0).
    """
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at character {e.pos}); "
                         'expected {"topic": {"queue": value}}') from e
    if not isinstance(raw, dict) or not raw:
        raise ValueError('expected a non-empty JSON object {"topic": {"queue": value}}')
    out: Positions = {}
    for topic, queues in raw.items():
        if not isinstance(queues, dict) or not queues:
            raise ValueError(f'topic {topic!r}: expected a non-empty object {{"queue": value}}')
        out[topic] = {_queue(topic, q): _value(topic, q, v, minimum) for q, v in queues.items()}
    return out


def _queue(topic: str, q: str) -> int:
    if not (isinstance(q, str) and q.isdigit()):
        raise ValueError(f"topic {topic!r}: queue {q!r} is not a non-negative integer")
    return int(q)


def _value(topic: str, q: str, v: Any, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        allowed = {-2: "an offset >= 0, -2 (earliest) or -1 (latest)",
                   -1: "an offset >= 0 or -1 (latest)", 0: "an integer >= 0"}[minimum]
        raise ValueError(f"topic {topic!r} queue {q}: {v!r} is not {allowed}")
    return v


def to_spark(positions: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    """Positions -> the JSON-ready dict Spark stores (sorted, string queue keys)."""
    return {t: {str(q): int(positions[t][q]) for q in sorted(positions[t])}
            for t in sorted(positions)}


def from_spark(offsets: Mapping[str, Mapping[str, int]] | None) -> Positions:
    """The dict Spark hands back (string queue keys) -> positions."""
    return {t: {int(q): int(o) for q, o in qs.items()} for t, qs in (offsets or {}).items()}


def dumps(positions: Mapping[str, Mapping[int, int]]) -> str:
    return json.dumps(to_spark(positions), separators=(",", ":"))
