"""Point lookups on a compact topic: hot tail first, then the compacted table.

The table holds every key's winner up to the compaction watermark; the hot
log above the watermark (the tail the job has not merged yet) may hold newer
records. ``latest`` scans each queue's tail for the key (Arrow, vectorised)
and compares the newest hit with the table's row by (queue, offset), the
order the compaction job uses; a tombstone wins as "no value". Before the
job's first run a topic has no table: the whole hot log is the tail.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.archive import layout
from rmq_spark.client import Client

from .errors import CompactionConfigError
from .table import CompactedTable, TableRow

__all__ = ["KeyLookup"]

TAIL_FETCH_BYTES = 4 << 20


class KeyLookup:
    """Latest value per key of one compact topic; keeps the table's log cached."""

    def __init__(self, client: Client, topic: str, table: str | None = None):
        cfg = client.describe_topic(topic)
        if cfg["cleanup_policy"] != "compact":
            raise CompactionConfigError(f"topic {topic!r} has cleanup policy "
                                        f"{cfg['cleanup_policy']!r}; lookups by key need a "
                                        "compact topic")
        if table is None and cfg["compacted_table"]:
            table = layout.parse_tier(cfg["compacted_table"]).path
        self.client, self.topic = client, topic
        self.table = CompactedTable(table) if table is not None else None   # None: hot log only

    def _tails(self):
        """Each queue's hot tail past the compaction watermark, to its end as its leader
        knows it: the fetch's own ``latest``, not ``describe_topic``'s, which the
        metadata leader answers from its own replica of the queue and which can trail a
        write just acknowledged (a lookup right after a produce missed it, seen once)."""
        for q in self.client.describe_topic(self.topic)["queue_info"]:
            off = max(q["earliest"], q.get("compacted", -1))
            while True:
                rb, nxt, _, latest = self.client.fetch_arrow(self.topic, q["queue"], off,
                                                             max_bytes=TAIL_FETCH_BYTES)
                if rb.num_rows:
                    yield rb
                if nxt <= off or nxt >= latest:
                    break
                off = nxt

    def latest(self, key: bytes) -> TableRow | None:
        """The key's latest value; None if it never had one or its latest is a tombstone."""
        best: TableRow | None = self.table.get(key) if self.table is not None else None
        for rb in self._tails():
            hit = np.nonzero(pc.equal(rb.column("key"), pa.scalar(key, pa.binary()))
                             .to_numpy(zero_copy_only=False))[0]
            if len(hit):
                row = _tail_row(rb, int(hit[-1]))
                if best is None or (row.queue, row.offset) > (best.queue, best.offset):
                    best = row
        return best if best is not None and best.value is not None else None

    def scan(self, prefix: bytes = b"", limit: int | None = None) -> list[TableRow]:
        """Latest value of every key starting with ``prefix``, in key order."""
        rows = {r.key: r for r in self.table.scan(prefix)} if self.table is not None else {}
        for rb in self._tails():
            keys = rb.column("key").to_pylist()
            for i, k in enumerate(keys):
                if k is not None and k.startswith(prefix):
                    row = _tail_row(rb, i)
                    cur = rows.get(k)
                    if cur is None or (row.queue, row.offset) > (cur.queue, cur.offset):
                        rows[k] = row
        out = sorted((r for r in rows.values() if r.value is not None), key=lambda r: r.key)
        return out[:limit] if limit is not None else out


def _tail_row(rb: pa.RecordBatch, i: int) -> TableRow:
    r = rb.slice(i, 1).to_pylist()[0]
    return TableRow(r["key"], r["value"], r["queue"], r["offset"],
                    int(r["timestamp"].timestamp() * 1000), r["tags"] or "",
                    dict(r["properties"] or []))
