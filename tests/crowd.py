"""A crowd of long-polling consumers and a few producers, for the many-clients test and bench.

``PollCrowd`` keeps ``n`` fetches with ``wait_ms`` outstanding on a topic's
queues (each at its queue's end, sent to the queue's leader), re-issuing each
one as soon as it is answered, the way a consumer's poll loop does. It runs
on gRPC futures: 2,000 pollers cost no client thread each. ``Producers`` are
threads that each produce one small message at a time and record how long
every call took.
"""
from __future__ import annotations

import collections
import statistics
import threading
import time

import grpc

from storage_service.proto import rmq_pb2, rmq_pb2_grpc
from storage_service.protocol.framing import iter_batches
from storage_service.protocol.placement import GRPC_OPTIONS

__all__ = ["PollCrowd", "Producers", "percentile", "leaders_of", "crowd_in_process"]


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def leaders_of(client, topic: str, queues: int) -> dict[int, str]:
    """queue -> gRPC address of its group's leader."""
    st = client.cluster_status()
    leader = {gs["group"]: gs["leader"] for n in st["nodes"] for gs in n.get("groups", []) if gs["leader"]}
    return {q: leader[client.group_of(topic, q)] for q in range(queues)}


class PollCrowd:
    def __init__(self, leaders: dict[int, str], topic: str, pollers: int, wait_ms: int,
                 channels_per_node: int = 8):
        self.topic, self.wait_ms = topic, wait_ms
        self.queues = sorted(leaders)
        chans = {a: [grpc.insecure_channel(a, options=GRPC_OPTIONS) for _ in range(channels_per_node)]
                 for a in set(leaders.values())}
        self._chans = [c for cs in chans.values() for c in cs]
        self._stubs = {i: rmq_pb2_grpc.MessageLogStub(chans[leaders[q]][i % channels_per_node])
                       for i, q in enumerate(self.queues * (pollers // len(self.queues) + 1))
                       if i < pollers}
        self._queue = {i: self.queues[i % len(self.queues)] for i in range(pollers)}
        self.offset = {i: 0 for i in range(pollers)}
        self.received: collections.Counter = collections.Counter()   # poller -> messages it got
        self.latencies: list[float] = []      # seconds from send to answer, every poll
        self.errors: collections.Counter = collections.Counter()
        self.error_details: list[str] = []
        self.outstanding = 0
        self._lock = threading.Lock()
        self._stopping = False
        self._futures: dict[int, grpc.Future] = {}

    def start(self, spread_s: float = 0.0) -> "PollCrowd":
        """Send every first poll, all at once or spread evenly over ``spread_s``
        (consumers started over a while: their polls do not all time out together)."""
        t0 = time.monotonic()
        for n, i in enumerate(self._queue):
            if spread_s:
                time.sleep(max(0.0, t0 + spread_s * n / len(self._queue) - time.monotonic()))
            self._issue(i)
        return self

    def _issue(self, i: int) -> None:
        req = rmq_pb2.FetchRequest(topic=self.topic, queue=self._queue[i], offset=self.offset[i],
                                   wait_ms=self.wait_ms)
        sent = time.monotonic()
        fut = self._stubs[i].Fetch.future(req, timeout=self.wait_ms / 1000 + 30)
        with self._lock:
            self._futures[i] = fut
            self.outstanding += 1
        fut.add_done_callback(lambda f: self._answered(i, sent, f))

    def _answered(self, i: int, sent: float, fut: grpc.Future) -> None:
        took = time.monotonic() - sent
        with self._lock:
            self.outstanding -= 1
            if fut.cancelled() or self._stopping:
                return
            err = fut.exception()
            if err is not None:
                self.errors[err.code().name] += 1
                if len(self.error_details) < 5:     # how long it waited tells a refused stream from a dropped wait
                    self.error_details.append(f"{err.code().name}: {err.details()} (poller {i}, queue "
                                              f"{self._queue[i]}, offset {self.offset[i]}, after {took:.2f} s; "
                                              f"{err.debug_error_string()})")
            else:
                self.latencies.append(took)
                resp = fut.result()
                self.received[i] += sum(h.count for h in iter_batches(resp.batches))
                self.offset[i] = max(self.offset[i], resp.next_offset)
            again = not self._stopping and err is None
        if again:
            self._issue(i)

    def late(self, slack_s: float = 1.0) -> int:
        """Polls answered later than their wait + ``slack_s``."""
        with self._lock:
            return sum(1 for t in self.latencies if t > self.wait_ms / 1000 + slack_s)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            futs = list(self._futures.values())
        for f in futs:
            f.cancel()
        for c in self._chans:
            c.close()


class Producers:
    """``n`` threads each producing one message at a time to ``topic`` (queues round robin)."""

    def __init__(self, client, topic: str, queues: int, n: int, pause_s: float = 0.02, size: int = 100):
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(client, topic, queues, k, pause_s, size),
                                          daemon=True) for k in range(n)]

    def _run(self, client, topic, queues, k, pause_s, size) -> None:
        q, payload = k % queues, b"x" * size
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                client.produce(topic, [payload], queue=q)
                took = time.monotonic() - t0
                with self._lock:
                    self.latencies.append(took)
            except Exception as e:              # recorded: the test and the bench report it
                with self._lock:
                    self.errors.append(repr(e))
            self._stop.wait(pause_s)

    def start(self) -> "Producers":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def summary(self) -> dict:
        with self._lock:
            lat = list(self.latencies)
        return {"produces": len(lat), "errors": len(self.errors),
                "p50_ms": percentile(lat, 50) * 1000, "p99_ms": percentile(lat, 99) * 1000,
                "max_ms": max(lat) * 1000 if lat else float("nan"),
                "mean_ms": statistics.fmean(lat) * 1000 if lat else float("nan")}


def _crowd_main(leaders, topic, pollers, wait_ms, spread_s, conn) -> None:
    crowd = PollCrowd(leaders, topic, pollers, wait_ms).start(spread_s)
    conn.send("started")
    conn.recv()                       # stop
    crowd.stop()
    conn.send({"polls": len(crowd.latencies), "late": crowd.late(), "errors": sum(crowd.errors.values()),
               "error_details": crowd.error_details, "received": dict(crowd.received)})


def crowd_in_process(leaders: dict[int, str], topic: str, pollers: int, wait_ms: int, spread_s: float = 0.0):
    """A PollCrowd in a process of its own (consumers are not the producers' process:
    sharing one GIL with them would time the client, not the nodes). Returns
    ``stop() -> dict`` of what the crowd saw."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_crowd_main, args=(leaders, topic, pollers, wait_ms, spread_s, there), daemon=True)
    proc.start()
    if not here.poll(120) or here.recv() != "started":
        proc.kill()
        raise RuntimeError("the poller process did not start")

    def stop() -> dict:
        here.send("stop")
        out = here.recv() if here.poll(120) else {"polls": 0, "late": 0, "errors": -1, "error_details": ["no answer"]}
        proc.join(30)
        return out
    return stop
