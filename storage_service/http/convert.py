"""JSON <-> the service's protobuf messages, and gRPC status codes <-> HTTP statuses.

Bytes travel as text when they are UTF-8 (a JSON string), else as
``{"base64": "..."}``; a request may give either. Numbers stay JSON numbers
(protobuf's own JSON mapping writes 64-bit integers as strings).
"""
from __future__ import annotations

import base64
import binascii

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from ..proto import rmq_pb2
from ..protocol import framing

__all__ = ["BadRequest", "HTTP_STATUS", "INT32", "INT64", "bytes_json", "message_json", "messages_from_json",
           "parse_message", "records_json", "int_param", "int_value"]

# As grpc-gateway and Google's APIs map them.
HTTP_STATUS = {
    grpc.StatusCode.OK: 200, grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500, grpc.StatusCode.UNAUTHENTICATED: 401,
}
MESSAGE_FIELDS = ("key", "value", "tags", "properties")


INT32 = (1 << 31) - 1
INT64 = (1 << 63) - 1


class BadRequest(Exception):
    """A request the HTTP layer refuses before any call: INVALID_ARGUMENT naming ``field``
    (HTTP ``status``, 400 unless the problem has its own)."""

    def __init__(self, field: str, message: str, status: int = 400):
        super().__init__(f"{field}: {message}")
        self.field, self.status = field, status


def bytes_json(b: bytes | None, force_base64: bool = False):
    if b is None:
        return None
    if not force_base64:
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return {"base64": base64.b64encode(b).decode("ascii")}


def _bytes_from(field: str, v) -> bytes:
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, dict) and set(v) == {"base64"} and isinstance(v["base64"], str):
        try:
            return base64.b64decode(v["base64"], validate=True)
        except (binascii.Error, ValueError) as e:
            raise BadRequest(f"{field}.base64", f"not base64 ({e})") from None
    raise BadRequest(field, f"{type(v).__name__} given: use a string (UTF-8) or {{\"base64\": \"...\"}}")


