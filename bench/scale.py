#!/usr/bin/env python
"""Many queues on one local cluster: what each node pays per queue.

For each queue count (``--queues``, default 1,000 and 10,000; add 100000 for
the issue-19 run) a fresh 3-node cluster (4 data groups, ``--fsync always``)
gets topics of up to 4,000 queues, one message per queue, and the run
measures:

* create: creating the topics (the metadata group records every queue's group);
* produce: one 100-byte message to every queue (``produce_batches``, 500
  queues per call: each queue's files are created on its first append);
* read: the message back from every queue's leader (``fetch``);
* per node: RSS, open descriptors and disk after the produce, and the
  restart time of the whole cluster (stop, start, every group led);
* per node: one scrape of ``/metrics`` (the largest: bytes, seconds, series,
  and queues whose per-queue series were left out past
  ``--metrics-max-queue-series``);
* per queue: RSS and metadata bytes (the topic configs, as the metadata
  snapshot holds them), and what 1,000,000 queues
  (RIP-20's "100w") would take per node at that rate.

On 3 nodes every node holds a replica of every queue, so per-node cost is
per-cluster cost. There is no peer in this table: the question is how the
cost grows with the queue count.

Then issue 39's parts (``--only``):

* ``nodes``: 3, 6 and 9 nodes (``--nodes``; 2N data groups, 8N queues, R3,
  1 KiB messages), each at full speed and at one offered load (half the
  first row's rate unless ``--offered``), then the producer sweep
  (``--sweep``) on the first node count, each count between two runs of the
  base count: msgs/s, node and producer CPU per message, cores per node,
  call latency, node CPU by thread role, and with ``--probe`` the p50 / p99
  of single-message produce calls made beside the load (``_probe``: leave it
  out when node CPU per message is the question);
* ``pipeline``: one producer thread, ``produce_batches`` against
  ``Client.producer(max_in_flight=5)``, alternating (``--rounds``);
* ``placement``: the placement simulation (``bench/placement_sim.py``: 100
  nodes, 10,000 groups)::

    .venv/bin/python bench/scale.py                        # every part, defaults
    .venv/bin/python bench/scale.py --only nodes --nodes 3 --sweep 0 --seconds 12 --probe
    .venv/bin/python bench/scale.py --queues 1000 --queues 10000 --queues 100000
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._scale_queues import node_pids, queues_part  # noqa: E402
from rmq_spark.client import Client  # noqa: E402
from storage_service.local import LocalCluster  # noqa: E402
from storage_service.raft.journal import FSYNC_POLICIES  # noqa: E402

def _thread_cpu(cluster: LocalCluster) -> tuple[dict[str, float], list[tuple[float, float]]]:
    """CPU seconds by thread role, summed over the nodes (``rmq_thread_cpu_seconds_total``), and
    each node's journal fdatasyncs: (seconds in them, how many), all its groups together
    (``rmq_raft_journal_fsync_seconds``)."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    from storage_service.protocol.placement import http_address
    out: dict[str, float] = {}
    syncs = []
    for a in cluster.addresses:
        text = requests.get(f"http://{http_address(a)}/metrics", timeout=30).text
        took = count = 0.0
        for fam in text_string_to_metric_families(text):
            if fam.name == "rmq_thread_cpu_seconds":
                for s in fam.samples:
                    if s.name.endswith("_total"):
                        out[s.labels["thread"]] = out.get(s.labels["thread"], 0.0) + s.value
            elif fam.name == "rmq_raft_journal_fsync_seconds":
                for s in fam.samples:
                    took += s.value if s.name.endswith("_sum") else 0.0
                    count += s.value if s.name.endswith("_count") else 0.0
        syncs.append((took, count))
    return out, syncs


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- nodes: throughput follows nodes
PER_CALL_QUEUES = 8         # each produce_batches call: 8 queues x 100 messages of 1 KiB
PER_QUEUE_MSGS = 100


