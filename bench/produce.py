#!/usr/bin/env python
"""Produce benchmark: rmq-spark against NATS JetStream and the pysyncobj ceiling.

One run measures every row below on this machine, one system at a time, and
prints one table plus the project's targets::

    .venv/bin/python bench/produce.py                  # 5 s per phase, 3 rounds
    .venv/bin/python bench/produce.py --seconds 3 --json bench/results/produce.json
    .venv/bin/python bench/produce.py --quick --skip-nats

Rows (values of ``--msg-size`` bytes, 1 KiB by default, acknowledged only
once replicated):

1. rmq-spark 3-node, batch=1   - ``--threads`` producers share one Client;
   latency from a separate sequential loop of single-message calls.
2. rmq-spark 3-node, batch=100 - the same with 100 messages per call.
3. rmq-spark 3-node, batch=100 x 8 queues - each call is
   ``Client.produce_batches`` with one batch of 100 for each of the 8 queues:
   one request per leader node, as Kafka's producer sends one request per
   broker holding a batch per partition, over the nodes' produce port
   (``storage_service/server/produce_port.py``); then the same calls over gRPC.
4. NATS JetStream R3 (file storage, 3 local ``nats-server``), nats-py async
   publish for the rate, synchronous ``js.publish`` for the latency.
5. pysyncobj 0.3.17 raw replicated append: 3 nodes in 3 processes, journal
   on, 5 ms ticks, commands of 100 messages; what is left for a
   pysyncobj-based log before it does any storage work.

Row 2 is also measured over the nodes' HTTP/JSON API (``POST
/v1/topics/T/messages``, values as base64, one keep-alive connection per
thread and node: ``_http_producer.py``), on the same cluster. Rows 2 and 3
are measured again on a cluster whose nodes run ``--no-metrics`` (nothing
counted for ``/metrics``), in the same round, the two clusters' order
alternating: what counting costs.

With ``--secure``, rows 2 and 3 are measured again on a second cluster made by
``LocalCluster(secure=True)`` (TLS on every port, ACLs on), as a principal with
only ``produce`` on the topic, its bearer token on every call: TLS clients
produce over gRPC, so row 3's TLS twin is compared with row 3 and its gRPC twin.
The two clusters run one after the other in each round (order alternating).

Rows 1-4 (and 3's gRPC twin) are measured ``--rounds`` times (rmq-spark and NATS taking turns)
and the table shows medians. MB = 10^6 bytes of message values; progress
goes to stderr, the table to stdout. Values are incompressible by default (``--payload``): pysyncobj's
transport zlib-compresses every message, so compressible ones flatter it.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import math
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
if REPO_ROOT not in sys.path:  # benchmark the checkout, installed or not
    sys.path.insert(1, REPO_ROOT)

import _peers  # noqa: E402  (lives next to this file)
from _http_producer import HttpProducer  # noqa: E402

log = logging.getLogger("bench.produce")

MSG_SIZE = 1024   # set from --msg-size by main()
MB = 1e6
TOPIC, QUEUES = "bench", 8
SUBJECT, STREAM = "bench.produce", "BENCH"
TARGET_BATCHED_MSGS = 100_000
TARGET_X_NATS = 5.0
TARGET_P99_MS = 25.0
VERDICT = {None: "n/a", True: "MET", False: "NOT MET"}

RMQ_B1 = "rmq-spark 3-node, batch=1"
RMQ_B100 = "rmq-spark 3-node, batch=100"
RMQ_B100X8 = "rmq-spark 3-node, batch=100 x 8 queues/call"
RMQ_B100X8_GRPC = "  the same over gRPC (no produce port)"
RMQ_CLI = "rmq produce (CLI), lines from a file"
RMQ_HTTP_B100 = "  the same over HTTP/JSON (base64 values)"
RMQ_ROWS = (RMQ_B1, RMQ_B100, RMQ_HTTP_B100, RMQ_B100X8, RMQ_B100X8_GRPC, RMQ_CLI)
OFF_B100 = "rmq-spark --no-metrics, batch=100"
OFF_B100X8 = "rmq-spark --no-metrics, batch=100 x 8 queues/call"
OFF_ROWS = (OFF_B100, OFF_B100X8)
NOSYNC_B100 = "rmq-spark --fsync none, batch=100"
NOSYNC_B100X8 = "rmq-spark --fsync none, batch=100 x 8 queues/call"
NOSYNC_ROWS = (NOSYNC_B100, NOSYNC_B100X8)
TARGET_METRICS = 0.95
SEC_B100 = "rmq-spark TLS + token, batch=100"
SEC_B100X8 = "rmq-spark TLS + token, batch=100 x 8 queues/call"
SEC_ROWS = (SEC_B100, SEC_B100X8)
TARGET_SECURE = 0.80
CLI_VS_BATCHED = "rmq produce (CLI) / batch=100 x 8 queues/call msgs/s"
TARGET_CLI_SHARE = 0.70
PORT_VS_GRPC = "8 queues/call: produce port / gRPC msgs/s"
NATS = "NATS JetStream R3, async publish (nats-py)"
KAFKA_SHIPPED = "Kafka 4.4 3 brokers, acks=all idempotent, linger 5 ms (shipped)"
KAFKA_TUNED = "Kafka 4.4 3 brokers, acks=all idempotent, linger 100 ms (tuned)"
KAFKA_FLUSH = "  the same, log.flush.interval.messages=1 (fsync per append)"
KAFKA_ROWS = (KAFKA_SHIPPED, KAFKA_TUNED, KAFKA_FLUSH)
CEILING = "pysyncobj raw replicated append (ceiling)"
CEILING_FAST = "pysyncobj raw append, rmq wire (ceiling)"


@dataclass
class Row:
    name: str
    msgs_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    note: str = ""
    cpu_us: float | None = None   # CPU us per acked message, servers + client

    @property
    def mb_per_s(self) -> float | None:
        return None if self.msgs_per_s is None else self.msgs_per_s * MSG_SIZE / MB

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mb_per_s": self.mb_per_s}


def size_name() -> str:
    return "1 KiB" if MSG_SIZE == 1024 else f"{MSG_SIZE} B"


# ---- measuring helpers -----------------------------------------------------

@contextmanager
def progress(label: str, count: Callable[[], int], unit: str,
             interval: float = 1.0) -> Iterator[None]:
    """Log one line per ``interval`` with the running total and rate."""
    stop = threading.Event()

    def report() -> None:
        t0 = last_t = time.monotonic()
        last_n = count()
        while not stop.wait(interval):
            now, n = time.monotonic(), count()
            log.info("  %-34s %5.1fs %12s %s %10s/s", label, now - t0, f"{n:,}", unit,
                     f"{(n - last_n) / (now - last_t):,.0f}")
            last_t, last_n = now, n

    thread = threading.Thread(target=report, name=f"progress-{label}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def percentiles_ms(latencies_s: list[float]) -> tuple[float | None, float | None]:
    """p50 and p99 (nearest rank) in milliseconds."""
    if not latencies_s:
        return None, None
    ordered = sorted(latencies_s)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1e3

    return rank(0.50), rank(0.99)


class CpuMeter:
    """CPU seconds of some server processes plus this one (the client), over a window.

    Rates depend on what else runs on the machine; CPU time per message
    much less so. Linux only (``/proc``); elsewhere ``per_msg`` is None.
    """

    def __init__(self, pids: list[int]) -> None:
        self.pids = list(pids)
        self._start: float | None = None
        self.seconds: float | None = None

    def _now(self) -> float | None:
        total = time.process_time()   # every thread of this process: the client side
        try:
            for pid in self.pids:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            return None
        return total

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> None:
        end = self._now()
        self.seconds = None if end is None or self._start is None else end - self._start

    def per_msg_us(self, messages: int) -> float | None:
        return None if self.seconds is None or not messages else self.seconds / messages * 1e6


def windowed_rate(count: Callable[[], int], warmup: float, seconds: float,
                  meter: CpuMeter | None = None) -> tuple[float, int]:
    """(rate, messages) of ``count`` over ``seconds`` after ``warmup`` (workers run meanwhile)."""
    time.sleep(warmup)
    if meter:
        meter.start()
    t1, n1 = time.monotonic(), count()
    time.sleep(seconds)
    t2, n2 = time.monotonic(), count()
    if meter:
        meter.stop()
    return (n2 - n1) / (t2 - t1), n2 - n1


# ---- rmq-spark -------------------------------------------------------------

def acked_count(result: Any) -> int:
    """Messages acknowledged by one ``Client.produce`` call.

    The brief's API returns one ``ProduceResult``; the client as built returns
    a list of them (one per queue written). Accept both.
    """
    if isinstance(result, (list, tuple)):
        return sum(r.count for r in result)
    return result.count


def produce_call(client, values: list[bytes], batch: int, queue: int, per_queue: bool,
                 i: int = 0) -> int:
    """One produce call; returns the messages it got acknowledged.

    ``per_queue``: one batch for every queue of the topic in one
    ``produce_batches`` call, else one batch to ``queue``.
    """
    chunk = values[:batch] if batch > 1 else [values[i % len(values)]]
    if per_queue:
        return acked_count(client.produce_batches([(TOPIC, q, chunk) for q in range(QUEUES)]))
    return acked_count(client.produce(TOPIC, chunk, queue=queue))


def _produce_loop(client, values: list[bytes], batch: int, queue: int, per_queue: bool,
                  stop: threading.Event, acked: _peers.Counter, errors: list) -> None:
    i = 0
    try:
        while not stop.is_set():
            acked.add(produce_call(client, values, batch, queue, per_queue, i))
            i += 1
    except Exception as e:  # handed to the main thread, which raises it
        errors.append(e)
        stop.set()


def rmq_throughput(client, values: list[bytes], batch: int, per_queue: bool, threads: int,
                   seconds: float, warmup: float, pids: list[int]) -> tuple[float, float | None]:
    """(acked messages/s, CPU us per message of nodes + client) with ``threads``
    concurrent producers sharing ``client``."""
    stop, acked, errors = threading.Event(), _peers.Counter(), []
    workers = [threading.Thread(target=_produce_loop, daemon=True,
                                args=(client, values, batch, i % QUEUES, per_queue, stop, acked,
                                      errors))
               for i in range(threads)]
    label = f"rmq batch={batch}" + (" x queues" if per_queue else "")
    with progress(f"{label} throughput", lambda: acked.value, "msgs acked"):
        for w in workers:
            w.start()
        try:
            meter = CpuMeter(pids)
            rate, messages = windowed_rate(lambda: acked.value, warmup, seconds, meter)
        finally:
            stop.set()
            for w in workers:
                w.join(timeout=60)
    if errors:
        raise RuntimeError(f"producer thread failed: {errors[0]!r}") from errors[0]
    return rate, meter.per_msg_us(messages)


def rmq_latency(client, values: list[bytes], batch: int, per_queue: bool,
                seconds: float) -> list[float]:
    """Latencies (s) of sequential produce calls of ``batch`` messages (per queue)."""
    calls, lat = _peers.Counter(), []
    for _ in range(10):  # warm the channel and the group's leader
        produce_call(client, values, batch, 0, per_queue)
    with progress(f"rmq batch={batch} latency", lambda: calls.value, "calls"):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            t = time.perf_counter()
            produce_call(client, values, batch, calls.value % QUEUES, per_queue)
            lat.append(time.perf_counter() - t)
            calls.add()
    return lat


def measure_rmq(args: argparse.Namespace, values: list[bytes], root: str,
                grpc_first: bool = False) -> list[Row]:
    """The rmq-spark rows on a real LocalCluster; "n/a" rows if it cannot run.

    ``produce_batches`` goes over the nodes' produce port; the last row sends
    the same calls over gRPC (a second client on the same cluster, so the same
    raft leaders) to show what the port is worth. Whichever of the two runs
    second finds a warmer cluster, so ``grpc_first`` swaps them (run_all
    alternates it by round). Rows come back in ``RMQ_ROWS`` order.
    """
    try:
        from rmq_spark.client import Client
        from storage_service.local import LocalCluster
    except ImportError as e:
        log.warning("rmq-spark rows skipped: %s", e)
        return [Row(n, note=f"n/a: {e}") for n in RMQ_ROWS]
    rows = []
    log.info("starting rmq-spark LocalCluster (3 nodes, 4 groups)")
    try:
        with LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "rmq")) as cluster, \
                Client(cluster.endpoints) as client, \
                Client(cluster.endpoints, produce_port=False) as grpc_client:
            client.create_topic(TOPIC, queues=QUEUES)
            over_http = HttpProducer(cluster.http_urls, TOPIC)
            batched = [(RMQ_B100X8, client, 100, True), (RMQ_B100X8_GRPC, grpc_client, 100, True)]
            for name, c, batch, per_queue in [(RMQ_B1, client, 1, False), (RMQ_B100, client, 100, False),
                                              (RMQ_HTTP_B100, over_http, 100, False),
                                              *(batched[::-1] if grpc_first else batched)]:
                rate, cpu = rmq_throughput(c, values, batch, per_queue, args.threads,
                                           args.seconds, args.warmup,
                                           [p.pid for p in cluster.procs if p])
                p50, p99 = percentiles_ms(rmq_latency(c, values, batch, per_queue, args.seconds))
                rows.append(Row(name, rate, p50, p99,
                                f"{args.threads} threads; p50/p99: sequential calls", cpu))
            rows.append(measure_cli(cluster, root, args.seconds, [p.pid for p in cluster.procs if p]))
    except Exception as e:  # still measure the peers; the error is printed
        log.exception("rmq-spark benchmark failed")
        done = {r.name for r in rows}
        rows += [Row(n, note=f"n/a: {type(e).__name__}: {e}"[:200]) for n in RMQ_ROWS if n not in done]
    return sorted(rows, key=lambda r: RMQ_ROWS.index(r.name))


def measure_kafka(args: argparse.Namespace, values: list[bytes], root: str) -> list[Row]:
    """Kafka (``_kafka.KafkaCluster``, confluent-kafka with acks=all and idempotence) as
    shipped and tuned, then on a cluster that fsyncs every append (rmq's --fsync always)."""
    rows: list[Row] = []
    try:
        from _kafka import KafkaCluster
        from _kafka_produce import kafka_latency, kafka_throughput
        for flush, runs in ((False, ((KAFKA_SHIPPED, 5), (KAFKA_TUNED, 100))), (True, ((KAFKA_FLUSH, 100),))):
            log.info("starting Kafka (3 brokers, KRaft%s)", ", flush every message" if flush else "")
            with KafkaCluster(os.path.join(root, "kafka-flush" if flush else "kafka"), flush=flush) as k:
                k.create_topic(TOPIC, QUEUES)
                for name, linger in runs:
                    meter = CpuMeter(k.pids())
                    meter.start()
                    rate, errors = kafka_throughput(k.bootstrap, TOPIC, values, QUEUES, args.seconds,
                                                    args.warmup, linger)
                    meter.stop()
                    p50 = p99 = None
                    if name == KAFKA_SHIPPED or flush:
                        p50, p99 = percentiles_ms(kafka_latency(k.bootstrap, TOPIC, values, args.seconds))
                    rows.append(Row(name, rate, p50, p99, "confluent-kafka, 8 partitions RF 3, min ISR 2"
                                    + (f"; {errors} errors" if errors else "")
                                    + ("; p50/p99: one message at a time" if p50 is not None else ""),
                                    meter.per_msg_us(int(rate * (args.seconds + args.warmup)))))
    except Exception as e:  # the other rows stand; the error is printed
        log.exception("Kafka benchmark failed")
        return _not_measured(rows, KAFKA_ROWS, e)
    return rows


def _rows_2_and_3(args: argparse.Namespace, values: list[bytes], client, cluster, names: tuple[str, str],
                  note: str, rows: list[Row]) -> None:
    """Rows 2 (batch=100) and 3 (x 8 queues per call) on ``cluster``, named ``names``."""
    for name, per_queue in zip(names, (False, True)):
        rate, cpu = rmq_throughput(client, values, 100, per_queue, args.threads, args.seconds, args.warmup,
                                   [p.pid for p in cluster.procs if p])
        p50, p99 = percentiles_ms(rmq_latency(client, values, 100, per_queue, args.seconds))
        rows.append(Row(name, rate, p50, p99, f"{args.threads} threads; {note}", cpu))


def _not_measured(rows: list[Row], names: tuple[str, ...], e: Exception) -> list[Row]:
    """``rows`` plus an "n/a" row, naming ``e``, for each of ``names`` not measured."""
    done = {r.name for r in rows}
    return rows + [Row(n, note=f"n/a: {type(e).__name__}: {e}"[:200]) for n in names if n not in done]


def measure_rmq_variant(args: argparse.Namespace, values: list[bytes], root: str, names: tuple[str, str],
                        what: str, note: str, **cluster_args) -> list[Row]:
    """Rows 2 and 3 on a cluster made with ``cluster_args`` (``--no-metrics``: nodes
    count nothing; ``fsync="none"``: acks before any fsync, as Kafka's default)."""
    from rmq_spark.client import Client
    from storage_service.local import LocalCluster
    rows: list[Row] = []
    log.info("starting an rmq-spark LocalCluster with %s (3 nodes, 4 groups)", what)
    try:
        with LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "rmq-variant"),
                          **cluster_args) as cluster, Client(cluster.endpoints) as client:
            client.create_topic(TOPIC, queues=QUEUES)
            _rows_2_and_3(args, values, client, cluster, names, note, rows)
    except Exception as e:  # the other rows stand; the error is printed
        log.exception("rmq-spark benchmark with %s failed", what)
        return _not_measured(rows, names, e)
    return rows


