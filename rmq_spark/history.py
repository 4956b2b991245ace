"""Analytics over a topic's whole retained history (archive + hot log).

The notebooks call these; they hold no logic of their own. ``Sandbox`` sets
up what a notebook needs on a laptop: a local 3-node cluster and a tiered
topic whose older part has already left the hot log for the archive.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
import uuid
import zlib
from dataclasses import dataclass, field

from rmq_spark import fs
from rmq_spark.archive import layout
from rmq_spark.archive.reader import load_snapshot
from rmq_spark.client import Client, Message

__all__ = ["generate_history", "messages_per_hour", "footprint", "plot_messages_per_hour",
           "generate_balances", "last_per_key", "live_keys_over_time", "plot_live_keys",
           "Sandbox"]

HOUR_MS = 3_600_000
TAGS = ("order", "payment", "refund")


def generate_history(client: Client, topic: str, hours: int = 24, per_hour: int = 400,
                     tags: tuple[str, ...] = TAGS, now_ms: int | None = None,
                     batch: int = 100) -> int:
    """Produce ``hours`` of synthetic events whose producer time (``born_timestamp``)
    spreads over the past hours, with a daily rhythm and a tag mix that shifts.
    Returns the number of messages."""
    now_ms = now_ms or int(time.time() * 1000)
    queues = client.describe_topic(topic)["queues"]
    pending: dict[int, list[Message]] = {}
    n = 0
    for h in range(hours):
        start = now_ms - (hours - h) * HOUR_MS
        count = max(1, int(per_hour * (1 + 0.6 * math.sin(2 * math.pi * h / 24))))
        for i in range(count):
            tag = tags[0] if i % 10 < 6 else tags[1] if i % 10 < 9 - (h % 3 == 0) else tags[-1]
            born = start + i * HOUR_MS // count
            q = n % queues
            pending.setdefault(q, []).append(Message(
                value=f'{{"event": {n}, "hour": {h}}}'.encode().ljust(200, b" "),
                key=f"user-{n % 97}".encode(), tags=tag, born_timestamp=born))
            n += 1
            if len(pending[q]) >= batch:
                client.produce(topic, pending.pop(q), queue=q)
    for q, msgs in pending.items():
        client.produce(topic, msgs, queue=q)
    return n


def messages_per_hour(df, time_column: str = "born_timestamp"):
    """Messages per hour by tag, as a pandas DataFrame (hours x tags)."""
    from pyspark.sql import functions as F
    counts = (df.groupBy(F.date_trunc("hour", F.col(time_column)).alias("hour"), "tags")
              .count().toPandas())
    return (counts.pivot(index="hour", columns="tags", values="count").fillna(0)
            .astype("int64").sort_index())


@dataclass
class Footprint:
    hot_bytes: int
    archive_bytes: int
    archive_files: int
    hot_messages: int
    archived_to: dict[int, int] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, str]]:
        return [("hot log (bytes, leader replicas)", f"{self.hot_bytes:,}"),
                ("hot log (messages)", f"{self.hot_messages:,}"),
                ("archive (bytes)", f"{self.archive_bytes:,}"),
                ("archive (files)", f"{self.archive_files:,}")]


def footprint(client: Client, topic: str) -> Footprint:
    """Size of the topic's hot log on the nodes vs its archive."""
    d = client.describe_topic(topic)
    hot = sum(q["size_bytes"] for q in d["queue_info"])
    msgs = sum(q["latest"] - q["earliest"] for q in d["queue_info"])
    files = []
    if d["tier"]:
        snap = load_snapshot(layout.parse_tier(d["tier"]))
        files = [f for f in (snap.files if snap else []) if f.topic in (None, topic)]
    sizes = [fs.size(f.path) for f in files]        # None: removed by archive retention
    return Footprint(hot, sum(n for n in sizes if n is not None),
                     len(files), msgs, {q["queue"]: q["archived"] for q in d["queue_info"]})


def plot_messages_per_hour(per_hour, footprint_: Footprint | None = None, path: str | None = None):
    """Stacked bars of messages per hour by tag (and the storage split); returns the figure."""
    import matplotlib
    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ncols = 2 if footprint_ else 1
    fig, axes = plt.subplots(1, ncols, figsize=(11 if footprint_ else 8, 3.5),
                             gridspec_kw={"width_ratios": [3, 1]} if footprint_ else None,
                             squeeze=False)
    ax = axes[0][0]
    bottom = None
    labels = [h.strftime("%d %H:00") for h in per_hour.index]
    for tag in per_hour.columns:
        ax.bar(labels, per_hour[tag], bottom=bottom, label=tag)
        bottom = per_hour[tag] if bottom is None else bottom + per_hour[tag]
    ax.set_title("messages per hour by tag (whole retained history)")
    ax.set_ylabel("messages")
    ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    ax.legend()
    if footprint_:
        ax2 = axes[0][1]
        ax2.bar(["archive", "hot log"], [footprint_.archive_bytes / 1e6, footprint_.hot_bytes / 1e6],
                color=["#4c72b0", "#dd8452"])
        ax2.set_title("storage (MB)")
    fig.tight_layout()
    if path:
        fig.savefig(path)
    return fig