def producer(spec: dict) -> dict:
    """One producer process (``--producer SPEC``): its own Client, calls of 8 queues x 100 x 1 KiB
    until ``end``; acknowledged messages and call latencies counted inside ``[t0, t1]`` (wall clock,
    shared with the parent). ``rate`` (msgs/s, 0: as fast as acks come) paces the calls."""
    import random
    rng = random.Random(spec["seed"])
    msgs = [b"x" * 1024] * PER_QUEUE_MSGS      # plain values: no Message object per message
    per_call = PER_CALL_QUEUES * PER_QUEUE_MSGS
    acked, lat, gap = 0, [], per_call / spec["rate"] if spec["rate"] else 0.0
    with Client(spec["endpoints"], timeout=60) as c:
        c.list_topics()
        print("ready", flush=True)                  # imported and connected: the parent sets the window
        spec.update(json.loads(sys.stdin.readline()))
        while time.time() < spec["t0"] - spec["warmup"]:
            time.sleep(0.01)
        # Paced producers start at a random point of their period: started together, the
        # processes would send in step, every call of every producer at the same instant
        # (bursts of the whole load, idle in between), which no set of independent
        # producers does.
        nxt = time.time() + (rng.uniform(0.0, gap) if gap and spec["spread"] else 0.0)
        cpu0 = None
        while True:
            now = time.time()
            if now >= spec["t1"]:
                break
            if cpu0 is None and now >= spec["t0"]:
                cpu0 = time.process_time()          # the producer's own CPU inside the window
            if gap:
                if now < nxt:
                    time.sleep(nxt - now)
                nxt = max(nxt + gap, time.time() - 1.0)     # no burst to catch up after a stall
            qs = rng.sample(range(spec["queues"]), PER_CALL_QUEUES)
            t = time.time()
            c.produce_batches([(spec["topic"], q, msgs) for q in qs])
            done = time.time()
            if spec["t0"] <= done <= spec["t1"]:
                acked += per_call
                lat.append(done - t)
    return {"acked": acked, "lat": lat, "cpu_s": time.process_time() - (cpu0 or time.process_time())}


def _producers(endpoints: list[str], topic: str, queues: int, count: int, rate: float, warmup: float,
               seconds: float) -> tuple[list, float, float]:
    """Start ``count`` producer processes; (their processes, window start, window end). The
    window starts once every producer has imported and connected: 48 processes starting
    on 2 cores take ~15 s of CPU, which a fixed head start let into the window."""
    import subprocess
    procs = []
    for k in range(count):
        spec = dict(endpoints=endpoints, topic=topic, queues=queues, rate=rate / count if rate else 0,
                    spread=not IN_STEP,
                    seed=k, warmup=warmup)
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--producer", json.dumps(spec)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for proc in procs:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a producer exited {proc.wait()} before it was ready")
    t0 = time.time() + 0.5 + warmup
    t1 = t0 + seconds
    for proc in procs:
        proc.stdin.write(json.dumps({"t0": t0, "t1": t1}) + "\n")
        proc.stdin.flush()
    return procs, t0, t1


def _even_leaders(c: Client, nodes: int, say, timeout: float = 120.0) -> tuple[int, int]:
    """``rmq cluster rebalance``, then wait until leaders per node differ by at most one."""
    c.cluster_command("rebalance")
    deadline = time.monotonic() + timeout
    while True:
        st = c.cluster_status()
        led = [sum(1 for g in n["groups"] if g["group"] and g["leader"] == n["address"]) for n in st["nodes"]]
        if (st["rebalance_done"] >= st["rebalance_asked"] and len(led) == nodes and max(led) - min(led) <= 1) \
                or time.monotonic() > deadline:
            return min(led), max(led)
        time.sleep(0.5)


NODE_ARGS: list[str] = []   # --sync-threads: the nodes' --journal-sync-threads
IN_STEP = False             # --in-step: paced producers start together (the bench before 2026-11-29)
PROBE_GAP_S = 0.02          # the single-message probe: one produce call every 20 ms


def _probe(endpoints: list[str], topic: str, queues: int, until: float) -> list[float]:
    """Issue 39.4's latency: single-message produce calls (1 KiB, queues in turn) from this
    process, one every ``PROBE_GAP_S``, beside the producers until ``until``; seconds each."""
    lat = []
    with Client(endpoints, timeout=60) as c:
        c.produce(topic, [b"p" * 1024], queue=0)                # connections up
        q = 0
        while time.time() < until:
            t = time.perf_counter()
            c.produce(topic, [b"p" * 1024], queue=q)
            lat.append(time.perf_counter() - t)
            q = (q + 1) % queues
            time.sleep(max(0.0, PROBE_GAP_S - (time.perf_counter() - t)))
    return lat