def measure_rmq_no_metrics(args: argparse.Namespace, values: list[bytes], root: str) -> list[Row]:
    return measure_rmq_variant(args, values, root, OFF_ROWS, "--no-metrics", "nodes count nothing",
                               extra_args=["--no-metrics"])


def measure_rmq_no_fsync(args: argparse.Namespace, values: list[bytes], root: str) -> list[Row]:
    return measure_rmq_variant(args, values, root, NOSYNC_ROWS, "--fsync none",
                               "acked when on a majority, before fsync (Kafka's default)", fsync="none")


def measure_rmq_secure(args: argparse.Namespace, values: list[bytes], root: str) -> list[Row]:
    """Rows 2 and 3 on a secured cluster (TLS, --authorize), as a principal allowed
    only to produce to the topic, with its token; "n/a" rows if it cannot run."""
    from rmq_spark.client import Client, TlsFiles
    from storage_service.local import LocalCluster
    rows: list[Row] = []
    log.info("starting a secured rmq-spark LocalCluster (TLS, ACLs; 3 nodes, 4 groups)")
    try:
        with LocalCluster(nodes=3, groups=4, data_dir=os.path.join(root, "rmq-secure"), secure=True) as cluster:
            ca = TlsFiles(cluster.tls.ca)
            with Client(cluster.endpoints, tls=ca, token=cluster.token) as admin:
                admin.create_topic(TOPIC, queues=QUEUES)
                token = admin.create_principal("bench")["token"]
                admin.change_acls(True, [dict(principal="bench", resource_type="topic", name=TOPIC,
                                              operations=["produce"])])
            with Client(cluster.endpoints, tls=ca, token=token) as client:
                _rows_2_and_3(args, values, client, cluster, SEC_ROWS,
                              "TLS 1.3, principal with produce on the topic", rows)
    except Exception as e:  # the plaintext rows stand; the error is printed
        log.exception("secured rmq-spark benchmark failed")
        return _not_measured(rows, SEC_ROWS, e)
    return rows


