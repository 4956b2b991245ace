"""Fetched batches -> one Arrow RecordBatch (rmq_spark.client.arrow), checked record by record."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from rmq_spark.client.arrow import (ARROW_SCHEMA, HEADERS_FIELD, batches_to_arrow, empty_batch,
                                    with_headers)
from storage_service.protocol import framing, records

pytestmark = pytest.mark.unit


def _fetched(seed: int, batches: int = 6, gaps: bool = False):
    """Framed batches with keys, null values, tags, properties; offset gaps when asked."""
    rng = random.Random(seed)
    out, want, base = [], [], 100
    for b in range(batches):
        n = rng.randrange(1, 9)
        deltas = sorted(rng.sample(range(n * 3), n)) if gaps else list(range(n))
        keys = [None if rng.random() < 0.3 else f"k{rng.randrange(50)}".encode() for _ in range(n)]
        values = [None if rng.random() < 0.2 else bytes(rng.randrange(256) for _ in range(rng.randrange(20)))
                  for _ in range(n)]
        tags = [rng.choice(["", "TagA", "é-tag"]) for _ in range(n)]
        props = [{f"p{j}": f"v{j}é" for j in range(rng.randrange(3))} for _ in range(n)]
        born = [rng.randrange(1, 10**12) for _ in range(n)]
        block = records.encode(values, keys, tags, props, born, deltas)
        ts = 1_700_000_000_000 + b
        out.append(framing.frame_batch(base, ts, n, b + 1, block))
        for i in range(n):
            want.append(dict(key=keys[i], value=values[i], offset=base + deltas[i], tags=tags[i],
                             properties=props[i], born=born[i], ts=ts))
        base += deltas[-1] + 1 + (rng.randrange(4) if gaps else 0)
    return b"".join(out), want


def _rows(rb):
    d = rb.to_pydict()
    return [dict(key=d["key"][i], value=d["value"][i], offset=d["offset"][i], tags=d["tags"][i],
                 properties=dict(d["properties"][i]),
                 born=int(d["born_timestamp"][i].timestamp() * 1000 + 0.5),
                 ts=int(d["timestamp"][i].timestamp() * 1000 + 0.5)) for i in range(rb.num_rows)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gaps", [False, True])
def test_every_field_of_every_record_in_many_batches(seed, gaps):
    buf, want = _fetched(seed, gaps=gaps)
    rb = batches_to_arrow(buf, "topic-é", 3)
    assert rb.schema == ARROW_SCHEMA
    assert _rows(rb) == want
    assert set(rb.column("topic").to_pylist()) == {"topic-é"} and set(rb.column("queue").to_pylist()) == {3}
    assert len(set(rb.column("msg_id").to_pylist())) == len(want)


@pytest.mark.parametrize("gaps", [False, True])
def test_start_and_end_trim_across_batches(gaps):
    buf, want = _fetched(7, batches=8, gaps=gaps)
    offsets = [w["offset"] for w in want]
    for start, end in [(offsets[3], offsets[-4]), (offsets[0] - 5, None), (offsets[5] + 1, offsets[5] + 2),
                       (offsets[-1] + 1, None)]:
        got = _rows(batches_to_arrow(buf, "t", 0, start, end))
        assert got == [w for w in want if w["offset"] >= start and (end is None or w["offset"] < end)]


def test_bytes_read_from_a_file_must_be_the_located_batches():
    # expect_next: a short-circuit read (storage_service.protocol.localread) checks that what it
    # read ends where the node said and holds the requested offset.
    buf, want = _fetched(3, batches=4)
    frames = list(framing.iter_batches(buf))
    last = frames[-1].next_offset
    assert _rows(batches_to_arrow(buf, "t", 0, want[0]["offset"], expect_next=last)) == want
    for start, expect in ((want[0]["offset"], last + 1), (last, last)):
        with pytest.raises(framing.CorruptBatch):
            batches_to_arrow(buf, "t", 0, start, expect_next=expect)
    swapped = buf[frames[1].position:frames[2].position] + buf[:frames[1].position]
    with pytest.raises(framing.CorruptBatch, match="out of order|not at"):
        batches_to_arrow(swapped, "t", 0, 0, expect_next=frames[0].next_offset)


def _headers(rb):
    return [None if h is None else [(e["key"], e["value"]) for e in h]
            for h in rb.column("headers").to_pylist()]


@pytest.mark.parametrize("seed", range(4))
def test_with_headers_is_properties_as_kafka_headers(seed):
    """includeHeaders: one {key, value: UTF-8 bytes} per property, null without properties,
    inserted after ``properties``; slices (trimmed fetches) and empty batches too."""
    buf, want = _fetched(seed)
    rb = batches_to_arrow(buf, "t", 0)
    for part in (rb, rb.slice(2, rb.num_rows - 3), rb.slice(rb.num_rows), empty_batch()):
        got = with_headers(part)
        names = ARROW_SCHEMA.names
        at = names.index("properties") + 1
        assert got.schema.names == names[:at] + ["headers"] + names[at:]
        assert got.schema.field("headers") == HEADERS_FIELD
        assert got.drop_columns(["headers"]).equals(part)
        props = part.column("properties").to_pylist()
        assert _headers(got) == [[(k, v.encode()) for k, v in p] or None for p in props]
    assert any(w["properties"] for w in want) and any(not w["properties"] for w in want)


def test_with_headers_null_properties_from_an_archive():
    props = pa.array([[("a", "1")], None, []], pa.map_(pa.string(), pa.string()))
    rb = pa.RecordBatch.from_arrays([props], ["properties"])
    assert _headers(with_headers(rb)) == [[("a", b"1")], None, None]
