"""rmq produce's pipeline (rmq_spark.cli._produce) against a recording producer: order per
queue, linger, flush on close, the first error stops it."""
from __future__ import annotations

import io
import os
import signal
import threading
import time
from concurrent.futures import Future

import pytest

from rmq_spark.cli._jsonlines import BadLine
from rmq_spark.cli._produce import Interrupted, Pipeline, parse_chunk, produce_lines, read_lines

pytestmark = pytest.mark.unit


class Recorder:
    """Stands in for the Client: its ``producer()`` records each batch in the order sent and
    acknowledges it after ``delay`` (the real producer's order and once-only guarantees
    against nodes are tests/test_producer.py's)."""

    def __init__(self, delay: float = 0.0, fail_after: int | None = None):
        self.delay, self.fail_after = delay, fail_after
        self.lock = threading.Lock()
        self.sent: dict[int, list] = {}
        self.calls = 0
        self.timers: list[threading.Timer] = []
        self.closed = False

    def describe_topic(self, topic):
        return {"queues": self.queues}

    queues = 1

    def producer(self):
        return self

    def send(self, topic, q, msgs) -> Future:
        fut: Future = Future()
        with self.lock:
            self.calls += 1
            if self.fail_after is not None and self.calls > self.fail_after:
                fut.set_exception(RuntimeError("node said no"))
                return fut
            self.sent.setdefault(q, []).extend(msgs)
        if self.delay:
            timer = threading.Timer(self.delay, fut.set_result, (None,))
            self.timers.append(timer)
            timer.start()
        else:
            fut.set_result(None)
        return fut

    def close(self):
        """The producer's close: flush (every batch answered, callbacks run), then stop."""
        for t in self.timers:
            t.join()
        self.closed = True


def test_every_line_once_and_in_order_per_queue():
    rec = Recorder(delay=0.002)
    pipe = Pipeline(rec, "t", queues=4, batch=7, linger=0.005, senders=2)
    lines = [str(i).encode() for i in range(3000)]
    for i in range(0, len(lines), 100):
        pipe.add(lines[i:i + 100])
    assert pipe.close(timeout=30)
    assert pipe.acked == 3000 and rec.closed
    got = [int(m) for q in sorted(rec.sent) for m in rec.sent[q]]
    assert sorted(got) == list(range(3000))
    assert all(rec.sent[q] == sorted(rec.sent[q], key=int) for q in rec.sent) and len(rec.sent) == 4


def test_a_partial_batch_leaves_after_the_linger_without_close():
    rec = Recorder()
    pipe = Pipeline(rec, "t", queues=2, batch=500, linger=0.05)
    pipe.add([b"only"])
    deadline = time.monotonic() + 5
    while not rec.sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rec.sent == {0: [b"only"]}
    assert pipe.close(timeout=5)


def test_the_first_send_error_stops_the_pipeline_and_reaches_the_reader():
    rec = Recorder(fail_after=1)
    pipe = Pipeline(rec, "t", queues=1, fixed_queue=0, batch=10, linger=0.001)
    with pytest.raises(RuntimeError, match="node said no"):
        for _ in range(100):
            pipe.add([b"x"] * 10)
            time.sleep(0.005)
    assert not pipe.close(timeout=5) and pipe.acked == 10


def test_lines_are_split_whatever_the_chunks_and_bad_lines_are_named():
    data = b"a\n\nb\r\nc"
    assert [(n, ls) for n, ls in read_lines(io.BytesIO(data))] == [(1, [b"a", b"", b"b"]), (4, [b"c"])]
    errors = []
    assert parse_chunk(1, [b"ok", b"\xff", b""], False, errors.append) == [b"ok"]
    assert [str(e)[:32] for e in errors] == ["line 2: not valid UTF-8 (byte 0)"]
    with pytest.raises(BadLine, match="line 5: not valid JSON"):
        parse_chunk(4, [b'{"value": 1}', b"{"], True, lambda e: (_ for _ in ()).throw(e))


def test_a_batch_is_cut_at_one_mebibyte():
    rec = Recorder()
    pipe = Pipeline(rec, "t", queues=1, batch=500, linger=10)
    pipe.add([bytes([i]) * (300 << 10) for i in range(10)])
    assert pipe.close(timeout=10)
    # 4 lines of 300 KiB reach 1 MiB: batches of 4, 4 and the last 2 on close
    assert rec.calls == 3 and [m[0] for m in rec.sent[0]] == list(range(10))


def test_a_bad_line_from_a_pipe_sends_the_lines_before_it_and_nothing_after():
    rec = Recorder()
    with pytest.raises(BadLine, match="line 3: not valid UTF-8") as e:
        produce_lines(rec, "t", io.BytesIO(b"a\nb\n\xff\nc\n"), False, None, 500, 0.01, False)
    assert rec.sent == {0: [b"a", b"b"]} and e.value.acked == 2


def test_a_file_is_checked_from_where_stdin_starts_and_read_from_there(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"skipped by head\nx\ny\n")
    rec = Recorder()
    with open(path, "rb") as f:
        f.readline()                         # (head -1; rmq produce t) < in.txt
        pipe, read, skipped = produce_lines(rec, "t", f, False, None, 500, 0.01, False)
    assert rec.sent == {0: [b"x", b"y"]} and read == 2 and not skipped


class _CtrlCAfterRead(io.BufferedReader):
    """A pipe whose first read is followed at once by a Ctrl-C: the moment the signal
    is most likely to take the lines just read with it (tests/test_cli_first_hour.py
    met it on a busy machine: "interrupted; 0 of 0 messages read")."""

    def read1(self, n=-1):
        chunk = super().read1(n)
        if chunk:
            os.kill(os.getpid(), signal.SIGINT)
        return chunk


def test_ctrl_c_just_after_a_read_sends_the_lines_read():
    r, w = os.pipe()
    os.write(w, b"".join(b"m%d\n" % i for i in range(300)))    # the writer stays open: a terminal
    rec = Recorder()
    before = signal.getsignal(signal.SIGINT)      # (a SparkContext in this process may have set one)
    try:
        with _CtrlCAfterRead(io.FileIO(r, "rb")) as f:
            with pytest.raises(Interrupted) as e:
                produce_lines(rec, "t", f, False, None, 500, 10.0, False)   # (a 10 s linger)
    finally:
        os.close(w)
    assert (e.value.read, e.value.acked) == (300, 300)
    assert rec.sent == {0: [b"m%d" % i for i in range(300)]}
    assert signal.getsignal(signal.SIGINT) is before                           # put back


def test_idle_senders_do_not_spin_with_linger_zero():
    pipe = Pipeline(Recorder(), "t", queues=8, batch=500, linger=0.0)
    cpu = time.process_time()
    time.sleep(0.5)
    assert time.process_time() - cpu < 0.1
    assert pipe.close(timeout=5)
