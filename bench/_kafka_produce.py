"""Produce to the Kafka peer (``_kafka.KafkaCluster``) as a careful user would:
confluent-kafka (librdkafka) with ``acks=all`` and idempotence, round-robin
over the topic's partitions, the same values as the rmq-spark rows.

``linger_ms``: 5 is librdkafka's default ("as shipped"), 100 the tuned
setting of issue 24. The rate counts messages whose delivery report came back
without error in the measured window; the latency loop produces one message
and waits for its report, as rmq-spark's batch=1 latency loop does.
"""
from __future__ import annotations

import threading
import time

__all__ = ["kafka_fill", "kafka_latency", "kafka_throughput"]


def _producer(bootstrap: str, linger_ms: int, topic: str, partitions: int):
    """A producer that has its idempotence id and a connection to every partition's
    leader (one message to each, flushed), so the timing starts with a ready client."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": linger_ms, "batch.size": 1 << 20, "compression.type": "none",
                  "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1 << 20})
    for part in range(partitions):
        p.produce(topic, b"warm-up", partition=part)
    if p.flush(120) != 0:
        raise RuntimeError("Kafka producer not ready after 120 s")
    return p


def kafka_throughput(bootstrap: str, topic: str, values: list[bytes], partitions: int, seconds: float,
                     warmup: float, linger_ms: int) -> tuple[float, int]:
    """(acknowledged messages/s, errors) over ``seconds`` after ``warmup``."""
    p = _producer(bootstrap, linger_ms, topic, partitions)
    acked, errors = [0], [0]
    stop = threading.Event()

    def report(err, msg) -> None:
        if err is None:
            acked[0] += 1
        else:
            errors[0] += 1

    def run() -> None:
        i = 0
        while not stop.is_set():
            try:
                p.produce(topic, values[i % len(values)], partition=i % partitions, on_delivery=report)
                i += 1
            except BufferError:          # the local queue is full: wait for reports
                p.poll(0.01)
                continue
            if i % 1000 == 0:
                p.poll(0)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    poller = threading.Thread(target=lambda: [p.poll(0.05) for _ in iter(stop.is_set, True)], daemon=True)
    poller.start()
    time.sleep(warmup)
    t1, n1 = time.monotonic(), acked[0]
    time.sleep(seconds)
    t2, n2 = time.monotonic(), acked[0]
    stop.set()
    t.join(30)
    poller.join(30)
    p.flush(30)
    return (n2 - n1) / (t2 - t1), errors[0]


def kafka_latency(bootstrap: str, topic: str, values: list[bytes], seconds: float,
                  partitions: int = 8) -> list[float]:
    """Seconds from produce to delivery report, one message at a time (linger 0)."""
    p = _producer(bootstrap, 0, topic, partitions)
    out: list[float] = []
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        done = []
        t = time.perf_counter()
        p.produce(topic, values[i % len(values)], partition=i % partitions,
                  on_delivery=lambda e, m: done.append(e))
        while not done:
            p.poll(0.001)
        if done[0] is None:
            out.append(time.perf_counter() - t)
        i += 1
    return out


def kafka_fill(bootstrap: str, topic: str, batches, partitions: int) -> int:
    """Produce every value of ``batches`` (lists of values, partition round-robin per
    message) with a 100 ms linger, wait for every report; the count, or raise."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 100, "batch.size": 1 << 20, "compression.type": "none",
                  "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1 << 20})
    errors: list = []
    sent = 0

    def report(err, _msg) -> None:
        if err is not None:
            errors.append(err)

    for values in batches:
        for v in values:
            while True:
                try:
                    p.produce(topic, v, partition=sent % partitions, on_delivery=report)
                    break
                except BufferError:          # the local queue is full: wait for reports
                    p.poll(0.05)
            sent += 1
        p.poll(0)
    if p.flush(300) != 0 or errors:
        raise RuntimeError(f"Kafka fill of {topic}: {len(errors)} delivery errors, first {errors[:1]}")
    return sent
