"""DurableJournal: pysyncobj's Journal interface on CRC-framed, epoch-stamped records in two
recycled files (storage_service.raft.journal)."""
from __future__ import annotations

import os

import pytest

from storage_service.raft.journal import FSYNC_POLICIES, DurableJournal

pytestmark = pytest.mark.unit


@pytest.fixture
def jpath(tmp_path):
    return str(tmp_path / "raft")


def _entries(j: DurableJournal) -> list[tuple[bytes, int, int]]:
    return [j[i] for i in range(len(j))]


def _filled(jpath, n: int = 5, fsync: str = "none") -> DurableJournal:
    j = DurableJournal(jpath, fsync)
    for i in range(1, n + 1):
        j.add(b"cmd-%d" % i, i, 1 + i // 3)
    j.sync()
    return j


def _reopen(j: DurableJournal, jpath) -> DurableJournal:
    j._destroy()
    return DurableJournal(jpath, "none")


def test_new_journal_is_empty_with_defaults(jpath):
    j = DurableJournal(jpath)
    assert len(j) == 0
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (0, None, 1)


def test_add_getitem_len(jpath):
    j = _filled(jpath, 3)
    assert len(j) == 3
    assert j[0] == (b"cmd-1", 1, 1)
    assert j[-1] == (b"cmd-3", 3, 2)
    assert _entries(j) == [(b"cmd-1", 1, 1), (b"cmd-2", 2, 1), (b"cmd-3", 3, 2)]


def test_add_accepts_bytearray_and_memoryview(jpath):
    j = DurableJournal(jpath, "none")
    j.add(bytearray(b"ab"), 1, 1)
    j.add(memoryview(b"cd"), 2, 1)
    assert [j[0][0], j[1][0]] == [b"ab", b"cd"]
    assert all(type(e[0]) is bytes for e in _entries(j))


def test_slicing_works_like_a_list(jpath):
    j = _filled(jpath, 5)
    assert [e[1] for e in j[1:3]] == [2, 3]


def test_delete_entries_from_drops_the_tail(jpath):
    j = _filled(jpath, 5)
    j.deleteEntriesFrom(2)
    assert [e[1] for e in _entries(j)] == [1, 2]
    j.add(b"new", 3, 7)
    assert _entries(j)[-1] == (b"new", 3, 7)


def test_delete_entries_from_survives_reopen(jpath):
    j = _filled(jpath, 5)
    j.deleteEntriesFrom(2)
    j.add(b"new", 3, 7)
    j2 = _reopen(j, jpath)
    assert [(e[0], e[1]) for e in _entries(j2)] == [(b"cmd-1", 1), (b"cmd-2", 2), (b"new", 3)]


def test_delete_entries_from_zero_empties_the_journal(jpath):
    j = _filled(jpath, 5)
    j.deleteEntriesFrom(0)
    assert (len(j), j.size_bytes) == (0, 0)
    assert len(_reopen(j, jpath)) == 0


def test_delete_entries_from_past_the_end_is_a_no_op(jpath):
    j = _filled(jpath, 3)
    size = j.size_bytes
    j.deleteEntriesFrom(3)
    j.deleteEntriesFrom(10)
    assert (len(j), j.size_bytes) == (3, size)


def test_delete_entries_to_drops_the_head(jpath):
    j = _filled(jpath, 5)
    j.deleteEntriesTo(3)
    assert [e[1] for e in _entries(j)] == [4, 5]
    j.add(b"cmd-6", 6, 3)
    assert [e[1] for e in _entries(_reopen(j, jpath))] == [4, 5, 6]


def test_delete_entries_to_moves_the_kept_entries_to_the_other_file(jpath):
    j = _filled(jpath, 5)
    before, first = j.size_bytes, j.file_path
    j.deleteEntriesTo(4)
    assert j.size_bytes < before and j.file_path != first
    j.add(b"cmd-6", 6, 3)
    j.deleteEntriesTo(1)
    assert j.file_path == first                   # back to the first file, overwritten
    assert os.path.getsize(first) == before       # never shrunk: its blocks stay written
    assert _entries(_reopen(j, jpath)) == [(b"cmd-6", 6, 3)]


def test_clear_empties_and_stays_usable(jpath):
    j = _filled(jpath, 5)
    j.clear()
    assert (len(j), j.size_bytes) == (0, 0)
    j.add(b"again", 9, 4)
    assert _entries(_reopen(j, jpath)) == [(b"again", 9, 4)]


def test_reopen_preserves_entries(jpath):
    j = _filled(jpath, 5)
    want = _entries(j)
    assert _entries(_reopen(j, jpath)) == want


def test_reopen_preserves_term_and_vote(jpath):
    j = DurableJournal(jpath)
    j.setCurrentTerm(7, "node-2")
    j2 = _reopen(j, jpath)
    assert (j2.getCurrentTerm(), j2.getVotedForNodeId()) == (7, "node-2")


def test_reopen_preserves_commit_index_stored_by_the_timer(jpath):
    j = _filled(jpath, 5)
    j.setRaftCommitIndex(4)
    assert j.getRaftCommitIndex() == 4
    j.onOneSecondTimer()
    assert _reopen(j, jpath).getRaftCommitIndex() == 4


def test_set_current_term_keeps_commit_index(jpath):
    j = DurableJournal(jpath)
    j.setRaftCommitIndex(3)
    j.setCurrentTerm(2, None)
    j2 = _reopen(j, jpath)
    assert (j2.getCurrentTerm(), j2.getVotedForNodeId(), j2.getRaftCommitIndex()) == (2, None, 3)


def test_torn_tail_is_dropped_on_reopen(jpath):
    j = _filled(jpath, 5)
    j._destroy()
    with open(j.file_path, "r+b") as f:
        f.truncate(os.path.getsize(j.file_path) - 3)
    j2 = DurableJournal(jpath, "none")
    assert [e[1] for e in _entries(j2)] == [1, 2, 3, 4]
    j2.add(b"cmd-5b", 5, 9)
    assert _entries(_reopen(j2, jpath))[-1] == (b"cmd-5b", 5, 9)


def test_corrupt_tail_is_dropped_and_appends_continue(jpath):
    j = _filled(jpath, 5)
    j._destroy()
    with open(j.file_path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    j2 = DurableJournal(jpath, "none")
    assert [e[1] for e in _entries(j2)] == [1, 2, 3, 4]
    j2.add(b"cmd-5b", 5, 9)
    assert _entries(_reopen(j2, jpath))[-1] == (b"cmd-5b", 5, 9)


@pytest.mark.parametrize("damage", ["unreadable", "missing"])
def test_a_journal_without_its_meta_file_refuses_to_open(jpath, damage):
    # The meta file names the live file, its base epoch and the CRC salt:
    # without it the stale file could be read as the journal.
    _filled(jpath, 2)._destroy()
    if damage == "missing":
        os.remove(jpath + ".meta")
    else:
        with open(jpath + ".meta", "w") as f:
            f.write("{not json")
    with pytest.raises(RuntimeError, match=r"raft\.meta is missing or unreadable.*data directory"):
        DurableJournal(jpath, "none")


def test_unreadable_meta_of_a_new_journal_falls_back_to_defaults(jpath):
    with open(jpath + ".meta", "w") as f:
        f.write("{not json")
    j = DurableJournal(jpath, "none")
    assert (len(j), j.getCurrentTerm(), j.getRaftCommitIndex()) == (0, 0, 1)


def test_size_bytes_counts_the_live_entries(jpath):
    j = _filled(jpath, 5)
    assert j.size_bytes == os.path.getsize(j.file_path) > 0
    j.deleteEntriesFrom(3)
    assert 0 < j.size_bytes < os.path.getsize(j.file_path)


@pytest.mark.parametrize("policy", FSYNC_POLICIES)
def test_every_fsync_policy_persists_on_close(jpath, policy):
    j = _filled(jpath, 3, fsync=policy)
    assert len(_reopen(j, jpath)) == 3


@pytest.mark.parametrize("bad", ["sometimes", "", "ALWAYS", None])
def test_invalid_fsync_policy_names_the_allowed_values(jpath, bad):
    with pytest.raises(ValueError) as e:
        DurableJournal(jpath, bad)
    assert all(p in str(e.value) for p in FSYNC_POLICIES)
    assert not os.listdir(os.path.dirname(jpath))


# ------------------------------------------------ durable_idx (syncs from another thread)
def _recording_fdatasync(monkeypatch, j) -> list[int]:
    calls = []
    real = os.fdatasync

    def fdatasync(fd):
        calls.append(j.last_idx)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return calls


def test_an_entry_counts_as_durable_only_after_a_sync_that_covers_it(jpath, monkeypatch):
    j = DurableJournal(jpath)
    j.add(b"\x01", 1, 0)
    j.sync()
    calls = _recording_fdatasync(monkeypatch, j)
    remember = j._remember

    def sync_in_the_middle_of_add(idx, cmd):
        # the syncer thread takes the GIL after the entry is visible
        remember(idx, cmd)
        j.sync_behind()

    j._remember = sync_in_the_middle_of_add
    j.add(b"x" * 100, 2, 1)
    assert j.durable_idx == 2 and calls == [2]    # claimed only with an fdatasync behind it


def test_sync_behind_does_not_claim_entries_added_after_it_began(jpath, monkeypatch):
    j = _filled(jpath, 3, fsync="always")
    real = os.fdatasync

    def fdatasync(fd):
        if j.last_idx == 3:
            j.add(b"late", 4, 2)                  # written while the sync runs
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    j._dirty = True
    j.sync_behind()
    assert (j.durable_idx, j.last_idx) == (3, 4)
    j.sync_behind()
    assert j.durable_idx == 4


def test_a_reopened_journal_syncs_what_it_read_before_calling_it_durable(jpath, monkeypatch):
    # After kill -9 the unsynced tail is in the page cache and reads back.
    j = _filled(jpath, 3, fsync="always")
    j.add(b"unsynced", 4, 2)
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    reopened = DurableJournal(jpath, "always")
    assert reopened.durable_idx == 4 and synced
    monkeypatch.undo()
    j._destroy()


def test_truncation_moves_durable_idx_back_and_counts(jpath):
    j = _filled(jpath, 5, fsync="always")
    j.sync()
    assert (j.durable_idx, j.truncations) == (5, 0)
    j.deleteEntriesFrom(2)                        # entries 3..5 go
    assert (j.durable_idx, j.last_idx, j.truncations) == (2, 2, 1)
    j.clear()
    assert (j.durable_idx, j.truncations) == (0, 2)


# ------------------------------------------------ recycled files: old records never come back
def test_truncated_entries_do_not_come_back_when_a_new_entry_ends_where_they_began(jpath):
    # Same-size entries: after the truncation, entry 3b ends exactly where the
    # dropped entry 4 begins, a well-formed record with a valid CRC.
    j = _filled(jpath, 5)
    j.deleteEntriesFrom(2)
    j.add(b"cmd-X", 3, 7)
    assert [(e[0], e[1]) for e in _entries(_reopen(j, jpath))] == [(b"cmd-1", 1), (b"cmd-2", 2), (b"cmd-X", 3)]


def test_truncated_entries_do_not_come_back_without_new_appends(jpath):
    j = _filled(jpath, 5)
    j.deleteEntriesFrom(2)
    assert [e[1] for e in _entries(_reopen(j, jpath))] == [1, 2]


def test_a_recycled_file_shows_only_what_the_compaction_wrote(jpath):
    j = _filled(jpath, 6)                         # file A: 1..6
    j.deleteEntriesTo(5)                          # file B: 6
    for i in range(7, 9):
        j.add(b"cmd-%d" % i, i, 3)
    j.deleteEntriesTo(len(j))                     # file A again, empty; 1..6 still in its bytes
    assert len(j) == 0
    assert len(_reopen(j, jpath)) == 0
    j = DurableJournal(jpath, "none")
    j.add(b"cmd-9", 9, 3)                         # same size as the old cmd-1: ends where cmd-2 starts
    assert _entries(_reopen(j, jpath)) == [(b"cmd-9", 9, 3)]


def test_records_after_a_torn_one_stay_dropped_after_later_appends(jpath):
    # 4 is torn, 5 intact (written, never synced); after the reopen a new 4
    # of the same size ends where the old 5 begins.
    j = _filled(jpath, 5)
    j._destroy()
    start4 = j._ends[2]
    with open(j.file_path, "r+b") as f:
        f.seek(start4 + 10)
        f.write(b"\xff")
    j2 = DurableJournal(jpath, "none")
    assert [e[1] for e in _entries(j2)] == [1, 2, 3]
    j2.add(b"cmd-Y", 4, 1)
    assert [e[1] for e in _entries(_reopen(j2, jpath))] == [1, 2, 3, 4]


def test_a_journal_of_the_old_layout_is_rewritten(jpath):
    import struct

    import crc32c
    with open(jpath + ".log", "wb") as f:        # u32 len | u32 crc | u64 idx | u64 term | cmd
        for idx in (1, 2, 3):
            body = struct.pack("<QQ", idx, 1) + b"old-%d" % idx
            f.write(struct.pack("<II", len(body), crc32c.crc32c(body)) + body)
    j = DurableJournal(jpath, "none")
    assert _entries(j) == [(b"old-1", 1, 1), (b"old-2", 2, 1), (b"old-3", 3, 1)]
    assert not os.path.exists(jpath + ".log")
    j.add(b"new-4", 4, 2)
    assert [e[1] for e in _entries(_reopen(j, jpath))] == [1, 2, 3, 4]


def test_a_failed_switch_keeps_the_old_file_live(jpath, monkeypatch):
    j = _filled(jpath, 5)
    first = j.file_path

    def no_rename(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError):
        j.deleteEntriesTo(3)
    monkeypatch.undo()
    assert (j.file_path, [e[1] for e in _entries(j)]) == (first, [1, 2, 3, 4, 5])
    j.onOneSecondTimer()
    j.setRaftCommitIndex(5)
    j.onOneSecondTimer()                          # stores the meta: must still name the old file
    assert [e[1] for e in _entries(_reopen(j, jpath))] == [1, 2, 3, 4, 5]


def _record(j, cmd: bytes, idx: int, term: int, salt: int) -> bytes:
    import struct

    import crc32c
    body = struct.pack("<QQQ", j._epoch, idx, term) + cmd
    return struct.pack("<II", len(body), crc32c.crc32c(body, salt)) + body


@pytest.mark.parametrize("salted", [True, False])
def test_only_records_written_by_the_journal_read_back(jpath, salted):
    # A message's bytes left in a recycled file could be shaped as a record
    # (next index, live epoch, valid plain CRC): the per-journal CRC salt
    # (random, in the meta file) keeps it out.
    j = _filled(jpath, 3)
    forged = _record(j, b"forged", 4, 1, j._salt if salted else 0)
    os.pwrite(j._fd, forged, j.size_bytes)
    got = [e[1] for e in _entries(_reopen(j, jpath))]
    assert got == ([1, 2, 3, 4] if salted else [1, 2, 3])


def test_a_failed_epoch_reservation_changes_nothing(jpath, monkeypatch):
    j = _filled(jpath, 5, fsync="always")
    j._reserved = j._epoch                        # the next epoch needs a meta write
    state = (j._epoch, j._reserved, j.size_bytes, j.durable_idx, j.truncations, _entries(j))

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(j, "_store_meta", full)
    with pytest.raises(OSError):
        j.deleteEntriesFrom(3)
    assert (j._epoch, j._reserved, j.size_bytes, j.durable_idx, j.truncations, _entries(j)) == state
    monkeypatch.undo()
    assert [e[1] for e in _entries(_reopen(j, jpath))] == [1, 2, 3, 4, 5]


def test_a_failing_fsync_observer_holds_back_nothing_durable(jpath, caplog):
    """The node's metrics watch every fdatasync (``observe_fsync``); if that callback
    raises, what the fdatasync made durable still counts, and the sync does not raise
    (a syncer thread that died of it left every later reply of its node waiting)."""
    j = DurableJournal(jpath, "always")
    seen = []

    def broken(seconds):
        seen.append(seconds)
        raise RuntimeError("a metrics registry gone bad")

    j.observe_fsync = broken
    j.add(b"cmd-1", 1, 1)
    j.add(b"cmd-2", 2, 1)
    j.sync_behind()
    assert seen and j.durable_idx == 2 and j.unsynced_bytes == 0
    assert "recording an fdatasync's time failed" in caplog.text
    j._destroy()