def _percentile(xs: list[float], pct: float) -> float:
    xs = sorted(xs)
    return 1e3 * xs[min(len(xs) - 1, int(len(xs) * pct / 100))] if xs else float("nan")


def nodes_run(nodes: int, producers: int, seconds: float, where: str, say, rate: float = 0.0,
              fsync: str = "always", cluster: LocalCluster | None = None, probe: bool = False) -> dict:
    """Issue 39's workload on ``nodes`` nodes: 2N data groups, 8N queues, R3, 1 KiB messages,
    ``producers`` processes (``rate``: the offered load in msgs/s, 0 for as fast as acks come).
    Throughput, node CPU per acked message, cores used per node (mean and busiest), call latency."""
    own = cluster is None
    data = None
    if own:
        data = tempfile.mkdtemp(prefix=f"scale-n{nodes}-", dir=where)
        cluster = LocalCluster(nodes=nodes, groups=2 * nodes, data_dir=data, fsync=fsync, extra_args=NODE_ARGS)
        cluster.start(timeout=180)
    topic, queues = "spread", 8 * nodes
    try:
        with Client(cluster.endpoints, timeout=60) as c:
            if topic not in {t["name"] for t in c.list_topics()}:
                c.create_topic(topic, queues=queues)
            leaders = _even_leaders(c, nodes, say)
        pids = node_pids(cluster)
        warmup = 3.0
        procs, t0, t1 = _producers(cluster.endpoints, topic, queues, producers, rate, warmup, seconds)
        while time.time() < t0:
            time.sleep(0.005)
        cpu0 = [_cpu_s(p) for p in pids]
        roles0, syncs0 = _thread_cpu(cluster)
        probed = _probe(cluster.endpoints, topic, queues, t1) if probe else None
        while time.time() < t1:
            time.sleep(0.005)
        cpu = [_cpu_s(p) - c0 for p, c0 in zip(pids, cpu0)]
        roles1, syncs1 = _thread_cpu(cluster)
        roles = {r: (v - roles0.get(r, 0.0)) / seconds for r, v in roles1.items()}
        # Each node's time in journal fdatasyncs per second of the window: near 1 x the
        # --journal-sync-threads, the syncs are what a commit waits for.
        busy = [(s1 - s0) / seconds for (s1, _), (s0, _) in zip(syncs1, syncs0)]
        n_syncs = sum(c1 - c0 for (_, c1), (_, c0) in zip(syncs1, syncs0))
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=120)
            if p.returncode:
                raise RuntimeError(f"a producer exited {p.returncode}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        acked = sum(o["acked"] for o in outs)
        lat = [x for o in outs for x in o["lat"]]
        row = dict(nodes=nodes, producers=producers, offered=rate, fsync=fsync,
                   msgs_per_s=acked / seconds,
                   cpu_us_per_msg=1e6 * sum(cpu) / acked if acked else float("nan"),
                   client_us_per_msg=1e6 * sum(o["cpu_s"] for o in outs) / acked if acked else float("nan"),
                   cores_mean=sum(cpu) / len(cpu) / seconds, cores_max=max(cpu) / seconds,
                   call_p50_ms=_percentile(lat, 50), call_p99_ms=_percentile(lat, 99),
                   leaders=leaders, thread_cores={r: v for r, v in roles.items() if v >= 0.005},
                   sync_busy_max=max(busy), sync_ms=1e3 * sum(busy) * seconds / n_syncs if n_syncs else 0.0,
                   syncs_per_s=n_syncs / seconds,
                   one_p50_ms=_percentile(probed, 50) if probe else None,
                   one_p99_ms=_percentile(probed, 99) if probe else None)
        say(f"  {nodes} nodes, {producers} producers, offered {rate or 'max'}: {row['msgs_per_s']:,.0f} msgs/s, "
            f"{row['cpu_us_per_msg']:.1f} us/msg (producers {row['client_us_per_msg']:.1f}), "
            f"cores/node {row['cores_mean']:.2f} (busiest {row['cores_max']:.2f}); journal syncs "
            f"{row['syncs_per_s']:,.0f}/s, {row['sync_ms']:.2f} ms each, busiest node in them "
            f"{row['sync_busy_max']:.2f} of the time")
        say("    cores by thread, all nodes: " + ", ".join(
            f"{r} {v:.2f}" for r, v in sorted(row["thread_cores"].items(), key=lambda kv: -kv[1])[:6]))
        return row
    finally:
        if own:
            cluster.stop()
            shutil.rmtree(data, ignore_errors=True)


def nodes_table(rows: list[dict]) -> str:
    base: dict = {}
    for r in rows:
        if r["nodes"] == rows[0]["nodes"] and r["producers"] == rows[0]["producers"]:
            base.setdefault(r["offered"] > 0, r)
    probed = any(r["one_p50_ms"] is not None for r in rows)             # (--probe)
    head = ["nodes", "producers", "offered msgs/s", "msgs/s", "x 3-node row", "node CPU us/msg", "x 3-node row",
            "producers' CPU us/msg", "cores/node (mean)", "cores/node (busiest)", "call p50 ms", "call p99 ms",
            *(["1-message produce p50 / p99 ms"] if probed else []), "journal syncs/s", "ms a sync",
            "busiest node in syncs", "leaders/node"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        b = base.get(r["offered"] > 0, r)
        offered = f"{r['offered']:,.0f}" if r["offered"] else "max"
        one = f"{r['one_p50_ms']:.1f} / {r['one_p99_ms']:.1f} | " if probed else ""
        out.append(f"| {r['nodes']} | {r['producers']} | {offered} | "
                   f"{r['msgs_per_s']:,.0f} | {r['msgs_per_s'] / b['msgs_per_s']:.2f} | {r['cpu_us_per_msg']:.1f} | "
                   f"{r['cpu_us_per_msg'] / b['cpu_us_per_msg']:.2f} | {r['client_us_per_msg']:.1f} | "
                   f"{r['cores_mean']:.2f} | {r['cores_max']:.2f} | "
                   f"{r['call_p50_ms']:.1f} | {r['call_p99_ms']:.1f} | {one}"
                   f"{r['syncs_per_s']:,.0f} | {r['sync_ms']:.2f} | {r['sync_busy_max']:.2f} | "
                   f"{r['leaders'][0]}-{r['leaders'][1]} |")
    return "\n".join(out)


def threads_table(rows: list[dict]) -> str:
    """Node CPU per acked message by thread role (``rmq_thread_cpu_seconds_total``): where a
    row's extra cost over the first row went."""
    top: dict[str, float] = {}
    for r in rows:
        for role, cores in r.get("thread_cores", {}).items():
            top[role] = max(top.get(role, 0.0), cores)
    roles = [role for role, _ in sorted(top.items(), key=lambda kv: -kv[1])[:7]]
    head = ["nodes", "producers", "offered msgs/s"] + [f"{role} us/msg" for role in roles] + ["other us/msg"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        per = {role: 1e6 * cores / r["msgs_per_s"] for role, cores in r.get("thread_cores", {}).items()} \
            if r["msgs_per_s"] else {}
        other = sum(v for role, v in per.items() if role not in roles)
        offered = f"{r['offered']:,.0f}" if r["offered"] else "max"
        out.append(f"| {r['nodes']} | {r['producers']} | {offered} | "
                   + " | ".join(f"{per.get(role, 0.0):.1f}" for role in roles) + f" | {other:.1f} |")
    return "\n".join(out)


def one_thread(cluster: LocalCluster, seconds: float, in_flight: int) -> float:
    """msgs/s of one thread sending 8 queues x 100 x 1 KiB: ``produce_batches`` calls
    (``in_flight`` 0) or a ``Client.producer(in_flight)`` kept at most 8 calls ahead."""
    msgs = [b"x" * 1024] * PER_QUEUE_MSGS      # plain values: no Message object per message
    with Client(cluster.endpoints, timeout=60) as c:
        c.produce_batches([("spread", q, msgs) for q in range(PER_CALL_QUEUES)])    # connections up
        n, t = 0, time.perf_counter()
        if not in_flight:
            while time.perf_counter() - t < seconds:
                c.produce_batches([("spread", q, msgs) for q in range(PER_CALL_QUEUES)])
                n += PER_CALL_QUEUES * PER_QUEUE_MSGS
            return n / (time.perf_counter() - t)
        with c.producer(max_in_flight=in_flight) as p:
            ahead: collections.deque = collections.deque()
            while time.perf_counter() - t < seconds:
                ahead.extend(p.send("spread", q, msgs) for q in range(PER_CALL_QUEUES))
                n += PER_CALL_QUEUES * PER_QUEUE_MSGS
                while len(ahead) > 8 * PER_CALL_QUEUES:
                    ahead.popleft().result()
            p.flush()
        return n / (time.perf_counter() - t)


def pipeline_part(a: argparse.Namespace, where: str, say) -> list[dict]:
    """Issue 39.4: one producer thread, today's calls against the pipelined producer,
    alternating on one 3-node cluster (``--rounds``); medians."""
    data = tempfile.mkdtemp(prefix="scale-pipe-", dir=where)
    cluster = LocalCluster(nodes=3, groups=6, data_dir=data, fsync=a.fsync, extra_args=NODE_ARGS).start(timeout=180)
    try:
        with Client(cluster.endpoints) as c:
            c.create_topic("spread", queues=24)
            _even_leaders(c, 3, say)
        runs: dict[int, list[float]] = {0: [], 5: []}
        for r in range(a.rounds):
            for k in runs:
                runs[k].append(one_thread(cluster, a.seconds, k))
                say(f"  round {r + 1}: {'produce_batches' if not k else f'producer, {k} in flight'}: "
                    f"{runs[k][-1]:,.0f} msgs/s")
    finally:
        cluster.stop()
        shutil.rmtree(data, ignore_errors=True)
    med = {k: sorted(v)[len(v) // 2] for k, v in runs.items()}
    print(f"\none thread, 8 queues x 100 x 1 KiB per step, 3 nodes, --fsync {a.fsync}, "
          f"median of {a.rounds} alternating runs of {a.seconds:.0f} s")
    print("| producer | msgs/s (median) | runs | x produce_batches |\n|---|---|---|---|")
    for k, v in runs.items():
        name = "`produce_batches` (one call at a time)" if not k else f"`Client.producer(max_in_flight={k})`"
        print(f"| {name} | {med[k]:,.0f} | {', '.join(f'{x:,.0f}' for x in v)} | {med[k] / med[0]:.2f} |")
    return [{"in_flight": k, "msgs_per_s": v} for k, v in runs.items()]


def nodes_part(a: argparse.Namespace, where: str, say) -> list[dict]:
    """Each node count at full speed, then each at one offered load (half the first row's rate
    unless ``--offered``), then the producer sweep on the first node count."""
    rows = [nodes_run(n, a.producers, a.seconds, where, say, fsync=a.fsync, probe=a.probe) for n in a.nodes]
    offered = a.offered if a.offered is not None else round(rows[0]["msgs_per_s"] / 2, -3)
    if offered:
        rows += [nodes_run(n, a.producers, a.seconds, where, say, rate=offered, fsync=a.fsync, probe=a.probe)
                 for n in a.nodes]
    sweep, sweep_lines = [p for p in a.sweep if p != a.producers], []
    if sweep:
        data = tempfile.mkdtemp(prefix="scale-sweep-", dir=where)
        n = a.nodes[0]
        cluster = LocalCluster(nodes=n, groups=2 * n, data_dir=data, fsync=a.fsync,
                               extra_args=NODE_ARGS).start(timeout=180)
        # Each producer count between two runs of the base count on the same cluster, and
        # measured against their mean: consecutive runs drift (the data grows), and a ratio
        # to the run before alone counted the drift against the larger count.
        sweep_rows = []
        try:
            for p in [a.producers] + [x for p in sweep for x in (p, a.producers)]:
                sweep_rows.append(nodes_run(n, p, a.seconds, where, say, fsync=a.fsync, cluster=cluster,
                                            probe=a.probe))
        finally:
            cluster.stop()
            shutil.rmtree(data, ignore_errors=True)
        rows += sweep_rows
        for i in range(1, len(sweep_rows), 2):
            r, base = sweep_rows[i], (sweep_rows[i - 1]["msgs_per_s"] + sweep_rows[i + 1]["msgs_per_s"]) / 2
            sweep_lines.append(f"{n} nodes, {r['producers']} producers against {a.producers}: "
                               f"{r['msgs_per_s'] / base:.2f}x msgs/s ({r['msgs_per_s']:,.0f} against {base:,.0f}, "
                               f"the mean of the {a.producers}-producer runs before and after it on the same cluster)")
    print(f"\n{len(rows)} runs of {a.seconds:.0f} s: 2N data groups, 8N queues, 3 replicas, 1 KiB messages, "
          f"--fsync {a.fsync}; a producer process calls produce_batches with 8 queues x 100 messages; "
          f"ratios against the first row of the same producers and load kind"
          + (f"; beside them, one thread of this process produces one 1 KiB message every "
             f"{PROBE_GAP_S * 1000:.0f} ms (its p50 / p99)" if a.probe else ""))
    print(nodes_table(rows))
    if sweep_lines:
        print("\n" + "\n".join(sweep_lines))
    print("\nNode CPU per acked message by thread role, summed over the nodes (rmq_thread_cpu_seconds_total):")
    print(threads_table(rows))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", choices=["queues", "nodes", "pipeline", "placement"], action="append",
                   help="parts to run (repeatable; default all)")
    p.add_argument("--rounds", type=int, default=3, help="alternating runs of the pipeline part (3)")
    p.add_argument("--queues", type=int, action="append", help="queue counts (repeatable; default 1000, 10000)")
    p.add_argument("--in-flight", type=int, default=0,
                   help="queues part: the first produce by one pipelined producer with this many requests "
                        "in flight a node (default: produce_batches, one call at a time)")
    p.add_argument("--dir", default=None, help="where the clusters' data go (default: the temp dir)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--nodes", type=int, action="append", help="node counts (repeatable; default 3, 6, 9)")
    p.add_argument("--producers", type=int, default=12, help="producer processes of each node run (12)")
    p.add_argument("--sweep", type=int, action="append",
                   help="producer counts run on the first node count (repeatable; default 12, 24, 48; 0: none)")
    p.add_argument("--offered", type=float, default=None,
                   help="offered load of the same-load rows, msgs/s (default: half the first row's rate; 0: none)")
    p.add_argument("--fsync", default="always", choices=FSYNC_POLICIES)
    p.add_argument("--seconds", type=float, default=15.0, help="measured window of each node run")
    p.add_argument("--sync-threads", type=int, default=0,
                   help="the nodes' --journal-sync-threads in the nodes and pipeline parts (default: theirs)")
    p.add_argument("--in-step", action="store_true",
                   help="paced producers start together and send in step (the bench before 2026-11-29: "
                        "bursts of the whole offered load)")
    p.add_argument("--probe", action="store_true",
                   help="nodes part: time single-message produces beside each run (issue 39.4; their ~50 "
                        "small raft entries a second count in node CPU per message)")
    p.add_argument("--producer", default=None, help=argparse.SUPPRESS)   # a producer process's spec
    a = p.parse_args(argv)
    if a.producer:
        print(json.dumps(producer(json.loads(a.producer))))
        return 0
    global IN_STEP
    IN_STEP = a.in_step
    if a.sync_threads:
        NODE_ARGS[:] = ["--journal-sync-threads", str(a.sync_threads)]
    a.nodes = a.nodes or [3, 6, 9]
    a.sweep = [s for s in (a.sweep or [12, 24, 48]) if s]
    parts = a.only or ["queues", "nodes", "pipeline", "placement"]
    where = a.dir or tempfile.gettempdir()
    say = lambda line: print(line, flush=True)      # noqa: E731
    out: dict = {}
    if "queues" in parts:
        out["queues"] = queues_part(a.queues or [1000, 10000], where, say, a.in_flight)
    if "nodes" in parts:
        out["nodes"] = nodes_part(a, where, say)
    if "pipeline" in parts:
        out["pipeline"] = pipeline_part(a, where, say)
    if "placement" in parts:
        from bench import placement_sim
        print("\nplacement simulation: 90 nodes + 10 joining, 10,000 groups of 3 replicas")
        print(placement_sim.table(placement_sim.run(say=lambda line: None)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