def generate_balances(client: Client, topic: str, accounts: int = 200, updates: int = 3000,
                      close_every: int = 40, seed: int = 7, batch: int = 100) -> int:
    """A change-log of account balances: each message sets ``account-N``'s balance;
    every ``close_every``-th update closes an account (a tombstone). Keys go to
    the queue of their hash, so each key's updates stay in order. Returns the count."""
    import random
    rng = random.Random(seed)
    queues = client.describe_topic(topic)["queues"]
    balance: dict[int, int] = {}
    pending: dict[int, list[Message]] = {}
    for i in range(updates):
        a = rng.randrange(accounts)
        key = f"account-{a:04d}".encode()
        if i % close_every == close_every - 1 and a in balance:
            balance.pop(a)
            msg = Message(None, key=key, tags="close")
        else:
            balance[a] = balance.get(a, 0) + rng.randrange(-50, 100)
            msg = Message(str(balance[a]).encode(), key=key, tags="update")
        q = zlib.crc32(key) % queues
        pending.setdefault(q, []).append(msg)
        if len(pending[q]) >= batch:
            client.produce(topic, pending.pop(q), queue=q)
    for q, msgs in pending.items():
        client.produce(topic, msgs, queue=q)
    return updates


def last_per_key(df):
    """Plain Spark recomputation of a compacted table: each key's last record by
    (queue, offset), tombstones dropped. Returns {key: value}."""
    from pyspark.sql import functions as F
    rows = (df.groupBy("key").agg(F.max_by(F.col("value"), F.struct("queue", "offset"))
                                  .alias("value")).where("value IS NOT NULL").collect())
    return {bytes(r.key): bytes(r.value) for r in rows}


def live_keys_over_time(df, points: int = 60):
    """Number of live keys (set and not deleted) after each stretch of the change-log,
    replayed in store-time order: a pandas Series indexed by time."""
    import pandas as pd
    rows = (df.select("key", "value", "timestamp", "queue", "offset")
            .orderBy("timestamp", "queue", "offset").collect())
    live: set[bytes] = set()
    times, counts = [], []
    step = max(1, len(rows) // points)
    for i, r in enumerate(rows):
        (live.discard if r.value is None else live.add)(bytes(r.key))
        if i % step == step - 1 or i == len(rows) - 1:
            times.append(r.timestamp)
            counts.append(len(live))
    return pd.Series(counts, index=pd.to_datetime(times), name="live keys")


def plot_live_keys(series, path: str | None = None):
    import matplotlib
    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.plot(series.index, series.values, drawstyle="steps-post")
    ax.set_title("live keys over the change-log")
    ax.set_ylabel("keys")
    fig.autofmt_xdate()
    fig.tight_layout()
    if path:
        fig.savefig(path)
    return fig


class Sandbox:
    """A local 3-node cluster with a tiered topic whose older part lives only in the archive.

    ``RMQ_ENDPOINTS`` set: use that cluster instead of starting one; the topic
    then gets a random suffix, so a notebook never writes into a topic of the
    README's tour (or of an earlier run) on the same cluster.
    """

    def __init__(self, topic: str = "nb-clicks", archive_format: str = "delta",
                 data_dir: str | None = None):
        shared = bool(os.environ.get("RMQ_ENDPOINTS"))
        self.topic = f"{topic}-{uuid.uuid4().hex[:6]}" if shared else topic
        self.format = archive_format
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="rmq-notebook-")
        self.dir = data_dir or self._tmp.name
        self.archive = os.path.join(self.dir, "archive")
        self.cluster = None
        self.endpoints = os.environ.get("RMQ_ENDPOINTS", "")

    def start(self) -> "Sandbox":
        if not self.endpoints:
            from storage_service.local import LocalCluster
            self.cluster = LocalCluster(nodes=3, groups=3, data_dir=os.path.join(self.dir, "nodes"),
                                        extra_args=["--segment-bytes", str(256 << 10),
                                                    "--retention-interval", "1"])
            self.cluster.start(timeout=90)
            self.endpoints = self.cluster.endpoints
        self.client = Client(self.endpoints)
        return self

    def create_topic(self, queues: int = 4, local_retention_ms: int = 1) -> str:
        """The topic, tiered to ``archive``; a tiny hot retention so the archive takes over."""
        existing = {t["name"] for t in self.client.list_topics()}
        if self.topic not in existing:
            self.client.create_topic(self.topic, queues=queues,
                                     tier=f"{self.format}:{self.archive}",
                                     local_retention_ms=local_retention_ms)
        return self.topic

    def create_compact_topic(self, queues: int = 4) -> str:
        """The topic with cleanup policy compact (its table: ``archive``)."""
        if self.topic not in {t["name"] for t in self.client.list_topics()}:
            self.client.create_topic(self.topic, queues=queues, cleanup_policy="compact")
        return self.topic

    def wait_hot_trimmed(self, timeout: float = 120) -> list:
        """Until hot retention has removed archived segments from every queue."""
        deadline = time.monotonic() + timeout
        while True:
            offs = self.client.offsets(self.topic)
            if all(o.earliest > 0 for o in offs):
                return offs
            if time.monotonic() > deadline:
                raise TimeoutError(f"hot retention did not trim {self.topic} within {timeout}s "
                                   f"(offsets {offs}); is the tiering job archiving?")
            time.sleep(0.5)

    def stop(self) -> None:
        if getattr(self, "client", None):
            self.client.close()
        if self.cluster is not None:
            self.cluster.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> "Sandbox":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