def parse_message(i: int, m) -> rmq_pb2.Message:
    """One message of a produce body: {"key", "value", "tags", "properties"} (value null: a tombstone)."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise BadRequest(where, f"{type(m).__name__} given: each message is an object with "
                                f"{', '.join(MESSAGE_FIELDS)}")
    unknown = sorted(set(m) - set(MESSAGE_FIELDS))
    if unknown:
        raise BadRequest(f"{where}.{unknown[0]}", f"unknown field; a message has {', '.join(MESSAGE_FIELDS)}")
    if "value" not in m:
        raise BadRequest(f"{where}.value", "missing: give a string, {\"base64\": \"...\"}, or null "
                                           "(a tombstone)")
    out = rmq_pb2.Message()
    if m["value"] is None:
        out.null_value = True
    else:
        out.value = _bytes_from(f"{where}.value", m["value"])
    if m.get("key") is not None:
        out.key = _bytes_from(f"{where}.key", m["key"])
    tags = m.get("tags", "")
    if not isinstance(tags, str):
        raise BadRequest(f"{where}.tags", f"{type(tags).__name__} given: use a string")
    out.tags = tags
    props = m.get("properties") or {}
    if not isinstance(props, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in props.items()):
        raise BadRequest(f"{where}.properties", "use an object of string values")
    out.properties.update(props)
    return out


def messages_from_json(body, query_queue: int | None = None) -> tuple[list[rmq_pb2.Message], int | None, str, int]:
    """A produce body: a JSON array of messages, or {"messages": [...], "queue": N} with
    optionally "producer_id" and "sequence" (idempotent: a retry with the same pair is
    stored once; a queue must be given, in the body or as ``query_queue``, the URL's
    ``?queue=``, which wins). Returns (messages, queue, producer id, sequence)."""
    queue, producer, sequence = query_queue, "", 0
    if isinstance(body, dict):
        unknown = sorted(set(body) - {"messages", "queue", "producer_id", "sequence"})
        if unknown:
            raise BadRequest(unknown[0], "unknown field; the body is an array of messages or "
                                         "{\"messages\": [...], \"queue\": N, \"producer_id\": ..., "
                                         "\"sequence\": N}")
        if "queue" in body and body["queue"] is not None:
            if type(body["queue"]) is not int or not -1 <= body["queue"] <= INT32:
                raise BadRequest("queue", f"{body['queue']!r}: give a queue number (0 or more; -1: "
                                          "the service picks)")
            queue = body["queue"] if query_queue is None else query_queue
        if body.get("producer_id") is not None:
            producer = body["producer_id"]
            if not isinstance(producer, str) or not producer:
                raise BadRequest("producer_id", f"{producer!r}: give a non-empty string")
            if queue is None or queue < 0:
                raise BadRequest("producer_id", "an idempotent produce goes to one queue: give \"queue\" too")
            sequence = body.get("sequence")
            if type(sequence) is not int or not 0 <= sequence <= INT64:
                raise BadRequest("sequence", f"{sequence!r}: give the call's sequence, an integer 0 or more")
        elif "sequence" in body:
            raise BadRequest("sequence", "a sequence belongs to a producer: give \"producer_id\" too")
        body = body.get("messages")
    if not isinstance(body, list):
        raise BadRequest("messages", "give a JSON array of messages ({\"value\": ...}), or "
                                     "{\"messages\": [...], \"queue\": N}")
    return [parse_message(i, m) for i, m in enumerate(body)], queue, producer, sequence


def parse_into(body, message):
    """A JSON object into a protobuf message (its field names); errors name the field."""
    if not isinstance(body, dict):
        raise BadRequest("body", f"{type(body).__name__} given: give a JSON object")
    try:
        return json_format.ParseDict(body, message)
    except (json_format.ParseError, ValueError) as e:      # (ValueError: an integer out of range)
        raise BadRequest("body", str(e)) from None


def int_param(query, name: str, default: int | None = None, low: int | None = None,
              high: int = INT64) -> int:
    v = query.get(name)
    if v is None:
        if default is None:
            raise BadRequest(name, "missing: give an integer")
        return default
    return int_value(name, v, low, high)


def int_value(name: str, v, low: int | None = None, high: int = INT64) -> int:
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise BadRequest(name, f"{v!r} is not an integer") from None
    if low is not None and n < low:
        raise BadRequest(name, f"{n}: give {low} or more")
    if n > high:
        raise BadRequest(name, f"{n}: give at most {high}")
    return n


def message_json(msg) -> dict:
    """Every field of ``msg`` (defaults included) as JSON: numbers as numbers, bytes as ``bytes_json``."""
    out = {}
    for f in msg.DESCRIPTOR.fields:
        v = getattr(msg, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            vf = f.message_type.fields_by_name["value"]
            out[f.name] = {str(k): _value(vf, x) for k, x in v.items()}
        elif f.is_repeated:
            out[f.name] = [_value(f, x) for x in v]
        else:
            out[f.name] = _value(f, v)
    return out


def _value(f, v):
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        return message_json(v)
    if f.type == FieldDescriptor.TYPE_BYTES:
        return bytes_json(v)
    if f.type == FieldDescriptor.TYPE_ENUM:
        return f.enum_type.values_by_number[v].name if v in f.enum_type.values_by_number else v
    return v


def records_json(batches, start: int, limit: int, force_base64: bool = False) -> list[dict]:
    """Records of fetched ``batches`` from offset ``start`` on, at most ``limit``."""
    out = []
    for off, store_ts, key, value, tags, props, born in framing.iter_records_from(batches, start):
        out.append({"offset": off, "timestamp": store_ts, "born_timestamp": born,
                    "key": bytes_json(key, force_base64), "value": bytes_json(value, force_base64),
                    "tags": tags, "properties": props})
        if len(out) >= limit:
            break
    return out
