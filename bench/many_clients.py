#!/usr/bin/env python
"""Many waiting consumers: produce latency while thousands of fetches long-poll.

A fresh 3-node local cluster (3 data groups, ``--fsync always``). ``--pollers``
long-polling consumers (``fetch`` with ``wait_ms``, each at the end of one of
40 idle queues of topic ``quiet``, sent to the queue's leader, re-issued as
soon as answered: a consumer's poll loop; the first polls spread over one
wait, as consumers started over a while) and ``--producers`` producer threads
(one 100-byte message per ``produce`` call to a queue, over the produce port,
``--pause-ms`` 100 apart, to topic ``busy``) run together for ``--seconds``. For each poller count (the run with
0 pollers is the peer: the same cluster and producers without the crowd) the
table prints:

* produce p50 / p99 / max latency (ms) and how many produces ran;
* polls answered, and *late polls*: answered more than wait + 1 s after sent;
* errors of either side, and the most fetches parked on the nodes at once.

Before waiting fetches were parked (wave 1: a pool of 64 gRPC threads per
node, each waiting fetch holding one), 200 pollers made produce p99 6,014 ms.
Target (issue 20): 2,000 pollers and 50 producers, produce p99 <= 50 ms and no
late poll::

    .venv/bin/python bench/many_clients.py                      # 0, 200, 2000 pollers
    .venv/bin/python bench/many_clients.py --pollers 2000 --seconds 60
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rmq_spark.client import Client  # noqa: E402
from storage_service.local import LocalCluster  # noqa: E402
from tests.crowd import Producers, crowd_in_process, leaders_of  # noqa: E402

QUIET_QUEUES = 40


def _parked(client) -> int:
    return sum(n["parked_fetches"] for n in client.cluster_status()["nodes"])


def one_run(pollers: int, producers: int, seconds: float, wait_ms: int, pause_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="rmq-crowd-") as tmp, \
            LocalCluster(nodes=3, groups=3, data_dir=tmp) as cluster, \
            Client(cluster.endpoints, timeout=30) as client:
        client.create_topic("quiet", queues=QUIET_QUEUES)
        client.create_topic("busy", queues=6)
        stop_crowd = (crowd_in_process(leaders_of(client, "quiet", QUIET_QUEUES), "quiet", pollers, wait_ms,
                                       spread_s=wait_ms / 1000) if pollers else None)
        if stop_crowd:
            deadline = time.monotonic() + 60
            while _parked(client) < pollers and time.monotonic() < deadline:
                time.sleep(0.2)
        prod = Producers(client, "busy", 6, producers, pause_s=pause_s).start()
        most, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            time.sleep(1)
            most = max(most, _parked(client))
            print(f"  {pollers} pollers: {time.monotonic() - t0:4.0f}/{seconds:.0f} s, "
                  f"{len(prod.latencies)} produces, {most} parked at most", file=sys.stderr, flush=True)
        prod.stop()
        seen = stop_crowd() if stop_crowd else {"polls": 0, "late": 0, "errors": 0, "error_details": []}
        for e in prod.errors[:3] + seen["error_details"][:3]:
            print(f"  error: {e}", file=sys.stderr)
        out = prod.summary()
        out.update(pollers=pollers, polls=seen["polls"], late=seen["late"], poll_errors=seen["errors"],
                   parked=most)
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pollers", type=int, action="append", help="repeatable; default 0, 200, 2000")
    ap.add_argument("--producers", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--wait-ms", type=int, default=5000)
    ap.add_argument("--pause-ms", type=int, default=100, help="between one producer's calls (default 100)")
    a = ap.parse_args(argv)
    rows = [one_run(p, a.producers, a.seconds, a.wait_ms, a.pause_ms / 1000) for p in (a.pollers or [0, 200, 2000])]
    print(f"\n{a.producers} producers (1 x 100 B per call, {a.pause_ms} ms apart), pollers wait_ms={a.wait_ms} "
          f"(first polls spread over {a.wait_ms} ms), "
          f"{a.seconds:.0f} s per row, 3 nodes on one host\n")
    print(f"{'pollers':>7} {'parked':>6} {'produces':>8} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
          f"{'p99 vs 0':>8} {'polls':>6} {'late':>4} {'errors':>6}")
    base = next((r["p99_ms"] for r in rows if r["pollers"] == 0), None)
    for r in rows:
        ratio = f"{r['p99_ms'] / base:.2f}x" if base else "-"
        print(f"{r['pollers']:>7} {r['parked']:>6} {r['produces']:>8} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} "
              f"{r['max_ms']:>7.1f} {ratio:>8} {r['polls']:>6} {r['late']:>4} "
              f"{r['errors'] + r['poll_errors']:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
