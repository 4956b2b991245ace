"""Short-circuit reads: a client on a storage node's host reads segment files itself.

A fetch crosses three processes on the read path (node -> client -> Spark's
JVM); when the client runs on the node's host, the node's part (reading the
segment, framing the answer, gRPC sending megabytes) can be skipped. The
client sends its ``host_id()`` in ``FetchRequest.local_host``; a node on the
same host answers with where the batches are (``segment.QueueLog.locate``)
and the client reads them with ``read_span``. HDFS calls this a short-circuit
local read.

Nothing here is trusted more than the network answer would be:

* the node answers a span only for whole batches it has applied, which are
  committed data (segments never hold anything else);
* the client opens the path and checks that it is still the file the node
  looked at (same inode and device: compaction and replica rebuilds write new
  files; retention deletes them), and that the span lies inside it;
* every batch's CRC is checked when the bytes are decoded, as for fetched
  bytes, and the decoder checks that the batches cover the requested offset.

Any mismatch makes the caller fetch again over the network.
"""
from __future__ import annotations

import functools
import os

__all__ = ["host_id", "read_span"]

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


@functools.lru_cache(maxsize=1)
def host_id() -> str:
    """This host's identity: the kernel's boot id (per boot, shared by every process
    on the host); "" where there is none, which turns short-circuit reads off."""
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


def read_span(span) -> bytes | None:
    """The bytes of ``span`` (``fetchwire.LocalSpan``), or None when the file is gone,
    is another file now, or is shorter than the span."""
    try:
        fd = os.open(span.path, os.O_RDONLY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_ino, st.st_dev) != (span.inode, span.device) \
                or span.position < 0 or span.length <= 0 \
                or st.st_size < span.position + span.length:
            return None
        data = os.pread(fd, span.length, span.position)
        return data if len(data) == span.length else None
    except OSError:
        return None
    finally:
        os.close(fd)
