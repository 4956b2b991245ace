"""Plain data types returned by the client."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Message", "Record", "ProduceResult", "FetchResult", "QueueOffsets", "msg_id"]


@dataclass
class Message:
    """A message to produce. ``value=None`` is a tombstone (Kafka's delete
    marker, kept distinct from an empty value); the rest is optional."""
    value: bytes | None
    key: bytes | None = None
    tags: str = ""
    properties: dict[str, str] = field(default_factory=dict)
    born_timestamp: int = 0


@dataclass(frozen=True, slots=True)
class Record:
    """A stored message as read back, with the fields the service assigned."""
    topic: str
    queue: int
    offset: int
    key: bytes | None
    value: bytes | None          # None: a tombstone
    tags: str
    properties: dict[str, str]
    born_timestamp: int
    store_timestamp: int
    msg_id: str


@dataclass(frozen=True)
class ProduceResult:
    queue: int
    base_offset: int       # -1 when a duplicate's original offsets are no longer known
    count: int
    store_timestamp: int
    duplicate: bool


@dataclass(frozen=True)
class FetchResult:
    records: list[Record]
    next_offset: int
    earliest: int
    latest: int
    served_by: str


@dataclass(frozen=True)
class QueueOffsets:
    queue: int
    earliest: int
    latest: int


def msg_id(topic: str, queue: int, offset: int) -> str:
    """Deterministic message id: topic hash, queue and offset, in hex."""
    import zlib
    return f"{zlib.crc32(topic.encode()):08X}{queue:04X}{offset:016X}"
