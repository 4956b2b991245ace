"""The single-register linearizability checker (tests/linearizable.py) on histories whose
answer is known: it must accept the valid ones and catch each kind of anomaly."""
from __future__ import annotations

import pytest

from tests.linearizable import Op, linearizable

pytestmark = pytest.mark.unit


def test_sequential_and_overlapping_histories_that_can_be_explained():
    assert linearizable([Op(0, "write", "a", True, 0, 1), Op(1, "read", None, "a", 2, 3)])
    # a read overlapping a write may see either value
    assert linearizable([Op(0, "write", "a", True, 0, 10), Op(1, "read", None, None, 1, 2)])
    assert linearizable([Op(0, "write", "a", True, 0, 10), Op(1, "read", None, "a", 1, 2)])
    # two overlapping compare-and-sets on the same value: one wins
    assert linearizable([Op(0, "write", "a", True, 0, 1),
                         Op(1, "cas", ("a", "b"), True, 2, 5), Op(2, "cas", ("a", "c"), False, 3, 6),
                         Op(0, "read", None, "b", 7, 8)])
    # an unknown outcome may have taken effect, or not
    assert linearizable([Op(0, "write", "a", True, 0, 1), Op(1, "write", "x", None, 2, None),
                         Op(2, "read", None, "x", 5, 6)])
    assert linearizable([Op(0, "write", "a", True, 0, 1), Op(1, "write", "x", None, 2, None),
                         Op(2, "read", None, "a", 5, 6)])


def test_anomalies_are_caught():
    # a stale read: the write had returned before the read began
    assert not linearizable([Op(0, "write", "a", True, 0, 1), Op(1, "read", None, None, 2, 3)])
    # a lost update: both compare-and-sets on "a" succeeded
    assert not linearizable([Op(0, "write", "a", True, 0, 1),
                             Op(1, "cas", ("a", "b"), True, 2, 5), Op(2, "cas", ("a", "c"), True, 3, 6)])
    # a refused compare-and-set although nothing else wrote
    assert not linearizable([Op(0, "write", "a", True, 0, 1), Op(1, "cas", ("a", "b"), False, 2, 3)])
    # a value read that nobody wrote
    assert not linearizable([Op(0, "write", "a", True, 0, 1), Op(1, "read", None, "z", 2, 3)])
    # reads going back in time
    assert not linearizable([Op(0, "write", "a", True, 0, 1), Op(0, "write", "b", True, 2, 3),
                             Op(1, "read", None, "b", 4, 5), Op(2, "read", None, "a", 6, 7)])
