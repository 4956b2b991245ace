"""``rmq produce``: stdin lines to a topic, pipelined and idempotent.

Lines become batches per queue on the client: keyed messages go to
``crc32(key) % queues`` (the service's own rule), the rest fill one queue's
batch and move on to the next (Kafka's sticky partitioner), ``--queue``
pins them all. A batch leaves when it is full (``--batch`` messages or 1 MiB)
or when its oldest line has waited ``--linger``, so a slow stream is stored
line by line, not 500 lines late. One sender thread hands each batch to a
pipelined producer (``Client.producer``): up to 5 requests in flight per
node, each queue's batches stored once and in order (idempotent producer
id and sequence; the node refuses a batch whose predecessor is missing).

Bad input: a line that is not UTF-8 (or, with ``--json``, not a message) is
named with its number. From a file, every line is checked before anything
is sent; from a pipe, the lines before it may be stored already and nothing
from it on is sent. ``--skip-bad`` skips such lines and counts them.

Ctrl-C stops reading, sends what was read (every line taken from the input:
the reader stops between reads, see ``_CtrlC``), says how many were
acknowledged and exits 130.
"""
from __future__ import annotations

import bisect
import collections
import functools
import itertools
import os
import select
import signal
import stat
import sys
import threading
import time
import zlib
from typing import BinaryIO, Callable, Iterator

from ..client import Client, Message, RmqError
from ._jsonlines import BadLine, message_from_json, message_from_text

__all__ = ["Pipeline", "add_parser", "cmd_produce", "produce_lines", "read_lines"]

CHUNK = 1 << 20
MAX_BATCH_BYTES = 1 << 20
MAX_BUFFERED_BYTES = 64 << 20        # read ahead of acknowledgements at most this much


class Interrupted(RmqError):
    """Ctrl-C while producing: what was read went out; ``acked`` of ``read`` were acknowledged."""

    def __init__(self, read: int, acked: int):
        super().__init__(f"{acked} of {read} messages read were acknowledged")
        self.read, self.acked = read, acked


def read_lines(f: BinaryIO, before_read: Callable[[], None] | None = None
               ) -> Iterator[tuple[int, list[bytes]]]:
    """(number of the first line, non-empty lines) for each chunk read: as soon as
    the OS has data (``read1``), so a slow pipe's lines come out one by one.
    ``before_read()`` runs before each read (``_CtrlC.wait``: it returns once the
    input has data, or raises)."""
    lineno, tail = 1, b""
    read = getattr(f, "read1", f.read)
    while True:
        if before_read is not None:
            before_read()
        chunk = read(CHUNK)
        if not chunk:
            break
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop()
        if b"\r" in chunk:       # CRLF line ends, as Kafka's console producer reads them
            lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
        yield lineno, lines
        lineno += len(lines)
    if tail:
        yield lineno, [tail[:-1] if tail.endswith(b"\r") else tail]


def parse_chunk(first: int, lines: list[bytes], as_json: bool,
                bad: Callable[[BadLine], None]) -> list:
    """The messages of a chunk (bytes, or Message with --json); ``bad(error)`` for each
    bad line, which raises to refuse or returns to skip it (a refusal carries the
    chunk's messages before the line as ``good``). Empty lines are skipped."""
    if not as_json:
        try:
            b"\n".join(lines).decode()
            return [ln for ln in lines if ln]
        except UnicodeDecodeError:
            pass                          # find the line, slowly: rare
    out = []
    for i, ln in enumerate(lines):
        if not ln:
            continue
        try:
            out.append(message_from_json(ln.decode(), first + i) if as_json
                       else message_from_text(ln, first + i))
        except (UnicodeDecodeError, BadLine) as e:
            if isinstance(e, UnicodeDecodeError):
                e = BadLine(first + i, f"not valid UTF-8 (byte {e.start})")
            try:
                bad(e)
            except BadLine as stop:
                stop.good = out
                raise
    return out


def _size(m) -> int:
    """Bytes of a message's key and value (a plain line is its value)."""
    return len(m) if type(m) is bytes else len(m.value or b"") + len(m.key or b"")


