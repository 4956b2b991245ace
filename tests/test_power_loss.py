"""A power loss of a majority, emulated for real (``tests/faults/unsynced.c``): nothing acknowledged is lost.

``make jepsen``'s power-loss scenario, bounded: every node runs under the
power-loss shim; a group's leader and one more node lose power (SIGKILL, and
what they wrote without syncing is dropped, POSIX rules), later all three.
With ``--fsync always`` every acknowledged message must survive. What
``--fsync none`` loses is shown by ``python -m tests.node_faults --scenarios
power-loss --fsync none --writeback-s 5`` (README, Durability) and on one node
by ``tests/unit/test_powerloss_shim.py``.
"""
from __future__ import annotations

import pytest

from .node_faults import bounded

pytestmark = pytest.mark.integration


def test_power_loss_of_a_majority_loses_nothing_acknowledged(tmp_path):
    rep = bounded("power-loss", str(tmp_path), seconds=12)
    assert rep.measured["unsynced_bytes_dropped"] > 0, "the shim dropped nothing: the test tested nothing"


def test_power_loss_with_syncs_of_several_groups_at_once_loses_nothing_acknowledged(tmp_path):
    """``--journal-sync-threads 3``: each of the 3 groups' journals may be inside its
    fdatasync at the same time; a reply or a leader's count still waits for the sync
    of what it covers, so the same power losses lose nothing acknowledged."""
    rep = bounded("power-loss", str(tmp_path), seconds=12, node_args=("--journal-sync-threads", "3"))
    assert rep.measured["unsynced_bytes_dropped"] > 0, "the shim dropped nothing: the test tested nothing"
