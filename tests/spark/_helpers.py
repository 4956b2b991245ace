"""Small helpers shared by the Spark tests."""
from __future__ import annotations

from rmq_spark.client import Client, Message


def produce(client: Client, topic: str, count: int, queues: int = 4, prefix: str = "m",
            tags=None, start: int = 0, size: int = 0) -> list[bytes]:
    """``count`` distinct values spread round-robin over ``queues``, one call per queue."""
    by_queue: dict[int, list[Message]] = {}
    values = []
    for i in range(start, start + count):
        value = f"{prefix}-{i}".encode().ljust(size, b".")
        tag = tags(i) if callable(tags) else (tags or "")
        by_queue.setdefault(i % queues, []).append(Message(value, key=f"k{i}".encode(), tags=tag))
        values.append(value)
    for q, msgs in by_queue.items():
        client.produce(topic, msgs, queue=q)
    return values


def reader(spark, endpoints: str, topic: str, stream: bool = False, **options):
    r = (spark.readStream if stream else spark.read).format("rocketmq")
    r = r.option("endpoints", endpoints).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def values(df) -> list[bytes]:
    return [bytes(r.value) for r in df.select("value").collect()]


def retained_topic(client: Client, name: str, wait_until) -> str:
    """A 1-queue topic whose oldest segments retention has already removed."""
    client.create_topic(name, queues=1, retention_ms=1)
    for i in range(40):                             # ~160 KiB: several sealed 64 KiB segments
        client.produce(name, [Message(f"{i}-{j}".encode().ljust(1024, b"."))
                              for j in range(4)], queue=0)
    wait_until(lambda: client.offsets(name)[0].earliest > 0, timeout=30, what="retention")
    return name


class Batches:
    """A foreachBatch sink that keeps each micro-batch's values by batch id
    (a replayed batch replaces its first run, like an idempotent sink)."""

    def __init__(self, column: str = "value"):
        self.column = column
        self.by_id: dict[int, list] = {}
        self.order: list[int] = []

    def __call__(self, df, batch_id: int) -> None:
        self.by_id[batch_id] = [r[0] for r in df.select(self.column).collect()]
        self.order.append(batch_id)

    def sizes(self) -> list[int]:
        return [len(self.by_id[i]) for i in sorted(self.by_id)]

    def all(self) -> list:
        return [v for i in sorted(self.by_id) for v in self.by_id[i]]


def run_available_now(df, checkpoint, sink, timeout: float = 120):
    q = (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    try:
        q.awaitTermination(timeout)
        if q.exception():
            raise q.exception()
        if q.isActive:
            raise AssertionError(f"availableNow query still running after {timeout}s")
    finally:
        q.stop()
    return q


def produce_to(client: Client, topic: str, queue: int, count: int, prefix: str) -> list[bytes]:
    """``count`` distinct values to one queue, in one call."""
    vals = [f"{prefix}-{i}".encode() for i in range(count)]
    client.produce(topic, [Message(v) for v in vals], queue=queue)
    return vals
