"""The JSON shape of a message on the command line, both ways.

``rmq produce --json`` reads and ``rmq consume --json`` writes one object per
line. Keys and values are bytes in the log; in JSON they are:

* ``null``: no key, or for a value a tombstone (Kafka's delete marker);
* a string: its UTF-8 bytes;
* ``{"base64": "..."}`` (an object with that one field): the decoded bytes,
  for anything that is not UTF-8;
* any other object, array, number or boolean: its JSON text, compact
  (``{"a": 1}`` is stored as the 7 bytes ``{"a":1}``).

Consume prints a string where the bytes are UTF-8 and ``{"base64": ...}``
where not, so ``rmq consume T --json | rmq produce T2 --json`` stores the
same keys, values, tags, properties and born timestamps. The other fields
consume prints (topic, queue, offset, store timestamp, message id) are the
log's to assign and are ignored by produce.
"""
from __future__ import annotations

import base64
import binascii
import json

from ..client import Message

__all__ = ["BadLine", "message_from_json", "message_from_text", "record_to_json"]

FIELDS = ("value", "key", "tags", "properties", "born_timestamp")
ASSIGNED = ("topic", "queue", "offset", "store_timestamp", "msg_id")   # consume's, ignored here


class BadLine(ValueError):
    """An input line that is not a message: ``lineno`` and what was wrong."""

    def __init__(self, lineno: int, why: str):
        super().__init__(f"line {lineno}: {why}")
        self.lineno = lineno


def _bytes(v, what: str, lineno: int) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, str):
        try:
            return v.encode()
        except UnicodeEncodeError as e:       # a lone surrogate escape such as "\ud800"
            raise BadLine(lineno, f"{what}: not encodable as UTF-8 ({e.reason}); use "
                                  '{"base64": ...} for bytes') from None
    if isinstance(v, dict) and set(v) == {"base64"}:
        if not isinstance(v["base64"], str):
            raise BadLine(lineno, f'{what}: "base64" must be a string')
        try:
            return base64.b64decode(v["base64"], validate=True)
        except (binascii.Error, ValueError) as e:
            raise BadLine(lineno, f"{what}: not valid base64 ({e})") from None
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode()


def message_from_json(line: str, lineno: int) -> Message:
    """One ``--json`` input line as a message (BadLine names what is wrong)."""
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise BadLine(lineno, f"not valid JSON ({e})") from None
    if not isinstance(obj, dict) or "value" not in obj:
        raise BadLine(lineno, 'expected an object with at least "value" (null for a tombstone)')
    unknown = set(obj) - set(FIELDS) - set(ASSIGNED)
    if unknown:
        raise BadLine(lineno, f"unknown fields {sorted(unknown)}; allowed: {', '.join(FIELDS)} "
                              f"(and {', '.join(ASSIGNED)}, which are ignored)")
    tags, props, born = obj.get("tags") or "", obj.get("properties") or {}, obj.get("born_timestamp") or 0
    if not isinstance(tags, str):
        raise BadLine(lineno, "tags must be a string")
    if not isinstance(props, dict) or not all(isinstance(v, str) for v in props.values()):
        raise BadLine(lineno, "properties must be an object of string values")
    if not isinstance(born, int) or isinstance(born, bool) or born < 0:
        raise BadLine(lineno, "born_timestamp must be ms since the epoch (an integer >= 0)")
    return Message(value=_bytes(obj["value"], "value", lineno), key=_bytes(obj.get("key"), "key", lineno),
                   tags=tags, properties=props, born_timestamp=born)


def message_from_text(line: bytes, lineno: int) -> bytes:
    """A plain input line: its bytes, once they are known to be UTF-8."""
    try:
        line.decode()
    except UnicodeDecodeError as e:
        raise BadLine(lineno, f"not valid UTF-8 (byte {e.start}); use --json with "
                              '{"value": {"base64": ...}} for binary values') from None
    return line


def _text(b: bytes | None):
    if b is None:
        return None
    try:
        return b.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(b).decode()}


def record_to_json(r) -> str:
    """A stored record as one line of ``rmq consume --json``."""
    return json.dumps({"topic": r.topic, "queue": r.queue, "offset": r.offset, "key": _text(r.key),
                       "value": _text(r.value), "tags": r.tags, "properties": r.properties,
                       "born_timestamp": r.born_timestamp, "store_timestamp": r.store_timestamp,
                       "msg_id": r.msg_id}, ensure_ascii=False)
