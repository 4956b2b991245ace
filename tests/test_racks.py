"""Racks on a real cluster (issue 39): six node processes in three racks
(``LocalCluster(racks=3)``: node i in rack r{i % 3}), each data group's three
replicas on distinct racks through a decommission, a refused decommission, a
repair, and a whole rack down and back. The planning itself is property-tested
in tests/unit/test_racks.py."""
from __future__ import annotations

import json

import pytest

from rmq_spark.client import Client
from storage_service.local import LocalCluster
from tests.conftest import wait_until
from tests.test_cli import rmq
from tests.test_elastic import moving

pytestmark = pytest.mark.integration


def _racks_of(st: dict) -> dict[str, str]:
    return {m["address"]: m["rack"] for m in st["members"]}


def _spread(client, what: str, want_distinct: bool = True, without=()) -> dict:
    """Cluster status once nothing moves, no replica is on ``without``, and every
    group's replicas are on distinct racks (or, ``want_distinct`` False, at most two
    in one rack)."""
    def done():
        st = client.cluster_status()
        racks = _racks_of(st)
        if moving(st) or any(a in r for r in st["placement"].values() for a in without):
            return None
        for reps in st["placement"].values():
            on = [racks[a] for a in reps]
            if len(reps) != 3 or (len(set(on)) != 3 if want_distinct else max(map(on.count, on)) > 2):
                return None
        return st
    return wait_until(done, timeout=180, interval=0.5, what=what)


def test_replicas_stay_on_distinct_racks_through_decommission_repair_and_a_rack_down(tmp_path):
    c = LocalCluster(nodes=6, groups=6, data_dir=str(tmp_path / "racks"), racks=3,
                     extra_args=["--replication-factor", "3", "--repair-after", "3"])
    c.start(timeout=90)
    client = Client(c.endpoints)
    try:
        want = {a: f"r{i % 3}" for i, a in enumerate(c.addresses)}
        wait_until(lambda: _racks_of(client.cluster_status()) == want,
                        timeout=60, interval=0.5, what="every node's rack recorded")
        view = json.loads(rmq(c, "cluster", "status", "--json").stdout)
        assert {n["address"]: n["rack"] for n in view["nodes"]} == want
        assert "rack" in rmq(c, "cluster", "status").stdout.splitlines()[0]
        _spread(client, "replicas on distinct racks from the start")
        client.create_topic("racked", queues=6)
        sent = {q: [] for q in range(6)}

        def produce(tag: str) -> None:
            for q in range(6):
                vals = [f"{tag}-{q}-{i}".encode() for i in range(20)]
                client.produce("racked", vals, queue=q)
                sent[q] += vals

        produce("start")
        # node 0 leaves; rack r0 keeps node 3
        out = rmq(c, "cluster", "decommission", c.addresses[0], "--wait", "--timeout", "180", timeout=240).stdout
        assert f"decommission {c.addresses[0]}: done" in out, out
        _spread(client, "distinct racks after the decommission", without=[c.addresses[0]])
        produce("decommissioned")
        # node 3 is now r0's last: leaving would put two replicas of a group in one rack
        refused = rmq(c, "cluster", "decommission", c.addresses[3], check=False)
        assert refused.returncode == 1 and "rack spread" in refused.stderr and "'r0'" in refused.stderr, refused
        assert "--ignore-racks" in refused.stderr
        assert next(m for m in client.cluster_status()["members"]
                    if m["address"] == c.addresses[3])["state"] == "active"        # nothing changed
        # node 4 (r1) dies: its replicas are re-created past --repair-after, in r1 (node 1)
        c.kill(4)
        _spread(client, "node 4's replicas re-created on distinct racks", without=[c.addresses[4]])
        produce("repaired")
        # all of r1 down: its groups spread over r0 and r2, at most two in either
        c.kill(1)
        _spread(client, "rack r1 down: groups over the other two racks", want_distinct=False,
                without=[c.addresses[1], c.addresses[4]])
        produce("rack-down")
        # r1 back: replicas move to it again, one per rack
        c.start_node(1)
        c.start_node(4)
        c.wait_ready(60, nodes=[1, 4])
        _spread(client, "rack r1 back: distinct racks again")
        produce("rack-back")
        for q in range(6):
            got = [r.value for r in client.fetch("racked", q, 0, max_messages=10_000).records]
            assert got == sent[q], (q, len(got), len(sent[q]))
    finally:
        client.close()
        c.stop()


def test_a_bad_rack_name_is_refused_before_anything_starts(tmp_path):
    import subprocess
    import sys
    for rack, says in (("a b", "letters, digits"), ("r" * 65, "at most 64")):
        out = subprocess.run([sys.executable, "-m", "storage_service.cli", "node", "--id", "0",
                              "--nodes", "127.0.0.1:1", "--data-dir", str(tmp_path / "n"), "--rack", rack],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "--rack" in out.stderr and says in out.stderr, out.stderr
        assert not (tmp_path / "n").exists()
