"""Short-circuit reads: the client side checks (storage_service.protocol.localread)."""
from __future__ import annotations

import os

import pytest

from storage_service.protocol.fetch_wire import LocalSpan
from storage_service.protocol.localread import host_id, read_span

pytestmark = pytest.mark.unit


def _span(path: str, position: int = 0, length: int = 10) -> LocalSpan:
    st = os.stat(path)
    return LocalSpan(path, position, length, st.st_ino, st.st_dev)


@pytest.fixture
def seg(tmp_path) -> str:
    path = str(tmp_path / "00000000000000000000.log")
    with open(path, "wb") as f:
        f.write(bytes(range(100)))
    return path


def test_host_id_is_this_boots_id():
    with open("/proc/sys/kernel/random/boot_id") as f:
        assert host_id() == f.read().strip() != ""


def test_reads_the_span(seg):
    assert read_span(_span(seg, 5, 10)) == bytes(range(5, 15))
    assert read_span(_span(seg, 0, 100)) == bytes(range(100))


def test_a_deleted_file_is_none(seg):
    span = _span(seg)
    os.unlink(seg)
    assert read_span(span) is None


def test_a_rewritten_file_is_none(seg, tmp_path):
    # compaction and replica rebuilds write a new file under the same name
    span = _span(seg)
    tmp = str(tmp_path / "cleaned")
    with open(tmp, "wb") as f:
        f.write(bytes(100))
    os.replace(tmp, seg)
    assert read_span(span) is None


@pytest.mark.parametrize("position,length", [(95, 10), (-1, 5), (0, 0), (200, 1)])
def test_a_span_outside_the_file_is_none(seg, position, length):
    assert read_span(_span(seg, position, length)) is None
