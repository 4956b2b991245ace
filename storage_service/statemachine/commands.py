"""Raft commands: what a raft entry asks a state machine to do, as typed values.

Each command has one ``encode`` (to the tuple raft replicates: pysyncobj
pickles it into the journal, the snapshot's boundary entries and the
append messages) and one ``decode`` (``decode_command``), so a command is
written and read in exactly one place. The tuples are the ones wave 1
wrote, field for field (``("produce", [item, ...])``, ``("truncate", queue,
offset)``, ...): a data directory written before these types existed
replays unchanged (``tests/test_datadir_compat.py``), and its pickled bytes
are the same (``tests/unit/test_commands.py``).

Apply never raises on a command it cannot read: ``UnknownCommand`` is
answered as an error result, the same on every replica.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Union

__all__ = ["AlterTopic", "CommitOffsets", "CreateTopic", "DataCommand", "DeleteTopic", "Drop", "Lease",
           "MetaCommand", "Produce", "ProduceItem", "RequestRebalance", "SetNode", "SetRack", "SetPrincipal", "ChangeAcls", "SetPlacement", "SetReplicas", "SetWatermark",
           "Truncate", "UnknownCommand",
           "decode_command"]


class UnknownCommand(ValueError):
    """A raft entry whose command this version does not know (or of the wrong shape)."""


class _Command:
    """A command replicated as ``(KIND, field, field, ...)`` in field order."""
    __slots__ = ()
    KIND: ClassVar[str]

    def encode(self) -> tuple:
        return (self.KIND, *(getattr(self, f.name) for f in fields(self)))


# ------------------------------------------------------------------ data group
@dataclass(frozen=True, slots=True)
class ProduceItem:
    """One validated batch for one queue: the records block as the client sent it."""
    queue_dir: str          # statemachine.data.queue_dir(topic, incarnation, queue)
    producer_id: str        # "" = not idempotent
    sequence: int
    store_ts: int           # the leader's clock when it proposed; apply keeps it non-decreasing
    count: int
    records: bytes          # protocol.records block
    # Refuse the batch (OUT_OF_ORDER) when the producer is known on the queue and
    # ``sequence`` is past the next one expected: a pipelined producer's batch must
    # not be stored before an earlier one that failed (see DataState._apply_batch).
    in_order: bool = False
    # A key-value write's condition (issue 40, ``statemachine/kv.py``): ("absent",) or
    # ("revision", N), decided at apply against the queue's key index; None: none.
    condition: tuple | None = None

    def encode(self) -> tuple:
        head = (self.queue_dir, self.producer_id, self.sequence, self.store_ts, self.count, self.records)
        if self.condition is not None:
            return head + (self.in_order, self.condition)
        return head + (True,) if self.in_order else head      # wave 1's tuple when not in order


@dataclass(frozen=True, slots=True)
class Produce:
    """Batches that share one raft entry (group commit); each is applied at its own position."""
    KIND: ClassVar[str] = "produce"
    items: tuple[ProduceItem, ...]

    def encode(self) -> tuple:
        return (self.KIND, [i.encode() for i in self.items])

    @classmethod
    def _decode(cls, raw: tuple) -> "Produce":
        _, items = raw
        return cls(tuple(ProduceItem(*item) for item in items))


@dataclass(frozen=True, slots=True)
class Truncate(_Command):
    """Retention: move a queue's earliest offset up to ``offset``."""
    KIND: ClassVar[str] = "truncate"
    queue_dir: str
    offset: int


@dataclass(frozen=True, slots=True)
class Drop(_Command):
    """Remove a queue of a deleted topic, files and producer state."""
    KIND: ClassVar[str] = "drop"
    queue_dir: str


# -------------------------------------------------------------- metadata group
@dataclass(frozen=True, slots=True)
class CreateTopic(_Command):
    KIND: ClassVar[str] = "create_topic"
    config: dict            # name, queues and the settings given; defaults filled in by apply
    created_ms: int


@dataclass(frozen=True, slots=True)
class AlterTopic(_Command):
    KIND: ClassVar[str] = "alter_topic"
    name: str
    changes: dict


@dataclass(frozen=True, slots=True)
class DeleteTopic(_Command):
    KIND: ClassVar[str] = "delete_topic"
    name: str


@dataclass(frozen=True, slots=True)
class CommitOffsets(_Command):
    KIND: ClassVar[str] = "commit_offsets"
    consumer_group: str
    topic: str
    offsets: dict           # queue -> next offset