def _lines_file(path: str, lines: int) -> None:
    """``lines`` distinct-looking text lines of MSG_SIZE bytes (newline excluded)."""
    pool = [base64.b64encode(os.urandom(MSG_SIZE)).decode()[:MSG_SIZE].encode() + b"\n" for _ in range(1000)]
    block = b"".join(pool)
    with open(path, "wb") as f:
        for _ in range(lines // len(pool)):
            f.write(block)


def measure_cli(cluster, root: str, seconds: float, pids: list[int]) -> Row:
    """``rmq produce TOPIC < file``: a file of lines through the command line, start-up
    included, as a user runs it (pipelined batches per queue, idempotent)."""
    lines = max(20_000, int(seconds * 100_000)) // 1000 * 1000
    path = os.path.join(root, "lines.txt")
    _lines_file(path, lines)
    from rmq_spark.client import Client
    with Client(cluster.endpoints) as c:
        c.create_topic("bench-cli", queues=QUEUES)
    meter = CpuMeter(pids)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    meter.start()
    log.info("  rmq produce (CLI): %s lines of %s from a file", f"{lines:,}", size_name())
    with open(path, "rb") as f:
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "rmq_spark.cli.main", "--endpoints", cluster.endpoints,
                              "produce", "bench-cli"], stdin=f, capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - t0
    meter.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    os.unlink(path)
    if out.returncode != 0:
        return Row(RMQ_CLI, note=f"n/a: rmq produce exit {out.returncode}: {out.stderr[-150:]}")
    acked = int(out.stdout.split("produced ", 1)[1].split()[0])
    child = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cpu = None if meter.seconds is None else (meter.seconds + child) / acked * 1e6
    return Row(RMQ_CLI, acked / wall, None, None, f"{acked:,} lines of {size_name()}, wall time incl. start-up", cpu)


