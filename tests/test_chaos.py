"""Chaos: idempotent producers while leaders are SIGKILLed, nodes paused, all killed.

The bounded run is part of `make test`; `make chaos` runs the long one.
Repeat by hand: python -m tests.chaos_harness --seconds 120
"""
from __future__ import annotations

import pytest

from .chaos_harness import run_chaos


def _check(report):
    print("\n" + report.summary())
    assert report.acked > 0 and len(report.faults) >= 3
    assert report.lost == 0
    assert report.duplicated == 0
    assert report.reordered == 0
    assert report.offset_gaps == 0
    assert report.replica_mismatches == 0
    # Compare-and-set increments of one key: none lost, the history linearizable.
    assert report.kv_increments > 0 and report.kv_lost == 0 and report.kv_nonlinearizable == 0


@pytest.mark.integration
def test_chaos_bounded(tmp_path):
    _check(run_chaos(str(tmp_path), seconds=12, seed=7))


@pytest.mark.chaos
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_chaos_long(tmp_path, seed):
    _check(run_chaos(str(tmp_path), seconds=120, seed=seed))