@dataclass(frozen=True, slots=True)
class SetWatermark(_Command):
    KIND: ClassVar[str] = "set_watermark"
    topic: str
    kind: str               # archive, archive_earliest, compaction
    offsets: dict           # queue -> offset; only moves forward
    lease_token: int | None = None   # archive kinds: the tier lease's token (None: a wave-1 entry)

    def encode(self) -> tuple:
        head = (self.KIND, self.topic, self.kind, self.offsets)
        return head if self.lease_token is None else (*head, self.lease_token)


@dataclass(frozen=True, slots=True)
class Lease(_Command):
    """Take, renew (``ttl_ms`` > 0) or release (0) ``owner``'s lease on (topic, kind)."""
    KIND: ClassVar[str] = "lease"
    topic: str
    kind: str
    owner: str
    ttl_ms: int
    now_ms: int             # the proposing leader's clock: every replica decides alike


@dataclass(frozen=True, slots=True)
class SetPlacement(_Command):
    """The cluster's nodes and each data group's replicas (gRPC addresses).

    ``init``: the placement of a cluster's first start, which every founding
    node computed alike; applied only while none is recorded."""
    KIND: ClassVar[str] = "set_placement"
    nodes: tuple
    replicas: dict          # data group -> [address, ...]
    init: bool = False


@dataclass(frozen=True, slots=True)
class SetReplicas(_Command):
    """A data group's wanted replicas (the controller moves raft's membership to them)."""
    KIND: ClassVar[str] = "set_replicas"
    group: int
    replicas: tuple
    expect: tuple           # the record this change was planned from: applied only if it still holds


@dataclass(frozen=True, slots=True)
class SetNode(_Command):
    """Add a node to the cluster's record, or change its state (active, leaving, removed)."""
    KIND: ClassVar[str] = "set_node"
    address: str
    state: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class SetRack(_Command):
    """Record a node's rack (``rmq-storage node --rack``): its replicas' placement
    keeps each group's replicas on distinct racks (``cluster/racks.py``)."""
    KIND: ClassVar[str] = "set_rack"
    address: str
    rack: str


@dataclass(frozen=True, slots=True)
class RequestRebalance(_Command):
    """Ask the controller to even out replicas and leaders once (``rmq cluster rebalance``),
    or (``done``: the request's raft index) record that it did."""
    KIND: ClassVar[str] = "request_rebalance"
    now_ms: int
    done: int = 0


@dataclass(frozen=True, slots=True)
class SetPrincipal(_Command):
    """Create (``rotate``: or give a new token version to) a principal, or delete it
    (``delete``): tokens carry the version they were made for (security/tokens.py)."""
    KIND: ClassVar[str] = "set_principal"
    name: str
    now_ms: int
    rotate: bool = False
    delete: bool = False


@dataclass(frozen=True, slots=True)
class ChangeAcls(_Command):
    """Allow (``add``) or stop allowing operations: entries (principal, resource type,
    name, prefix, operations) as ``security.acl.AclEntry.key()`` + ops."""
    KIND: ClassVar[str] = "change_acls"
    add: bool
    entries: tuple


DataCommand = Union[Produce, Truncate, Drop]
MetaCommand = Union[CreateTopic, AlterTopic, DeleteTopic, CommitOffsets, SetWatermark, Lease, SetPlacement,
                    SetReplicas, SetNode, SetRack, RequestRebalance, SetPrincipal, ChangeAcls]
_TYPES = {t.KIND: t for t in (Produce, Truncate, Drop, CreateTopic, AlterTopic, DeleteTopic, CommitOffsets,
                              SetWatermark, Lease, SetPlacement, SetReplicas, SetNode, SetRack, RequestRebalance,
                              SetPrincipal, ChangeAcls)}


def decode_command(raw) -> DataCommand | MetaCommand:
    """The typed command of a replicated tuple (UnknownCommand if it is none)."""
    if not isinstance(raw, (tuple, list)) or not raw or not isinstance(raw[0], str):
        raise UnknownCommand(f"not a command: {type(raw).__name__}")
    cls = _TYPES.get(raw[0])
    if cls is None:
        raise UnknownCommand(f"unknown command {raw[0]!r}")
    try:
        decode = getattr(cls, "_decode", None)
        return decode(raw) if decode else cls(*raw[1:])
    except (TypeError, ValueError) as e:
        raise UnknownCommand(f"command {raw[0]!r} of the wrong shape: {e}") from None