# ---- peers -----------------------------------------------------------------

def nats_binary(env: dict[str, Any]) -> str:
    path = _peers.find_nats_server()
    if path is None:
        log.info("nats-server not found: installing Debian's nats-server with apt-get")
        t = time.monotonic()
        path = _peers.install_nats_server()
        env["nats_server_install_s"] = round(time.monotonic() - t, 1)
        log.info("installed nats-server in %.1f s", env["nats_server_install_s"])
    env["nats_server"] = _peers.nats_server_version(path)
    return path


async def _nats_stream(urls: list[str], replicas: int, max_pending: int = 4000,
                       timeout: float = 30.0):
    """Connect and (re)create the file-backed benchmark stream.

    Returns ``(nc, js)`` once the stream has a leader and every replica
    is current, so the first publish does not measure an election.
    """
    import nats
    from nats.js.api import StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    nc = await nats.connect(servers=urls, connect_timeout=5)
    js = nc.jetstream(timeout=10, publish_async_max_pending=max_pending)
    try:
        await js.delete_stream(STREAM)
    except NotFoundError:  # first use
        pass
    await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT], num_replicas=replicas,
                                     storage=StorageType.FILE))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = await js.stream_info(STREAM)
        cl = info.cluster
        if cl and cl.leader and len(cl.replicas or []) == replicas - 1 \
                and all(r.current for r in cl.replicas):
            return nc, js
        await asyncio.sleep(0.05)
    await nc.close()
    raise TimeoutError(f"stream {STREAM} has no current R{replicas} leader after {timeout}s")


