"""The node's open-file budget (storage_service/log/handles.py) over real queue logs."""
from __future__ import annotations

import os
import threading

import pytest

from storage_service.log.handles import OpenFiles
from storage_service.log.queue_log import QueueLog
from storage_service.protocol import framing, records

pytestmark = pytest.mark.unit


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _append(q: QueueLog, value: bytes) -> None:
    block = records.encode([value])
    frame = framing.frame_batch(q.next_offset, 1000, 1, q.next_offset + 1, block)
    q.append(frame, next(framing.iter_batches(frame)))


def _values(q: QueueLog) -> list[bytes]:
    data = q.read(q.earliest, 1 << 20)
    out = []
    for h in framing.iter_batches(data):
        c = records.parse(bytes(framing.records_of(data, h)), h.count)
        out.append(bytes(c.value_data[c.value_off[0]:c.value_off[1]]))
    return out


def test_idle_queues_hold_no_files_and_the_budget_holds(tmp_path):
    files = OpenFiles(limit=12)
    before = _fds()
    queues = [QueueLog(str(tmp_path / f"q{i}"), files=files) for i in range(20)]
    assert files.count == 0 and _fds() == before           # opened, nothing held
    for rnd in range(3):
        for i, q in enumerate(queues):
            _append(q, f"{i}-{rnd}".encode())
            assert files.count <= files.limit
            assert _fds() - before <= files.limit
    assert files.evictions > 0
    for i, q in enumerate(queues):                          # reads reopen what was closed
        assert _values(q) == [f"{i}-{rnd}".encode() for rnd in range(3)]
        assert files.count <= files.limit
    for q in queues:
        q.close()
    assert files.count == 0 and _fds() == before


def test_a_queue_in_use_is_passed_over_and_closing_syncs_first(tmp_path):
    files = OpenFiles(limit=8)
    busy, other = QueueLog(str(tmp_path / "busy"), files=files), QueueLog(str(tmp_path / "o"), files=files)
    _append(busy, b"x")
    _append(other, b"y")
    assert busy._dirty
    held, go = threading.Event(), threading.Event()

    def hold():
        with busy.lock:
            held.set()
            go.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    assert not busy.release_files()                         # never waits on another thread
    assert busy._wfd is not None
    go.set()
    t.join()
    assert busy.release_files() and busy._wfd is None and not busy._dirty
    _append(busy, b"z")                                     # reopens for the append
    assert _values(busy) == [b"x", b"z"]
    for q in (busy, other):
        q.close()


def test_an_eviction_closes_synced_queues_before_it_syncs_any(tmp_path):
    """Over the budget, the least used queues whose writes are synced close first; one with
    writes not synced yet (it would fdatasync on the appending thread) only if that is not
    enough."""
    files = OpenFiles(limit=10)
    queues = [QueueLog(str(tmp_path / f"q{i}"), files=files) for i in range(10)]
    for i, q in enumerate(queues):                   # q0 used least recently
        _append(q, b"%d" % i)
    for q in queues[5:]:
        q.sync()                                     # the 5 most recent are clean, the 5 oldest dirty
    _append(QueueLog(str(tmp_path / "new"), files=files), b"n")     # 11 > 10: evict down to 8
    assert [q._wfd is None for q in queues] == [False] * 5 + [True, True, True, False, False]
    assert all(q._dirty for q in queues[:5])         # nothing synced on the appending thread
    more = [QueueLog(str(tmp_path / f"m{i}"), files=files) for i in range(3)]
    for q in more:                                   # only dirty ones left to close: they sync first
        _append(q, b"m")
    assert files.count <= files.limit and queues[0]._wfd is None and not queues[0]._dirty
    assert [_values(q) for q in queues] == [[b"%d" % i] for i in range(10)]
