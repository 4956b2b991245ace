"""A sync round with many queues written syncs the file system once (issue 39.5).

``DataState``'s background sync and a snapshot's sync used to ``fdatasync`` each
written queue: one journal commit each. A first produce to thousands of fresh
queues wrote more files a second than those syncs kept up with, and the node's
open-file budget then closed queues that were still dirty, each synced on the
raft thread first (seconds of apply; followers stopped hearing their leaders).
From ``BULK_SYNC_QUEUES`` queues a round makes one ``syncfs``. That it makes
the data durable is shown under the power-loss shim
(``test_powerloss_shim.py::test_a_new_queue_is_durable_once_its_data_state_synced``).
"""
from __future__ import annotations

import os

import pytest

import storage_service.statemachine.data as data
from storage_service.log.durability import DirSyncs
from storage_service.statemachine.data import BULK_SYNC_QUEUES, DataState, queue_dir

from ._helpers import encode_values

pytestmark = pytest.mark.unit


def _produce(state: DataState, index: int, names: list[str], value: bytes = b"m") -> None:
    state.apply(index, ("produce", [(n, "", 0, 1, 1, encode_values([value])) for n in names]))


@pytest.fixture
def counted(monkeypatch):
    """The file-system syncs and per-file syncs a test's rounds make."""
    calls = {"syncfs": 0, "fdatasync": 0}
    real_syncfs, real_fdatasync = data.syncfs, os.fdatasync

    def syncfs(fd):
        calls["syncfs"] += 1
        real_syncfs(fd)

    def fdatasync(fd):
        calls["fdatasync"] += 1
        real_fdatasync(fd)
    monkeypatch.setattr(data, "syncfs", syncfs)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return calls


@pytest.mark.parametrize("round_", ["sync", "sync_behind"])
def test_many_written_queues_are_synced_with_one_file_system_sync(tmp_path, counted, round_):
    s = DataState(str(tmp_path), fsync=True)
    names = [queue_dir("t", "i", q) for q in range(BULK_SYNC_QUEUES)]
    _produce(s, 1, names)
    getattr(s, round_)()
    assert counted == {"syncfs": 1, "fdatasync": 0}
    assert not any(s.queue(n)._dirty for n in names) and len(s.dirs) == 0
    s.close()


def test_few_written_queues_are_synced_each(tmp_path, counted):
    s = DataState(str(tmp_path), fsync=True)
    names = [queue_dir("t", "i", q) for q in range(BULK_SYNC_QUEUES)]
    _produce(s, 1, names)
    s.sync()
    _produce(s, 2, names[:3], b"again")               # then 3 of them written again
    s.sync()
    assert counted == {"syncfs": 1, "fdatasync": 3}
    s.sync()                                           # nothing left to sync
    assert counted == {"syncfs": 1, "fdatasync": 3}
    s.close()


def test_a_queue_written_after_the_round_began_stays_to_sync(tmp_path):
    """What was appended after a queue's mark was taken is not claimed synced."""
    s = DataState(str(tmp_path), fsync=True)
    name = queue_dir("t", "i", 0)
    _produce(s, 1, [name])
    q = s.queue(name)
    mark = q.sync_mark()
    s.apply(2, ("produce", [(name, "", 0, 2, 1, encode_values([b"later"]))]))
    q.synced(mark)
    assert q._dirty and q.sync_mark() is not None
    q.synced(q.sync_mark())
    assert not q._dirty and q.sync_mark() is None
    s.close()


def test_directories_covered_by_a_failed_file_system_sync_stay_pending(tmp_path):
    dirs = DirSyncs()
    dirs.add(str(tmp_path / "a"), str(tmp_path / "b"))
    with pytest.raises(OSError):
        with dirs.covered():
            raise OSError(5, "EIO")
    assert len(dirs) == 2
    with dirs.covered():
        dirs.add(str(tmp_path / "c"))                  # made during the sync: the next round's
    assert len(dirs) == 1


def test_a_closed_state_syncs_no_file_system(tmp_path, counted):
    """A group moved away closes its state while the background sync may still hold
    it: its descriptor for syncfs is gone, and a round syncs nothing (nothing is open)."""
    s = DataState(str(tmp_path), fsync=True)
    names = [queue_dir("t", "i", q) for q in range(BULK_SYNC_QUEUES)]
    _produce(s, 1, names)
    marked = [(q, q.sync_mark()) for q in s.queues.values()]
    s.close()
    assert s._fs_fd is None and not s._bulk_sync(marked)
    s.sync_behind()
    assert counted["syncfs"] == 0
