"""Partitions: idempotent producers and leader reads while links between nodes are cut.

Each node runs in its own network namespace (needs root and iproute2's ``ip``).
The bounded run is part of `make test`; `make partition` runs every scenario
for 60 s. Repeat by hand: python -m tests.partition_harness --seconds 60
"""
from __future__ import annotations

import pytest

from .netns import unavailable_reason
from .partition_harness import SCENARIOS, run_partition


@pytest.fixture(scope="module")
def netns_ok():
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"partition tests need network namespaces: {reason}")


def _check(reports):             # run_partition printed each summary line
    for r in reports:
        assert r.acked > 0 and r.faults, r.summary()
        assert r.lost == 0, r.summary()
        assert r.duplicated == 0, r.summary()
        assert r.reordered == 0, r.summary()
        assert r.offset_gaps == 0, r.summary()
        assert r.replica_mismatches == 0, r.summary()
        # Leader reads are linearizable (leases, storage_service/raft/election.py).
        assert r.leader_reads > 0 and r.stale_reads == 0, r.summary()
        assert r.handler_errors == 0, r.summary()
        # Compare-and-set increments of one key: none lost, the history linearizable.
        assert r.kv_increments > 0 and r.kv_lost == 0 and r.kv_nonlinearizable == 0, r.summary()
        # Pre-vote: a node that rejoins does not depose a leader that kept its majority.
        assert r.deposed_on_heal == 0, r.summary()


@pytest.mark.integration
def test_partition_bounded(tmp_path, netns_ok):
    _check(run_partition(str(tmp_path), ["isolate-leader", "flap"], seconds=8, seed=7))


@pytest.mark.integration
def test_partition_bounded_replica_moves(tmp_path, netns_ok):
    """Replica moves (and the leadership moving with them) while a node taking part
    is cut off: the partition harness judges membership changes too."""
    _check(run_partition(str(tmp_path), ["move"], seconds=12, seed=7))


# Also marked chaos: `make test` (-m "not chaos") leaves these long runs out.
@pytest.mark.chaos
@pytest.mark.partition
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_partition_long(tmp_path, netns_ok, scenario):
    _check(run_partition(str(tmp_path), [scenario], seconds=60, seed=1))