async def nats_async_publish(urls: list[str], payload: bytes, seconds: float, warmup: float,
                             acked: _peers.Counter, meter: CpuMeter,
                             max_pending: int = 4000) -> dict[str, Any]:
    """Async-publish ``payload`` for ``warmup + seconds``; count acked messages.

    nats-py keeps at most ``max_pending`` publishes awaiting their ack. Only
    acks that arrive inside the measured window count towards the rate.
    """
    nc, js = await _nats_stream(urls, replicas=3, max_pending=max_pending)
    errors = _peers.Counter()

    def on_ack(fut: asyncio.Future) -> None:
        (errors if fut.cancelled() or fut.exception() else acked).add()

    try:
        t0 = time.monotonic()
        marks: list[tuple[float, int]] = []
        while (now := time.monotonic()) < t0 + warmup + seconds:
            if not marks and now >= t0 + warmup:
                meter.start()
                marks.append((now, acked.value))
            (await js.publish_async(SUBJECT, payload)).add_done_callback(on_ack)
        marks.append((time.monotonic(), acked.value))
        meter.stop()
        await asyncio.wait_for(js.publish_async_completed(), timeout=30)
    finally:
        await nc.close()
    (t1, c1), (t2, c2) = marks[0], marks[-1]
    return {"messages": c2 - c1, "seconds": t2 - t1, "errors": errors.value}


async def nats_sync_latency(urls: list[str], payload: bytes, seconds: float,
                            done: _peers.Counter, max_calls: int = 100_000) -> list[float]:
    """Sequential ``js.publish`` (wait for each ack); returns latencies in s."""
    nc, js = await _nats_stream(urls, replicas=3)
    lat: list[float] = []
    try:
        for _ in range(20):  # warm the connection and the stream's raft group
            await js.publish(SUBJECT, payload)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(lat) < max_calls:
            t = time.perf_counter()
            await js.publish(SUBJECT, payload)
            lat.append(time.perf_counter() - t)
            done.add()
    finally:
        await nc.close()
    return lat


def measure_nats(args: argparse.Namespace, payload: bytes, root: str,
                 env: dict[str, Any]) -> Row:
    env["nats_py"] = _peers.ensure_nats_py()
    binary = nats_binary(env)
    log.info("starting 3-node JetStream cluster (%s, nats-py %s)", env["nats_server"],
             env["nats_py"])
    with _peers.NatsCluster(binary, os.path.join(root, "nats")) as cluster:
        t = time.monotonic()
        leader = cluster.wait_ready()
        log.info("JetStream meta leader %s elected after %.2f s", leader, time.monotonic() - t)
        acked = _peers.Counter()
        with progress("nats async publish", lambda: acked.value, "msgs acked"):
            meter = CpuMeter([p.pid for p in cluster.procs])
            res = asyncio.run(nats_async_publish(cluster.urls, payload, args.seconds,
                                                 args.warmup, acked, meter))
        calls = _peers.Counter()
        with progress("nats sync publish latency", lambda: calls.value, "calls"):
            lat = asyncio.run(nats_sync_latency(cluster.urls, payload, args.seconds, calls))
    p50, p99 = percentiles_ms(lat)
    note = "p50/p99: sync publish" + (f", {res['errors']} nacks" if res["errors"] else "")
    return Row(NATS, res["messages"] / res["seconds"], p50, p99, note,
               meter.per_msg_us(res["messages"]))


def measure_ceiling(args: argparse.Namespace, root: str, fast_wire: bool) -> Row:
    workdir = os.path.join(root, "syncobj-fast" if fast_wire else "syncobj")
    os.makedirs(workdir, exist_ok=True)
    ceiling = _peers.SyncObjCeiling(workdir, batch=100, msg_size=MSG_SIZE,
                                    payload=args.payload, fast_wire=fast_wire)
    log.info("starting 3 pysyncobj processes (journal on, %.0f ms tick, %s wire)",
             ceiling.tick * 1e3, "fast" if fast_wire else "stock")
    label = "pysyncobj append" + (" fast wire" if fast_wire else "")
    with progress(label, ceiling.acked_messages, "msgs acked"):
        res = ceiling.run(args.seconds, args.warmup)
    note = f"{res['window']} cmds in flight, 100 msgs/cmd"
    if res["failures"]:
        note += f", {res['failures']} failed cmds"
    if res["warnings"]:
        note += f", {res['warnings']} pysyncobj warnings"
        log.warning("pysyncobj logged %d warnings, first: %s", res["warnings"],
                    res["first_warning"])
    return Row(CEILING_FAST if fast_wire else CEILING, res["messages"] / res["seconds"],
               note=note)


