"""The one grammar of durations and sizes, and their human-readable forms: the shared
kernel of the client (``rmq_spark.units``, whose ``UnitError`` is also an ``RmqError``)
and the storage node's flags (``--retention-interval 5s``, ``--segment-bytes 64MiB``).

Spark options (``maxTriggerDelay``), job triggers (``30s``), the CLIs
(``--retention 7d``, ``--retention-bytes 10GB``) and the jobs' messages all
read and print through here, so a value means the same wherever it is typed.

Durations: an integer, optional blanks, a unit ``ms``, ``s``, ``m`` (or
``min``), ``h`` or ``d``, in any case (``500ms``, ``30 s``, ``7D``). ``0``
needs no unit. A bare number is refused unless the caller says which unit it
is in (Spark options: milliseconds); ``forever``/``none`` (= 0) only where 0
means "no limit". Sizes: an integer with an optional unit ``B``, ``K``/``KB``,
``M``/``MB``, ``G``/``GB``, ``T``/``TB``, powers of 1024.
"""
from __future__ import annotations

import datetime as dt
import re

__all__ = ["UnitError", "DURATION_UNITS_MS", "DURATION_FORMS", "bytes_flag", "count_flag", "parse_duration_ms",
           "parse_size_bytes", "seconds_flag", "human_duration", "human_bytes", "utc_text"]

DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
                     "d": 86_400_000}
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION = re.compile(r"(\d+)\s*(ms|s|min|m|h|d)?")
_SIZE = re.compile(r"(\d+)\s*(?:([kmgt])i?)?b?")
_NO_LIMIT = ("forever", "none")
DURATION_FORMS = "a number with a unit ms, s, m, h or d (e.g. 500ms, 30s, 15m, 7d)"


class UnitError(ValueError):
    """A duration or size that does not parse; the message names it and the forms allowed."""


def parse_duration_ms(text: str, *, what: str = "duration", bare_unit: str | None = None,
                      no_limit: bool = True) -> int:
    """``text`` in milliseconds.

    ``bare_unit``: the unit of a number without one (None: a unit is required,
    except for 0). ``no_limit``: ``forever``/``none`` are accepted as 0.
    ``what`` names the value in the error.
    """
    t = str(text).strip().lower()
    if no_limit and t in _NO_LIMIT:
        return 0
    m = _DURATION.fullmatch(t)
    unit = m and (m.group(2) or bare_unit or ("ms" if m.group(1).strip("0") == "" else None))
    if not unit:
        bare = (f"; a bare number is in {bare_unit}" if bare_unit
                else ", or 0" + (" (or forever) for no limit" if no_limit else ""))
        raise UnitError(f"{text!r} is not a {what}: use {DURATION_FORMS}{bare}")
    return int(m.group(1)) * DURATION_UNITS_MS[unit]


def parse_size_bytes(text: str, *, what: str = "size") -> int:
    """``text`` in bytes (units are powers of 1024; a bare number is bytes)."""
    m = _SIZE.fullmatch(str(text).strip().lower())
    if not m:
        raise UnitError(f"{text!r} is not a {what}: use a number with an optional unit KB, MB, GB or TB "
                        "(e.g. 10GB or 10GiB; powers of 1024)")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2) or ""]


def human_duration(ms: int, zero: str = "forever") -> str:
    """The largest whole unit: 604800000 -> ``7d``, 1500 -> ``1500ms``; 0 -> ``zero``."""
    if not ms:
        return zero
    for unit in ("d", "h", "m", "s"):
        if ms % DURATION_UNITS_MS[unit] == 0:
            return f"{ms // DURATION_UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def human_bytes(n: float) -> str:
    """1536 -> ``1.5 KiB`` (bytes as a whole number, TiB is the largest unit)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def utc_text(ms: int) -> str:
    """Unix ms -> ``2026-11-21 20:47:36 UTC``."""
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def seconds_flag(what: str):
    """An argparse ``type`` for a node's duration flag: seconds as a plain number (``0.5``,
    as before) or a duration (``500ms``, ``5s``, ``6h``)."""
    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            pass
        try:
            return parse_duration_ms(text, what=what, no_limit=False) / 1000
        except UnitError as e:
            import argparse
            raise argparse.ArgumentTypeError(f"{e}; a plain number is in seconds") from None
    return parse


def count_flag(least: int, most: int | None = None, zero: str = ""):
    """An argparse ``type`` for a count flag: an integer of ``least`` or more (and at most
    ``most``); ``zero`` says what 0 means where it is allowed. A value outside is refused
    naming the range (argparse names the flag), before the node or cluster starts anything."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < least or (most is not None and n > most):
            import argparse
            allowed = f"{least} to {most:,}" if most is not None else f"{least} or more"
            if zero:
                allowed += f" (0: {zero})"
            raise argparse.ArgumentTypeError(f"{text!r}: give an integer, {allowed}")
        return n
    return parse


def bytes_flag(what: str):
    """An argparse ``type`` for a node's size flag: bytes as a plain number, or a size
    (``64MiB``, ``64MB``, ``1G``: powers of 1024)."""
    def parse(text: str) -> int:
        try:
            return parse_size_bytes(text, what=what)
        except UnitError as e:
            import argparse
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse
