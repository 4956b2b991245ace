"""Bit rot: corrupt bytes are never served, are answered from a healthy copy, and are repaired.

Unit-level checks of what finds the rot (journal, segment open, index landing),
then ``make jepsen``'s bit-rot scenario, bounded: bytes flipped in a sealed
segment and an offset index of a group's leader and in a sealed segment and a
live raft journal record of a follower, the cluster restarted under load.
"""
from __future__ import annotations


import pytest

from storage_service.log.queue_log import QueueLog
from storage_service.log.segment import check_segment
from storage_service.protocol.framing import CorruptBatch, frame_batch, iter_batches
from storage_service.raft.journal import DurableJournal

from .node_faults import bounded, flip
from .unit._helpers import encode_values


def _journal(path: str, n: int) -> DurableJournal:
    j = DurableJournal(path, "none")
    for i in range(1, n + 1):
        j.add(b"command-%04d" % i * 20, i, 1)
    j.sync()
    return j


@pytest.mark.unit
def test_journal_record_rotten_in_the_middle_is_told_from_a_torn_tail(tmp_path):
    path = str(tmp_path / "raft")
    j = _journal(path, 40)
    k = 20
    at = (j._ends[k - 1] + j._ends[k]) // 2           # inside entry k + 1's record
    wal = j.file_path
    j._destroy()
    flip(wal, at)
    again = DurableJournal(path, "none")
    assert again.last_idx == k and again.lost_through == 40
    again._destroy()

    torn = str(tmp_path / "torn")
    t = _journal(torn, 40)
    end = t._ends[-1]
    wal = t.file_path
    t._destroy()
    with open(wal, "r+b") as f:                        # the last record cut short: a crash, not rot
        f.truncate(end - 10)
    again = DurableJournal(torn, "none")
    assert again.last_idx == 39 and again.lost_through == 0


def _queue(tmp_path) -> QueueLog:
    q = QueueLog(str(tmp_path / "t~1~0"), segment_bytes=64 << 10, index_interval=4 << 10)
    for _ in range(200):
        base = q.next_offset
        f = frame_batch(base, 1000 + base, 10, base + 1, encode_values([b"x" * 100] * 10))
        q.append(f, next(iter_batches(f)))
    return q


@pytest.mark.unit
def test_a_rotten_sealed_segment_is_found_at_open_and_an_index_entry_never_skips(tmp_path):
    q = _queue(tmp_path)
    sealed = q.segments[0]
    last_offset = sealed.next_offset - 1
    q.close()
    flip(sealed.file("log"), sealed.size - 50)          # in its last batch: the part a start reads
    # An offset-index entry of the second segment made to point one batch further on.
    idx = q.segments[1].file("idx")
    with open(idx, "r+b") as f:
        f.seek(16 * 2 + 8)
        pos = int.from_bytes(f.read(8), "little")
        f.seek(16 * 2 + 8)
        f.write((pos + 1).to_bytes(8, "little"))
    again = QueueLog(q.path, segment_bytes=64 << 10, index_interval=4 << 10)
    assert [s.damaged for s in again.segments][:2] == [True, False]
    assert again.segments[0].next_offset == again.segments[1].base      # its end from the next one
    with pytest.raises(CorruptBatch):
        again.read(last_offset, 1 << 20)
    whole, index_ok, _ = check_segment(again.segments[1], again.segments[1].size)
    assert whole and not index_ok
    with open(idx, "rb") as f:
        entry_offset = int.from_bytes(f.read(48)[32:40], "little")
    with pytest.raises(CorruptBatch):                   # never a read that starts past the offset
        again.read(entry_offset, 1 << 20)


@pytest.mark.integration
def test_bit_rot_scenario_bounded(tmp_path):
    rep = bounded("bit-rot", str(tmp_path), seconds=15)
    assert rep.measured["segments_repaired"] >= 1 and rep.measured["indexes_rebuilt"] >= 1, rep.measured
    assert any("journal" in f for f in rep.faults), rep.faults