# ---- report ----------------------------------------------------------------

def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def render_table(rows: list[Row]) -> str:
    header = ["system", "msgs/s", "MB/s", "p50 ms", "p99 ms", "CPU us/msg", "notes"]
    body = [[r.name, _fmt(r.msgs_per_s, ",.0f"), _fmt(r.mb_per_s, ",.1f"),
             _fmt(r.p50_ms, ".2f"), _fmt(r.p99_ms, ".2f"), _fmt(r.cpu_us, ".1f"), r.note]
            for r in rows]
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
    align = ["<", ">", ">", ">", ">", ">", "<"]

    def line(cells: list[str]) -> str:
        return "  ".join(f"{c:{a}{w}}" for c, a, w in zip(cells, align, widths)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule] + [line(b) for b in body])


def evaluate_targets(by_name: dict[str, Row]) -> list[dict[str, Any]]:
    """The targets, the batched ones checked on each batched row on its own."""
    b1, nats = by_name[RMQ_B1], by_name[NATS]
    checks = []
    for row, how in ((by_name[RMQ_B100], "1 queue/call"), (by_name[RMQ_B100X8], "8 queues/call")):
        x_nats = (row.msgs_per_s / nats.msgs_per_s
                  if row.msgs_per_s is not None and nats.msgs_per_s else None)
        checks += [
            (f"batched produce ({how}) >= {TARGET_BATCHED_MSGS:,} acked {size_name()} msgs/s",
             row.msgs_per_s, ",.0f", lambda v: v >= TARGET_BATCHED_MSGS),
            (f"batched produce ({how}) >= {TARGET_X_NATS:g}x NATS JetStream nats-py publish rate",
             x_nats, ".2f", lambda v: v >= TARGET_X_NATS),
        ]
    for ours, kafka, how in ((NOSYNC_B100X8, KAFKA_TUNED, "--fsync none (ack before fsync, as Kafka)"),
                             (RMQ_B100X8, KAFKA_FLUSH, "fsync on a majority vs Kafka fsyncing every append")):
        a, b = by_name[ours].msgs_per_s, by_name[kafka].msgs_per_s
        checks.append((f"8 queues/call, {how} >= Kafka tuned", a / b if a is not None and b else None,
                       ".2f", lambda v: v >= 1.0))
    cli, b100x8 = by_name[RMQ_CLI], by_name[RMQ_B100X8]
    share = (cli.msgs_per_s / b100x8.msgs_per_s if cli.msgs_per_s is not None and b100x8.msgs_per_s
             else None)
    checks.append((f"rmq produce (CLI) >= {TARGET_CLI_SHARE:.0%} of the batched 8 queues/call rate",
                   share, ".2f", lambda v: v >= TARGET_CLI_SHARE))
    checks.append((f"single-message produce p99 <= {TARGET_P99_MS:g} ms",
                   b1.p99_ms, ".2f", lambda v: v <= TARGET_P99_MS))
    for on, off, how in ((RMQ_B100, OFF_B100, "1 queue/call"), (RMQ_B100X8, OFF_B100X8, "8 queues/call")):
        a, b = by_name[on].msgs_per_s, by_name[off].msgs_per_s
        checks.append((f"produce with metrics ({how}) >= {TARGET_METRICS:.0%} of --no-metrics",
                       a / b if a is not None and b else None, ".2f", lambda v: v >= TARGET_METRICS))
    for sec, plain, how in ((SEC_B100, RMQ_B100, "1 queue/call"), (SEC_B100X8, RMQ_B100X8, "8 queues/call")):
        if sec in by_name:
            a, b = by_name[sec].msgs_per_s, by_name[plain].msgs_per_s
            checks.append((f"TLS + token produce ({how}) >= {TARGET_SECURE:.0%} of plaintext",
                           a / b if a is not None and b else None, ".2f", lambda v: v >= TARGET_SECURE))
    return [{"target": text, "value": value, "shown": _fmt(value, spec),
             "met": None if value is None else bool(ok(value))}
            for text, value, spec, ok in checks]


