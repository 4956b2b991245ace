"""Parsing and printing helpers for the CLI: durations, sizes, tables, times."""
from __future__ import annotations

import datetime as dt
import re

__all__ = ["parse_duration_ms", "parse_size_bytes", "table", "human_bytes", "utc_text"]

_DUR = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_SIZE = {"": 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40,
         "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_duration_ms(text: str) -> int:
    """'7d' -> ms. Units: ms, s, m, h, d; 0 or 'forever' means no limit."""
    t = text.strip().lower()
    if t in ("0", "forever", "none"):
        return 0
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d)", t)
    if not m:
        raise ValueError(f"duration {text!r}: use a number with a unit s, m, h or d (e.g. 30s, 7d), or 0")
    return int(m.group(1)) * _DUR[m.group(2)]


def parse_size_bytes(text: str) -> int:
    """'10GB' -> bytes. Units: B, KB, MB, GB, TB (powers of 1024); 0 means no limit."""
    m = re.fullmatch(r"(\d+)\s*([kmgt]?b?)", text.strip().lower())
    if not m:
        raise ValueError(f"size {text!r}: use a number with an optional unit KB, MB, GB or TB (e.g. 10GB)")
    return int(m.group(1)) * _SIZE[m.group(2)]


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def utc_text(ms: int) -> str:
    """Unix ms -> '2026-11-21 20:47:36 UTC'."""
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
