"""A node's wall clock steps back an hour and forward a day (libfaketime): nothing misfires.

``make jepsen``'s clock scenario, bounded. Nodes take the cluster's time, the
median of the nodes' clocks (``RaftHub.cluster_time_ms``), for store
timestamps, retention and leases; the raft leases run on the monotonic
clock, which a step does not move. With the node's own clock instead, the
same run gave a tier lease to a second job and 22,860 store timestamps a
day ahead.
"""
from __future__ import annotations

import pytest

from .node_faults import bounded

pytestmark = pytest.mark.integration


def test_clock_steps_on_the_metadata_leader(tmp_path):
    rep = bounded("clock", str(tmp_path), seconds=12)
    assert rep.measured["ts_seeks"] > 0 and any("+86400" in f for f in rep.faults)