def ratios(by_name: dict[str, Row]) -> dict[str, float | None]:
    nats, b1, b100 = by_name[NATS], by_name[RMQ_B1], by_name[RMQ_B100]
    b100x8, over_grpc = by_name[RMQ_B100X8], by_name[RMQ_B100X8_GRPC]
    pairs = {f"{RMQ_B1}: msgs/s / NATS": (b1.msgs_per_s, nats.msgs_per_s),
             f"{RMQ_B100}: msgs/s / NATS": (b100.msgs_per_s, nats.msgs_per_s),
             f"{RMQ_B100X8}: msgs/s / NATS": (b100x8.msgs_per_s, nats.msgs_per_s),
             f"{RMQ_B1}: p50 / NATS sync p50": (b1.p50_ms, nats.p50_ms),
             f"{RMQ_B1}: p99 / NATS sync p99": (b1.p99_ms, nats.p99_ms),
             PORT_VS_GRPC: (b100x8.msgs_per_s, over_grpc.msgs_per_s),
             "8 queues/call: produce port / gRPC CPU per msg": (b100x8.cpu_us, over_grpc.cpu_us),
             CLI_VS_BATCHED: (by_name[RMQ_CLI].msgs_per_s, b100x8.msgs_per_s),
             "batch=100: HTTP/JSON / gRPC msgs/s": (by_name[RMQ_HTTP_B100].msgs_per_s, b100.msgs_per_s),
             "batch=100: metrics on / --no-metrics msgs/s": (b100.msgs_per_s, by_name[OFF_B100].msgs_per_s),
             "8 queues/call: metrics on / --no-metrics msgs/s": (b100x8.msgs_per_s,
                                                                 by_name[OFF_B100X8].msgs_per_s),
             "batch=100: metrics on / off CPU per msg": (b100.cpu_us, by_name[OFF_B100].cpu_us),
             "8 queues/call, --fsync none / Kafka tuned (neither fsyncs before the ack)":
                 (by_name[NOSYNC_B100X8].msgs_per_s, by_name[KAFKA_TUNED].msgs_per_s),
             "8 queues/call (fsync on a majority) / Kafka tuned, fsync per append":
                 (b100x8.msgs_per_s, by_name[KAFKA_FLUSH].msgs_per_s),
             "8 queues/call (fsync on a majority) / Kafka tuned (no fsync)":
                 (b100x8.msgs_per_s, by_name[KAFKA_TUNED].msgs_per_s),
             "batch=100 (1 queue/call), --fsync none / Kafka tuned":
                 (by_name[NOSYNC_B100].msgs_per_s, by_name[KAFKA_TUNED].msgs_per_s),
             "batch=1: p99 / Kafka one message at a time p99": (b1.p99_ms, by_name[KAFKA_SHIPPED].p99_ms)}
    if SEC_B100 in by_name:
        pairs.update({f"{SEC_B100}: msgs/s / plaintext": (by_name[SEC_B100].msgs_per_s, b100.msgs_per_s),
                      f"{SEC_B100X8}: msgs/s / plaintext (produce port)":
                          (by_name[SEC_B100X8].msgs_per_s, b100x8.msgs_per_s),
                      f"{SEC_B100X8}: msgs/s / plaintext over gRPC":
                          (by_name[SEC_B100X8].msgs_per_s, over_grpc.msgs_per_s),
                      f"{SEC_B100X8}: CPU per msg / plaintext (produce port)":
                          (by_name[SEC_B100X8].cpu_us, b100x8.cpu_us)})
    return {k: None if a is None or not b else a / b for k, (a, b) in pairs.items()}


def print_report(rows: list[Row], targets: list[dict[str, Any]],
                 ratio_map: dict[str, float | None], args: argparse.Namespace) -> None:
    print(f"\nproduce benchmark: {size_name()} {args.payload} values, {args.seconds:g} s per phase "
          f"(+{args.warmup:g} s warm-up), {args.rounds} round(s), {os.cpu_count()} cores\n")
    print(render_table(rows))
    print("\nratios (ours / NATS, produce port / gRPC; throughput: higher is better, latency and CPU: lower)")
    width = max(len(k) for k in ratio_map)
    for key, value in ratio_map.items():
        print(f"  {key:<{width}}  {_fmt(value, '.2f')}")
    print("\ntargets")
    width = max(len(t["target"]) for t in targets)
    for t in targets:
        print(f"  {t['target']:<{width}}  {t['shown']:>10}  {VERDICT[t['met']]}")


# ---- program ---------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=None,
                   help="measured seconds per phase (default 5; 1 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 s phases, short warm-up (numbers are rough)")
    p.add_argument("--skip-nats", action="store_true", help="do not run the NATS row")
    p.add_argument("--skip-kafka", action="store_true", help="do not run the Kafka rows")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--threads", type=int, default=8,
                   help="concurrent rmq producer threads (default 8)")
    p.add_argument("--msg-size", type=int, default=1024,
                   help="bytes per message value (default 1024)")
    p.add_argument("--payload", choices=_peers.PAYLOAD_KINDS, default="random",
                   help="message values (default random: incompressible)")
    p.add_argument("--secure", action="store_true",
                   help="also measure batch=100 rows on a cluster with TLS and ACLs, with a token")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of rmq-spark then NATS; the table shows medians "
                        "(default 3; 1 with --quick)")
    args = p.parse_args(argv)
    if args.seconds is None:
        args.seconds = 1.0 if args.quick else 5.0
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.seconds <= 0 or args.threads <= 0 or args.msg_size <= 0 or args.rounds <= 0:
        p.error("--seconds, --threads, --msg-size and --rounds must be positive")
    args.warmup = 0.2 if args.quick else min(1.0, args.seconds / 5)
    return args


