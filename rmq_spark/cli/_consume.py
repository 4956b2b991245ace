"""``rmq consume``: print a topic's messages, oldest first across its queues.

Each queue is read in offset order, and the queues are merged by store
timestamp (then queue, offset), so ``--from earliest --max 5`` shows the five
oldest messages of the topic, whichever queues hold them. Without
``--follow`` it stops at the end it saw when it started and says where that
end is (on stderr); with ``--follow`` it then waits for new messages until
Ctrl-C (exit 130).
"""
from __future__ import annotations

import contextlib
import heapq
import signal
import sys
import threading
from typing import Callable

from ..client import Client, QueueOffsets
from ._jsonlines import record_to_json

__all__ = ["add_parser", "cmd_consume"]

FETCH_BYTES = 1 << 20
IDLE_SLEEP = 0.1


def add_parser(sub) -> None:
    co = sub.add_parser("consume", help="print messages, oldest first across queues")
    co.add_argument("topic")
    co.add_argument("--from", dest="start", default="earliest",
                    help="earliest | latest | OFFSET (in every queue)")
    co.add_argument("--max", type=int, default=0, help="stop after N messages (0 = all available)")
    co.add_argument("--queue", type=int, default=None, help="only this queue")
    co.add_argument("--json", action="store_true",
                    help="one JSON object per message (the shape `rmq produce --json` reads)")
    co.add_argument("--print-offsets", action="store_true",
                    help="prefix each plain line with QUEUE:OFFSET and a tab")
    co.add_argument("--follow", action="store_true", help="keep waiting for new messages (Ctrl-C stops)")


def _starts(offsets: list[QueueOffsets], start: str) -> dict[int, int]:
    if start not in ("earliest", "latest") and not start.isdigit():
        raise ValueError(f"--from {start!r}: use earliest, latest or an offset (a whole number >= 0)")
    return {o.queue: o.earliest if start == "earliest" else o.latest if start == "latest"
            else max(o.earliest, int(start)) for o in offsets}


def _line(r, a) -> str:
    if a.json:
        return record_to_json(r)
    text = "null" if r.value is None else r.value.decode(errors="replace")
    return f"{r.queue}:{r.offset}\t{text}" if a.print_offsets else text


class _Merge:
    """Records of several queues, oldest store timestamp first."""

    def __init__(self, fetch: Callable[[int, int], tuple[list, int]], pos: dict[int, int],
                 ends: dict[int, int] | None):
        self.fetch, self.pos, self.ends = fetch, pos, ends
        self.heap: list = []
        self.buf: dict[int, list] = {q: [] for q in pos}
        for q in pos:
            self._refill(q)

    def _refill(self, q: int) -> None:
        while not self.buf[q] and (self.ends is None or self.pos[q] < self.ends[q]):
            recs, nxt = self.fetch(q, self.pos[q])
            progressed = nxt > self.pos[q]
            if self.ends is not None:
                # records past the end are left for --follow, which starts at pos
                recs = [r for r in recs if r.offset < self.ends[q]]
                nxt = min(nxt, self.ends[q])
            self.pos[q] = nxt
            self.buf[q] = recs[::-1]
            if not progressed or self.ends is None:
                break
        if self.buf[q]:
            r = self.buf[q][-1]
            heapq.heappush(self.heap, (r.store_timestamp, q, r.offset))

    def pop(self):
        if not self.heap:
            return None
        _, q, _ = heapq.heappop(self.heap)
        r = self.buf[q].pop()
        self._refill(q)
        return r


def cmd_consume(client: Client, a) -> int:
    offsets = client.offsets(a.topic)
    if a.queue is not None and not 0 <= a.queue < len(offsets):
        raise ValueError(f"--queue {a.queue}: topic {a.topic!r} has queues 0..{len(offsets) - 1}")
    offsets = [o for o in offsets if a.queue is None or o.queue == a.queue]
    pos = _starts(offsets, a.start)
    ends = {o.queue: o.latest for o in offsets}

    with _ctrl_c() as stop:
        def fetch(q: int, off: int) -> tuple[list, int]:
            if stop.is_set():
                raise KeyboardInterrupt
            res = client.fetch(a.topic, q, off, max_bytes=FETCH_BYTES)
            return res.records, res.next_offset
        return _print(a, pos, ends, fetch, stop)


@contextlib.contextmanager
def _ctrl_c():
    """An Event that Ctrl-C sets: the consumer stops between fetches (KeyboardInterrupt,
    exit 130); a second Ctrl-C interrupts at once. A KeyboardInterrupt raised anywhere
    can land inside the client's own threading code (in the CLI test under load, one
    such process did not exit)."""
    stop = threading.Event()

    def interrupted(*_):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
    try:
        before = signal.signal(signal.SIGINT, interrupted)
    except ValueError:               # not the main thread: Ctrl-C stays Python's
        yield stop
        return
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, before)


def _print(a, pos: dict, ends: dict, fetch, stop: threading.Event) -> int:
    printed = 0
    merge = _Merge(fetch, pos, ends)
    while (r := merge.pop()) is not None:
        print(_line(r, a), flush=a.follow)
        printed += 1
        if a.max and printed >= a.max:
            return 0
    if not a.follow:
        where = " ".join(f"q{q}={o}" for q, o in sorted(ends.items()))
        print(f"rmq consume: end of {a.topic} after {printed} messages (next offsets {where}); "
              "--follow waits for more", file=sys.stderr)
        return 0
    while True:                        # follow: new messages as they come, until Ctrl-C
        merge = _Merge(fetch, merge.pos, None)
        if not merge.heap and stop.wait(IDLE_SLEEP):
            raise KeyboardInterrupt
        while (r := merge.pop()) is not None:
            print(_line(r, a), flush=True)
            printed += 1
            if a.max and printed >= a.max:
                return 0
