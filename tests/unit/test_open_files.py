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
