"""The seam to pysyncobj (``storage_service/raft/_pysyncobj.py``, issue 38): it is the one
place that touches pysyncobj's private names, the version it was written against is
the one installed, and a pysyncobj without one of those names fails naming it."""
from __future__ import annotations

import pathlib
import re
from importlib.metadata import version

import pytest

from storage_service.raft import _pysyncobj as seam

pytestmark = pytest.mark.unit
ROOT = pathlib.Path(__file__).resolve().parents[2]
SEAM = ROOT / "storage_service" / "raft" / "_pysyncobj.py"
# pysyncobj's name-mangled privates, and the private module names its internals go by
PRIVATE = re.compile(r"_(?:SyncObj|TcpConnection|TcpServer)__\w+|\b_(?:COMMAND_TYPE|RAFT_STATE|bchr)\b"
                     r"|syncobj\.createPoller|\._(?:onTick|checkCommandsToApply|methodToID|getFuncName|isLeader"
                     r"|getLeader|doDestroy)\b")


def test_the_installed_pysyncobj_is_the_pinned_one_and_has_every_name_relied_on():
    assert version("pysyncobj") == seam.PINNED
    assert seam.missing() == []
    setup = (ROOT / "setup.py").read_text()
    assert f'"pysyncobj=={seam.PINNED}"' in setup


def test_a_missing_private_name_fails_loudly_naming_it(monkeypatch):
    relied = {cls: names + ("_SyncObj__gone",) if cls is seam.SyncObj else names
              for cls, names in seam.RELIED_ON.items()}
    monkeypatch.setattr(seam, "RELIED_ON", relied)
    assert seam.missing() == ["pysyncobj.syncobj.SyncObj._SyncObj__gone"]
    with pytest.raises(ImportError, match=r"pinned: pysyncobj==0\.3\.17.*SyncObj\._SyncObj__gone"):
        seam.check()


def test_attributes_set_only_in_code_are_found():
    """Instance attributes exist only once ``__init__`` ran: they are looked up in the
    methods' code, so a renamed attribute is caught without building a SyncObj."""
    names = seam._names_in(seam.SyncObj)
    assert "_SyncObj__raftMatchIndex" in names and "_SyncObj__commandsQueue" in names
    assert "_SyncObj__noSuchThing" not in names


def test_no_private_name_of_pysyncobj_outside_the_seam():
    found = []
    for tree in ("storage_service", "rmq_spark", "tests", "bench"):
        for path in sorted((ROOT / tree).rglob("*.py")):
            if path in (SEAM, pathlib.Path(__file__).resolve()):
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if PRIVATE.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == [], "\n".join(found)