def run_all(args: argparse.Namespace, env: dict[str, Any]) -> tuple[list[Row], list[list[Row]]]:
    """The table's rows (medians over rounds) and every round's own rows.

    rmq-spark and NATS take turns, ``--rounds`` times, each on a fresh
    cluster, so both see the same machine: a single pass moved their ratio
    by 15% from one run to the next. The pysyncobj ceilings run once.
    """
    values = _peers.make_payloads(args.payload, 100, MSG_SIZE)
    rounds: list[list[Row]] = []
    with tempfile.TemporaryDirectory(prefix="rmq-bench-") as root:
        for r in range(args.rounds):
            log.info("round %d of %d", r + 1, args.rounds)
            sub = os.path.join(root, f"round-{r}")
            settle()
            secure: list[Row] = []
            if args.secure and r % 2:               # the two clusters' order alternates by round
                secure = measure_rmq_secure(args, values, sub)
                settle(os.path.join(sub, "rmq-secure"))
            off: list[Row] = []                     # the variants' order alternates by round
            variants = (measure_rmq_no_metrics, measure_rmq_no_fsync)
            if r % 2:
                for measure in variants:
                    off += measure(args, values, sub)
                    settle(os.path.join(sub, "rmq-variant"))
            rows = measure_rmq(args, values, os.path.join(sub, "rmq"), grpc_first=bool(r % 2))
            settle(os.path.join(sub, "rmq"))
            if not r % 2:
                for measure in reversed(variants):
                    off += measure(args, values, sub)
                    settle(os.path.join(sub, "rmq-variant"))
            rows += sorted(off, key=lambda row: (OFF_ROWS + NOSYNC_ROWS).index(row.name))
            if args.secure and not r % 2:
                secure = measure_rmq_secure(args, values, sub)
                settle(os.path.join(sub, "rmq-secure"))
            if args.skip_kafka:
                rows += [Row(n, note="skipped (--skip-kafka)") for n in KAFKA_ROWS]
            else:
                rows += measure_kafka(args, values, sub)
                settle(os.path.join(sub, "kafka"))
                settle(os.path.join(sub, "kafka-flush"))
            if args.skip_nats:
                rows.append(Row(NATS, note="skipped (--skip-nats)"))
            else:
                rows.append(measured(NATS, lambda: measure_nats(args, values[0], sub, env)))
            settle(os.path.join(sub, "nats"))
            rounds.append(rows + secure)
        rows = median_rows(rounds)
        rows.append(measured(CEILING, lambda: measure_ceiling(args, root, fast_wire=False)))
        rows.append(measured(CEILING_FAST, lambda: measure_ceiling(args, root, fast_wire=True)))
    return rows, rounds


def settle(remove: str | None = None) -> None:
    """Untimed, between systems: delete what the last one wrote and flush the
    page cache, so its write-back (a GB or more per round) does not land on
    the next measurement. Without this the second and third rounds ran 40%
    slower than the first."""
    if remove is not None:
        shutil.rmtree(remove, ignore_errors=True)
    os.sync()


def median_rows(rounds: list[list[Row]]) -> list[Row]:
    """Each row's median over the rounds that measured it (n/a if none did)."""
    if len(rounds) == 1:
        return list(rounds[0])
    out = []
    for i, first in enumerate(rounds[0]):
        measured_rows = [rs[i] for rs in rounds if rs[i].msgs_per_s is not None]
        if not measured_rows:
            out.append(first)
            continue

        def med(attr: str) -> float | None:
            vals = [getattr(r, attr) for r in measured_rows if getattr(r, attr) is not None]
            return statistics.median(vals) if vals else None

        note = f"{first.note}; median of {len(measured_rows)} rounds".lstrip("; ")
        out.append(Row(first.name, med("msgs_per_s"), med("p50_ms"), med("p99_ms"), note,
                       med("cpu_us")))
    return out


def measured(name: str, measure: Callable[[], Row]) -> Row:
    """A peer's row, or an "n/a" row naming the error: one failing peer (say, an
    election in the middle of a run on a busy machine) must not lose the table."""
    try:
        return measure()
    except Exception as e:
        log.exception("%s failed", name)
        return Row(name, note=f"n/a: {type(e).__name__}: {e}"[:200])


def write_json(path: str, args: argparse.Namespace, env: dict[str, Any], rows: list[Row],
               targets: list[dict[str, Any]], ratio_map: dict[str, float | None],
               rounds: list[list[dict[str, Any]]]) -> None:
    doc = {"config": {k: v for k, v in vars(args).items() if k != "json"},
           "environment": env, "rows": [r.as_dict() for r in rows],
           "ratios_vs_nats": ratio_map, "targets": targets, "rounds": rounds}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    # asyncio.run's own SIGINT handling only cancels the task, and nats-py
    # turns that CancelledError into a normal return: Ctrl-C got lost.
    signal.signal(signal.SIGINT, _interrupt)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)
    args = parse_args(argv)
    global MSG_SIZE
    MSG_SIZE = args.msg_size
    from importlib.metadata import version
    env: dict[str, Any] = {"python": platform.python_version(), "cores": os.cpu_count(),
                           "pysyncobj": version("pysyncobj"), "machine": platform.machine()}
    try:
        rows, rounds = run_all(args, env)
    except KeyboardInterrupt:
        log.error("interrupted; every server this run started has been stopped")
        return 130
    by_name = {r.name: r for r in rows}
    targets, ratio_map = evaluate_targets(by_name), ratios(by_name)
    print_report(rows, targets, ratio_map, args)
    per_round = [ratios({r.name: r for r in rs}) for rs in rounds]
    if len(rounds) > 1:
        print("\nper round (msgs/s, and x NATS)")
        for name in (RMQ_B100, RMQ_B100X8, RMQ_B100X8_GRPC, NATS):
            cells = []
            for rs, rm in zip(rounds, per_round):
                row = next(r for r in rs if r.name == name)
                x = rm.get(f"{name}: msgs/s / NATS")
                cells.append(_fmt(row.msgs_per_s, ",.0f") + (f" ({x:.2f}x)" if x else ""))
            print(f"  {name:<44} " + "  ".join(cells))
        paired = [rm.get(PORT_VS_GRPC) for rm in per_round]
        if all(paired):
            print(f"  {'produce port / gRPC, same cluster (paired)':<44} "
                  + "  ".join(f"{x:.2f}x" for x in paired)
                  + f"   median {statistics.median(paired):.2f}x")
    if args.json:
        write_json(args.json, args, env, rows, targets, ratio_map,
                   [[r.as_dict() for r in rs] for rs in rounds])
        log.info("wrote %s", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