class Pipeline:
    """Batches per queue, sent by threads that each own some queues (see module docstring)."""

    def __init__(self, client: Client, topic: str, queues: int, fixed_queue: int | None = None,
                 batch: int = 500, linger: float = 0.02, senders: int = 8):
        self.client, self.topic, self.queues, self.fixed = client, topic, queues, fixed_queue
        self.batch, self.linger = batch, linger
        self.cond = threading.Condition()
        self.pending = {q: [] for q in range(queues)}      # filling
        self.pending_bytes = dict.fromkeys(range(queues), 0)
        self.since = dict.fromkeys(range(queues), 0.0)     # when the filling batch's first line came
        self.ready = {q: collections.deque() for q in range(queues)}   # full batches, in order
        self.buffered = self.buffered_bytes = 0
        self.max_buffered = max(4 * batch * min(queues, senders), 20_000)
        self.acked = 0
        self.error: BaseException | None = None
        self.closing = False
        self._cursor = 0
        self.producer = client.producer()
        self.threads = [threading.Thread(target=self._send_loop, daemon=True, name="rmq-produce")]
        for t in self.threads:
            t.start()

    # -------------------------------------------------------------- reader side
    def add(self, msgs: list) -> None:
        """Queue messages for sending; waits while too many are buffered."""
        with self.cond:
            while ((self.buffered >= self.max_buffered or self.buffered_bytes >= MAX_BUFFERED_BYTES)
                   and self.error is None):
                self.cond.wait(0.5)
            if self.error is not None:
                raise self.error
            now = time.monotonic()
            if msgs and type(msgs[0]) is bytes:
                self._add_lines(msgs, now)
            else:
                for m in msgs:
                    self._add_message(m, now)
            self.buffered += len(msgs)
            self.cond.notify_all()

    def _add_message(self, m: Message, now: float) -> None:
        """One --json message into its queue's batch (lock held)."""
        q = self._queue_of(m)
        if not self.pending[q]:
            self.since[q] = now
        size = _size(m)
        self.pending[q].append(m)
        self.pending_bytes[q] += size
        self.buffered_bytes += size
        if len(self.pending[q]) >= self.batch or self.pending_bytes[q] >= MAX_BATCH_BYTES:
            self.ready[q].append(self._seal(q))

    def _seal(self, q: int) -> list:
        """Take queue ``q``'s filling batch out (lock held); unkeyed messages that come
        next fill the following queue (sticky round robin)."""
        batch = self.pending[q]
        self.pending[q], self.pending_bytes[q] = [], 0
        if self.fixed is None and q == self._cursor:
            self._cursor = (self._cursor + 1) % self.queues
        return batch

    def _add_lines(self, lines: list[bytes], now: float) -> None:
        """``add`` for plain lines (no keys): whole slices into the current queue's batch,
        without Python work per line (lock held)."""
        i = 0
        while i < len(lines):
            q = self.fixed if self.fixed is not None else self._cursor
            pending = self.pending[q]
            if not pending:
                self.since[q] = now
            take = lines[i:i + self.batch - len(pending)]
            sizes = list(itertools.accumulate(map(len, take), initial=self.pending_bytes[q]))
            if sizes[-1] >= MAX_BATCH_BYTES:        # cut where the batch reaches its byte limit
                take = take[:max(1, bisect.bisect_left(sizes, MAX_BATCH_BYTES))]
            pending += take
            self.pending_bytes[q] = sizes[len(take)]
            self.buffered_bytes += sizes[len(take)] - sizes[0]
            i += len(take)
            if len(pending) >= self.batch or self.pending_bytes[q] >= MAX_BATCH_BYTES:
                self.ready[q].append(self._seal(q))

    def _queue_of(self, m) -> int:
        if self.fixed is not None:
            return self.fixed
        if type(m) is not bytes and m.key is not None:
            return zlib.crc32(m.key) % self.queues
        return self._cursor

    def close(self, timeout: float | None = None) -> bool:
        """Send what is buffered and wait for it; True if every batch was acknowledged."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self.threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self.error is None and not any(t.is_alive() for t in self.threads)

    # -------------------------------------------------------------- sender side
    def _take(self, queues: list[int]) -> list[tuple[int, list]] | None:
        """One batch for each owned queue that has one due (lock held); None when done."""
        while True:
            if self.error is not None:           # the run stops: nothing more is sent
                return None
            now, wait, out = time.monotonic(), None, []
            for q in queues:
                if self.ready[q]:
                    out.append((q, self.ready[q].popleft()))
                elif self.pending[q]:
                    due = self.since[q] + self.linger - now
                    if due <= 0 or self.closing:
                        out.append((q, self._seal(q)))
                    else:
                        wait = due if wait is None else min(wait, due)
            if out:
                return out
            if self.closing:
                return None
            self.cond.wait(wait)

    def _send_loop(self) -> None:
        queues = [self.fixed] if self.fixed is not None else list(range(self.queues))
        try:
            while True:
                with self.cond:
                    batches = self._take(queues)
                if batches is None:
                    break
                for q, b in batches:
                    fut = self.producer.send(self.topic, q, b)
                    fut.add_done_callback(functools.partial(self._done, len(b), sum(map(_size, b))))
        except BaseException as e:              # the run stops: nothing after this is sent
            with self.cond:
                self.error = self.error or e
                self.cond.notify_all()
        self.producer.close()                   # waits for what is in flight

    def _done(self, n: int, size: int, fut) -> None:
        """A batch acknowledged (or failed: the run stops; the producer's thread)."""
        error = fut.exception()
        with self.cond:
            if error is not None:
                self.error = self.error or error
            else:
                self.acked += n
            self.buffered -= n
            self.buffered_bytes -= size
            self.cond.notify_all()


def _is_file(f: BinaryIO) -> bool:
    fd = _fileno(f)
    try:
        return fd is not None and stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


def check_file(f: BinaryIO, as_json: bool) -> None:
    """Refuse a file with a bad line before anything of it is sent (BadLine), then go
    back to where it was (stdin may start inside a file)."""
    def refuse(e: BadLine) -> None:
        raise e
    start = f.tell()
    for first, lines in read_lines(f):
        parse_chunk(first, lines, as_json, refuse)
    f.seek(start)


class _CtrlC:
    """SIGINT for the reading thread, which stops at a point where it holds no lines: a
    chunk read from the input is always handed to the pipeline. The first Ctrl-C is
    held (counted); the reader, which waits for its input together with a wake-up pipe
    the handler writes to (``wait``), stops before its next read. Where the input has
    no descriptor to wait on, a Ctrl-C while reading cuts the read short at once. A
    second Ctrl-C is not held."""

    def __init__(self):
        self.busy, self.hits, self._old = False, 0, None
        self._wake: tuple[int, int] | None = None      # (read end, write end)

    def __call__(self, signum, frame) -> None:
        self.hits += 1
        if self._wake is not None:
            try:
                os.write(self._wake[1], b"\0")
            except OSError:                  # (full: a wake-up is pending anyway)
                pass
        if self.hits > 1 or (not self.busy and self._wake is None):
            raise KeyboardInterrupt

    def install(self, fd: int | None = None) -> "_CtrlC":
        """Handle SIGINT (on the main thread); with the input's descriptor ``fd``, the
        reader waits (``wait``)."""
        if threading.current_thread() is threading.main_thread():
            if fd is not None:
                self._wake = os.pipe()
                for fd in self._wake:
                    os.set_blocking(fd, False)
            self._old = signal.signal(signal.SIGINT, self)
        return self

    def restore(self) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
        if self._wake is not None:
            for fd in self._wake:
                os.close(fd)
            self._wake = None

    def wait(self, fd: int | None) -> None:
        """Return once the input ``fd`` has data (or its end) to read; KeyboardInterrupt
        after a Ctrl-C. Without a wake-up pipe: return at once (the read is interruptible)."""
        if self._wake is not None and not self.hits:
            poll = select.poll()         # (not select(): descriptors past 1024 in a library caller)
            poll.register(fd, select.POLLIN)
            poll.register(self._wake[0], select.POLLIN)
            while not self.hits:
                if any(ready == fd for ready, _ in poll.poll()):
                    break                # data, its end, or an error: the read tells
        self.check()

    def guarded(self, fn, *args):
        self.busy = True
        try:
            return fn(*args)
        finally:
            self.busy = False

    def check(self) -> None:
        if self.hits:
            raise KeyboardInterrupt


def _fileno(f) -> int | None:
    try:
        return f.fileno()
    except (OSError, ValueError, AttributeError):
        return None


def produce_lines(client: Client, topic: str, f: BinaryIO, as_json: bool, fixed_queue: int | None,
                  batch: int, linger: float, skip_bad: bool,
                  progress: Callable[[int, int], None] | None = None) -> tuple[Pipeline, int, list[BadLine]]:
    """Send every line of ``f``; (pipeline, lines read, bad lines skipped). Raises BadLine
    (when not skipping), the send error, or Interrupted (Ctrl-C, after sending what was read)."""
    queues = client.describe_topic(topic)["queues"]
    if fixed_queue is not None and not 0 <= fixed_queue < queues:
        raise ValueError(f"--queue {fixed_queue}: topic {topic!r} has queues 0..{queues - 1}")
    if not skip_bad and _is_file(f):
        check_file(f, as_json)
    skipped: list[BadLine] = []

    def bad(e: BadLine) -> None:
        if not skip_bad:
            raise e
        skipped.append(e)

    pipe = Pipeline(client, topic, queues, fixed_queue, batch, linger)
    fd = _fileno(f)
    ctrl_c, read = _CtrlC().install(fd), 0
    try:
        for first, lines in read_lines(f, functools.partial(ctrl_c.wait, fd)):
            try:
                # held while parsing too: lines taken from the input are sent, not dropped
                msgs = ctrl_c.guarded(parse_chunk, first, lines, as_json, bad)
            except BadLine as e:          # from a pipe: the lines before it go out
                ctrl_c.guarded(pipe.add, e.good)
                read += len(e.good)
                ctrl_c.guarded(pipe.close, 30)
                e.acked = pipe.acked
                raise
            ctrl_c.guarded(pipe.add, msgs)
            read += len(msgs)
            ctrl_c.check()
            if progress:
                progress(read, pipe.acked)
        done = ctrl_c.guarded(pipe.close)
        ctrl_c.check()
    except KeyboardInterrupt:
        ctrl_c.guarded(pipe.close, 30)   # what was read goes out
        raise Interrupted(read, pipe.acked) from None
    except BaseException:
        pipe.close(timeout=30)           # a send error: stop
        raise
    finally:
        ctrl_c.restore()
    if not done:
        raise pipe.error or RuntimeError("produce did not finish")
    return pipe, read, skipped


def stdin_binary() -> BinaryIO:
    return sys.stdin.buffer


# ------------------------------------------------------------------ the command
def add_parser(sub) -> None:
    pr = sub.add_parser("produce", help="one message per stdin line (pipelined, idempotent)")
    pr.add_argument("topic")
    pr.add_argument("--json", action="store_true",
                    help='lines are JSON objects {"value", "key", "tags", "properties", "born_timestamp"}; '
                         'value null is a tombstone, {"base64": ...} binary, other JSON its text')
    pr.add_argument("--queue", type=int, default=None,
                    help="target queue (default: by key hash, unkeyed lines fill one queue after another)")
    pr.add_argument("--batch", type=int, default=500, help="messages per batch and queue (default 500)")
    pr.add_argument("--linger", default="20ms",
                    help="send a batch that is not full once its first line waited this long (default 20ms)")
    pr.add_argument("--skip-bad", action="store_true",
                    help="skip lines that are not UTF-8 (or not a JSON message) and count them, "
                         "instead of refusing the input")


def cmd_produce(client: Client, a) -> int:
    from ..units import parse_duration_ms

    if a.batch < 1:
        raise ValueError(f"--batch {a.batch}: give at least 1")
    linger = parse_duration_ms(a.linger) / 1000
    started, last = time.monotonic(), [time.monotonic()]

    def progress(read: int, acked: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 1.0:
            last[0] = now
            print(f"\rproduced {acked} messages ({acked / (now - started):,.0f} msg/s)", end="",
                  file=sys.stderr, flush=True)

    try:
        pipe, _, skipped = produce_lines(client, a.topic, stdin_binary(), a.json, a.queue, a.batch,
                                         linger, a.skip_bad, progress)
    except BadLine as e:
        acked = getattr(e, "acked", None)
        sent = ("nothing of the input was sent" if acked is None else
                f"the {acked} messages before it were stored, nothing from that line on")
        print(f"\nrmq produce: {e}; {sent}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"\nrmq produce: interrupted; {e}", file=sys.stderr)
        return 130
    if last[0] != started:
        print(file=sys.stderr)
    if skipped:
        print(f"rmq produce: skipped {len(skipped)} bad lines (first: {skipped[0]})", file=sys.stderr)
    print(f"produced {pipe.acked} messages to {a.topic}")
    return 0
