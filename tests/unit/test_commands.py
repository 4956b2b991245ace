"""Raft commands (storage_service.statemachine.commands): one encode, one decode, wave-1 bytes."""
from __future__ import annotations

import pickle

import pytest

from storage_service.statemachine.commands import (AlterTopic, CommitOffsets, CreateTopic, DeleteTopic, Drop, Lease,
                                                   Produce, ProduceItem, SetWatermark, Truncate, UnknownCommand,
                                                   decode_command)
from storage_service.statemachine.data import DataState
from storage_service.statemachine.meta import MetaState

pytestmark = pytest.mark.unit

ITEM = ProduceItem("t~abc~0", "p1", 7, 1700000000000, 2, b"\x00\x01records")
# Each command and the tuple wave 1 replicated for it, written out by hand.
CASES = [
    (Produce((ITEM, ProduceItem("t~abc~1", "", 0, 1700000000001, 1, b"r"))),
     ("produce", [("t~abc~0", "p1", 7, 1700000000000, 2, b"\x00\x01records"),
                  ("t~abc~1", "", 0, 1700000000001, 1, b"r")])),
    (Truncate("t~abc~0", 400), ("truncate", "t~abc~0", 400)),
    (Drop("t~abc~0"), ("drop", "t~abc~0")),
    (CreateTopic({"name": "t", "queues": 4}, 1700000000000), ("create_topic", {"name": "t", "queues": 4}, 1700000000000)),
    (AlterTopic("t", {"queues": 8}), ("alter_topic", "t", {"queues": 8})),
    (DeleteTopic("t"), ("delete_topic", "t")),
    (CommitOffsets("g", "t", {0: 5}), ("commit_offsets", "g", "t", {0: 5})),
    (SetWatermark("t", "archive", {1: 9}), ("set_watermark", "t", "archive", {1: 9})),
    (Lease("t", "tier", "job-1", 30_000, 1700000000000), ("lease", "t", "tier", "job-1", 30_000, 1700000000000)),
]


@pytest.mark.parametrize("cmd,wave1", CASES, ids=lambda c: type(c).__name__ if not isinstance(c, tuple) else "")
def test_encode_is_the_wave1_tuple_and_decodes_back(cmd, wave1):
    assert cmd.encode() == wave1
    # The journal holds the pickle: the same bytes as before the types existed.
    assert pickle.dumps(cmd.encode(), pickle.HIGHEST_PROTOCOL) == pickle.dumps(wave1, pickle.HIGHEST_PROTOCOL)
    assert decode_command(wave1) == cmd
    assert decode_command(pickle.loads(pickle.dumps(cmd.encode()))) == cmd


@pytest.mark.parametrize("raw,why", [
    (("snapshot_all",), "unknown command 'snapshot_all'"),
    (("truncate", "q"), "command 'truncate' of the wrong shape"),
    (("drop", "a", "b"), "command 'drop' of the wrong shape"),
    ((), "not a command"),
    ("produce", "not a command"),
    ((3, 4), "not a command"),
])
def test_decode_refuses_what_it_cannot_read(raw, why):
    with pytest.raises(UnknownCommand, match=why):
        decode_command(raw)


def test_state_machines_answer_unknown_and_foreign_commands_without_raising(tmp_path):
    data, meta = DataState(str(tmp_path / "q")), MetaState()
    assert data.apply(1, ("snapshot_all",)) == ("error", "unknown command 'snapshot_all'")
    assert data.apply(2, DeleteTopic("t").encode()) == ("error", "command 'delete_topic' is not for a data group")
    assert meta.apply(1, Drop("q").encode()) == ("error", "INVALID_ARGUMENT",
                                                 "command 'drop' is not for the metadata group")
    assert meta.apply(2, ("nope", 1)) == ("error", "INVALID_ARGUMENT", "unknown command 'nope'")
    assert meta.topics == {} and data.queues == {}
    data.close()


def test_a_truncated_entry_is_an_unknown_command_not_a_crash():
    with pytest.raises(UnknownCommand, match="command 'produce' of the wrong shape"):
        decode_command(("produce",))


def test_a_fenced_watermark_carries_its_token_and_a_wave1_one_decodes_without():
    fenced = SetWatermark("t", "archive", {0: 5}, 42)
    assert fenced.encode() == ("set_watermark", "t", "archive", {0: 5}, 42)
    assert decode_command(fenced.encode()) == fenced
    assert decode_command(("set_watermark", "t", "archive", {0: 5})).lease_token is None


def test_a_rack_is_recorded_for_a_known_node_and_kept_in_the_snapshot():
    from storage_service.statemachine.commands import SetNode, SetRack
    meta = MetaState()
    assert meta.apply(1, SetRack("n9:1", "r0").encode())[:2] == ("error", "NOT_FOUND")
    assert meta.apply(2, SetNode("n1:1", "active", 0).encode())[0] == "ok"
    too_long = meta.apply(3, SetRack("n1:1", "r" * 65).encode())
    assert too_long[:2] == ("error", "INVALID_ARGUMENT") and "at most 64" in too_long[2]
    assert meta.apply(4, SetRack("n1:1", "r0").encode()) == ("ok", "r0")
    again = MetaState()
    again.restore(meta.snapshot(), 4, None)
    assert again.placement()[0]["n1:1"]["rack"] == "r0"
