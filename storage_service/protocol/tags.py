"""Server-side tag filtering of fetched batches (RocketMQ ``TagA || TagB`` syntax).

Matching is vectorised over a batch's tags column. A batch where every record
matches is passed through as stored; one where none does is dropped; a mixed
batch is rewritten with only the matching records, keeping their offsets (the
offset deltas say where each record sits), so readers see gaps, not shifts.
"""
from __future__ import annotations

import re

import numpy as np

from . import framing, records

__all__ = ["parse_tag_expression", "filter_batches"]

_TAG = re.compile(r"^[^|\s]{1,128}$")


def parse_tag_expression(expr: str) -> frozenset[bytes] | None:
    """``"TagA || TagB"`` -> {b"TagA", b"TagB"}; ``""`` or ``"*"`` -> None (everything)."""
    expr = (expr or "").strip()
    if expr in ("", "*"):
        return None
    tags = [t.strip() for t in expr.split("||")]
    bad = [t for t in tags if not _TAG.match(t)]
    if bad:
        raise ValueError(f"tag expression {expr!r}: {bad[0]!r} is not a tag; use TagA || TagB "
                         "(tags are 1-128 characters without spaces or '|'), or * for all")
    return frozenset(t.encode() for t in tags)


def _mask(cols: records.Columns, wanted: frozenset[bytes]) -> np.ndarray:
    lengths = np.diff(cols.tags_off)
    data = np.frombuffer(cols.tags_data, np.uint8)
    mask = np.zeros(cols.n, bool)
    for tag in wanted:
        cand = np.nonzero(lengths == len(tag))[0]
        if not cand.size:
            continue
        idx = cols.tags_off[cand][:, None] + np.arange(len(tag))
        hit = (data[idx] == np.frombuffer(tag, np.uint8)).all(axis=1)
        mask[cand[hit]] = True
    return mask


def filter_batches(buf: bytes, wanted: frozenset[bytes] | None) -> bytes:
    """Keep only records whose tag is in ``wanted`` (None keeps everything)."""
    if wanted is None:
        return buf
    out = []
    mv = memoryview(buf)
    for h, cols in framing.iter_blocks(buf, deep_check=False):
        mask = _mask(cols, wanted)
        if mask.all():
            out.append(mv[h.position:h.position + h.size])
        elif mask.any():
            block = records.select(cols, np.nonzero(mask)[0].tolist())
            out.append(framing.frame_batch(h.base_offset, h.store_ts, int(mask.sum()),
                                         h.apply_position, block))
    return b"".join(out)
