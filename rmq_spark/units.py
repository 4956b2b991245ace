"""The one grammar of durations and sizes (``storage_service/protocol/units.py``, shared
with the storage node's flags), with the client's error: ``UnitError`` here is also an
``RmqError``, so the CLI and the jobs report it as any other bad input.

Durations: an integer, optional blanks, a unit ``ms``, ``s``, ``m`` (or
``min``), ``h`` or ``d``, in any case (``500ms``, ``30 s``, ``7D``). ``0``
needs no unit. A bare number is refused unless the caller says which unit it
is in (Spark options: milliseconds); ``forever``/``none`` (= 0) only where 0
means "no limit". Sizes: an integer with an optional unit ``B``, ``K``/``KB``/``KiB``,
``M``/``MB``/``MiB``, ``G``/``GB``/``GiB``, ``T``/``TB``/``TiB``, powers of 1024.
"""
from __future__ import annotations

from rmq_spark.client.errors import RmqError
from storage_service.protocol import units as _kernel
from storage_service.protocol.units import (DURATION_FORMS, DURATION_UNITS_MS, human_bytes,  # noqa: F401
                                            human_duration, utc_text)

__all__ = ["UnitError", "DURATION_FORMS", "DURATION_UNITS_MS", "parse_duration_ms", "parse_size_bytes",
           "human_duration", "human_bytes", "utc_text"]


class UnitError(RmqError, _kernel.UnitError):
    """A duration or size that does not parse; the message names it and the forms allowed."""


def parse_duration_ms(text: str, *, what: str = "duration", bare_unit: str | None = None,
                      no_limit: bool = True) -> int:
    """``text`` in milliseconds (``storage_service.protocol.units.parse_duration_ms``)."""
    try:
        return _kernel.parse_duration_ms(text, what=what, bare_unit=bare_unit, no_limit=no_limit)
    except _kernel.UnitError as e:
        raise UnitError(str(e)) from None


def parse_size_bytes(text: str, *, what: str = "size") -> int:
    """``text`` in bytes (units are powers of 1024; a bare number is bytes)."""
    try:
        return _kernel.parse_size_bytes(text, what=what)
    except _kernel.UnitError as e:
        raise UnitError(str(e)) from None
