"""``spark.read.format("rocketmq").option("latestPerKey", "true")``: one row per live key of
compact topics, read from the nodes' key index (issue 40, RIP-22), without the compaction job.

A partition is one queue; its task pages through the queue leader's live keys with their
values (``KvRead`` KEYS, as ``Client.kv_watch`` starts), so the rows are each key's latest
put as the leader had applied it when the page was read. The columns are the source's:
``offset`` is the key's revision, ``timestamp`` its store time; tags, properties and the
producer's timestamp are not kept by the index (empty)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from rmq_spark.client import Client
from rmq_spark.client._types import msg_id
from rmq_spark.client.arrow import ARROW_SCHEMA
from storage_service.proto import rmq_pb2

from . import _planning
from ._options import ReadOptions
from .errors import OptionError

__all__ = ["KvLatestReader", "check_latest_per_key"]

PAGE = 5000


@dataclass(frozen=True)
class KvQueue(InputPartition):
    topic: str
    queue: int


def check_latest_per_key(opts: ReadOptions) -> None:
    """``latestPerKey`` reads the live keys now: offsets and headers do not apply."""
    for name, given in (("startingOffsets", opts.starting), ("endingOffsets", opts.ending),
                        ("includeHeaders", opts.include_headers)):
        if given:
            raise OptionError(name, "does not apply with latestPerKey=true (one row per live key, "
                              "as the nodes hold it now); leave it out")


class KvLatestReader(DataSourceReader):
    def __init__(self, opts: ReadOptions):
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        with Client(self.opts.endpoints, tls=self.opts.tls, token=self.opts.token) as client:
            state = _planning.subscribed_state(client, self.opts)
            for topic in state:
                policy = client.describe_topic(topic).get("cleanup_policy")
                if policy != "compact":
                    raise OptionError("latestPerKey", f"topic {topic!r} has cleanup policy {policy!r}: one row "
                                      "per key needs a compact topic (rmq topic create NAME --cleanup-policy "
                                      "compact)")
        return [KvQueue(t, q) for t in sorted(state) for q in sorted(state[t])]

    def read(self, partition: KvQueue) -> Iterator[pa.RecordBatch]:
        opts, topic, q = self.opts, partition.topic, partition.queue
        with Client(opts.endpoints, tls=opts.tls, token=opts.token) as client:
            after = None
            while True:
                req = rmq_pb2.KvReadRequest(topic=topic, op=rmq_pb2.KvReadRequest.KEYS, queue=q, limit=PAGE,
                                            values=True, allow_follower=opts.read_from == "follower")
                if after is not None:
                    req.after = after
                entries = client.call("KvRead", req, group=None if req.allow_follower
                                      else client.group_of(topic, q)).entries
                if entries:
                    yield _batch(topic, q, entries)
                if len(entries) < PAGE:
                    return
                after = entries[-1].key


def _batch(topic: str, queue: int, entries) -> pa.RecordBatch:
    n = len(entries)
    ts = pa.array([e.store_timestamp * 1000 for e in entries], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    return pa.RecordBatch.from_arrays([
        pa.array([e.key for e in entries], pa.binary()),
        pa.array([e.value for e in entries], pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array([queue] * n, pa.int32()),
        pa.array([e.revision for e in entries], pa.int64()),
        ts,
        pa.nulls(n, pa.timestamp("us", tz="UTC")),
        pa.array([""] * n, pa.string()),
        pa.array([[] for _ in range(n)], pa.map_(pa.string(), pa.string())),
        pa.array([msg_id(topic, queue, e.revision) for e in entries], pa.string()),
    ], schema=ARROW_SCHEMA)
