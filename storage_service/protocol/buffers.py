"""Keep glibc from giving big buffers back to the OS after every request.

A fetch moves megabytes through a few fresh buffers (the segment read, the
encoded response, gRPC's copy). glibc serves each buffer above its mmap
threshold with a new ``mmap`` and unmaps it on free, so every fetch pays a
page fault and a zeroed page per 4 KiB: measured, that doubled the node's CPU
per fetched byte (``bench/README.md``). Raising the mmap threshold to glibc's
maximum (32 MiB on 64-bit) and the trim threshold keeps such buffers in the
heap for the next request. Memory stays bounded by the largest requests in
flight, not by retained data.
"""
from __future__ import annotations

import ctypes
import functools
import logging

__all__ = ["reuse_big_buffers"]

log = logging.getLogger(__name__)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20          # glibc's upper limit for the setting on 64-bit
TRIM_THRESHOLD = 256 << 20


@functools.cache
def reuse_big_buffers() -> bool:
    """Apply the thresholds to this process (once); False where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        log.info("mallopt refused the buffer thresholds; big fetches will map fresh pages")
    return ok
