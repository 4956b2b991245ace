"""What a node counts as requests pass, and the registry ``/metrics`` renders.

Counted on the request paths (gRPC, the produce port, HTTP): requests by
method, protocol and status code, their latency, produced and fetched
messages and bytes, and each raft journal's fsync latency. Everything read
from the node's state (raft indexes, queue offsets, lag, ...) is computed when
scraped (``state.StateCollector``), so it costs nothing between scrapes.

Each node has its own registry (not the process-global one): tests and the
embedded cluster may run more than one node in a process. The label values
are bounded: methods are the service's (~30), codes gRPC's (17), protocols 3,
raft groups the node's.
"""
from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.process_collector import ProcessCollector

__all__ = ["NodeMetrics", "LATENCY_BUCKETS", "FSYNC_BUCKETS"]

# seconds: a produce acknowledged after a raft round trip and an fsync (~1-20 ms
# here), a long poll that waited (up to 30 s)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class NodeMetrics:
    """One node's metrics; ``render()`` is the body of ``/metrics``."""

    def __init__(self):
        disable_created_metrics()    # no *_created series: a restart shows in process_start_time
        self.registry = r = CollectorRegistry(auto_describe=False)
        self._requests = Counter("rmq_requests", "Requests answered, by method, protocol (grpc, "
                                 "produce_port, http) and status code (gRPC's names)",
                                 ["method", "protocol", "code"], registry=r)
        self._latency = Histogram("rmq_request_duration_seconds", "Time from a request's arrival to "
                                  "its answer (a long-polling fetch's wait included)",
                                  ["method", "protocol"], buckets=LATENCY_BUCKETS, registry=r)
        self.produced_messages = Counter("rmq_produce_messages", "Messages committed by produce requests "
                                         "this node led (duplicates of a retried batch not counted)",
                                         registry=r)
        self.produced_bytes = Counter("rmq_produce_bytes", "Bytes of record blocks committed by produce "
                                      "requests this node led", registry=r)
        self.backlog_refusals = Counter("rmq_produce_backlog_refused", "Produce batches refused because "
                                        "their group's commit backlog was at its limit (bytes or batches)",
                                        registry=r)
        self.fetched_messages = Counter("rmq_fetch_messages", "Offsets fetches served here advanced "
                                        "their readers by", registry=r)
        self.fetched_bytes = Counter("rmq_fetch_bytes", "Bytes of record batches fetches served here "
                                     "returned (or handed to a local reader as a file span)", registry=r)
        self._fsync = Histogram("rmq_raft_journal_fsync_seconds", "fdatasync of a raft group's journal",
                                ["group"], buckets=FSYNC_BUCKETS, registry=r)
        ProcessCollector(namespace="rmq", registry=r)
        GCCollector(registry=r)      # python_gc_collections_total by generation (the process's)
        self._children: dict[tuple, tuple] = {}
        self._lock = threading.Lock()

    def request(self, method: str, protocol: str, code: str, seconds: float) -> None:
        """One request answered (``code``: a gRPC status code's name, OK included)."""
        key = (method, protocol, code)
        pair = self._children.get(key)
        if pair is None:
            with self._lock:
                pair = self._children[key] = (self._requests.labels(method, protocol, code),
                                              self._latency.labels(method, protocol))
        pair[0].inc()
        pair[1].observe(seconds)

    def produced(self, messages: int, nbytes: int) -> None:
        self.produced_messages.inc(messages)
        self.produced_bytes.inc(nbytes)

    def fetched(self, messages: int, nbytes: int) -> None:
        if messages > 0:
            self.fetched_messages.inc(messages)
        if nbytes > 0:
            self.fetched_bytes.inc(nbytes)

    def fsync_observer(self, group: int):
        """What a raft group's journal calls with each fdatasync's seconds."""
        return self._fsync.labels(str(group)).observe

    def register(self, collector) -> None:
        self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)
