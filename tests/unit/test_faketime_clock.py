"""tests/faults/clock.py: a running process's wall clock steps, its monotonic clock does not.

Each test runs a child under a ``SteppableClock`` (libfaketime, preloaded) and
steps the clock while the child keeps running: time.time() and datetime.now()
jump in every thread, time.monotonic() and every timed wait keep real time
(time.sleep, lock/condition timeouts, the GIL's timed waits, gRPC deadlines).
The last test runs a real storage node under the clock and produces before and
after each step; what store timestamps the node assigned is printed (``-rP``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.faults.clock import SteppableClock, remove_shm

pytestmark = pytest.mark.unit

TOL = 1.0          # seconds: a sample's wall clock vs the expected faked time

SAMPLER = r"""
import datetime, json, queue, sys, threading, time

requests, answers = queue.Queue(), queue.Queue()

def read():
    return {"wall": time.time(), "mono": time.monotonic(), "ns": time.time_ns() / 1e9,
            "local": datetime.datetime.now().timestamp(),
            "utc": datetime.datetime.now(datetime.timezone.utc).timestamp()}

def worker():                     # one thread, started before any step, lives on
    while True:
        requests.get()
        answers.put(read())

threading.Thread(target=worker, daemon=True).start()

def took(wait):
    start = time.monotonic()
    wait()
    return time.monotonic() - start

def waits():
    cond = threading.Condition()
    lock = threading.Lock()
    lock.acquire()
    def cond_wait():
        with cond:
            cond.wait(0.2)
    return {"sleep": took(lambda: time.sleep(0.2)),
            "event": took(lambda: threading.Event().wait(0.2)),
            "cond": took(cond_wait),
            "lock": took(lambda: lock.acquire(timeout=0.2))}

def gil(threads=6, seconds=0.6):
    # CPU time / real time of threads fighting for the GIL: ~1 when a thread that
    # waits for the GIL sleeps its 5 ms; more when its timed wait returns at once.
    def spin():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    ts = [threading.Thread(target=spin) for _ in range(threads)]
    cpu, real = time.process_time(), time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return (time.process_time() - cpu) / (time.monotonic() - real)

print("ready", flush=True)
for line in sys.stdin:
    what = line.strip()
    if what == "sample":
        requests.put(1)
        main = read()
        out = {"main": main, "thread": answers.get(timeout=10)}
    elif what == "waits":
        out = waits()
    elif what == "gil":
        out = {"ratio": gil()}
    print(json.dumps(out), flush=True)
"""


class Child:
    """A Python child under ``clock`` answering one JSON line per command."""

    def __init__(self, clock: SteppableClock, code: str = SAMPLER):
        self.proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **clock.env()},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline()
        if line != "ready\n":
            self.proc.kill()
            raise AssertionError(f"child did not start: {line!r} {self.proc.stderr.read()}")

    def ask(self, what: str) -> dict:
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"child died: {self.proc.stderr.read()}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        remove_shm(self.proc.pid)


@pytest.fixture
def clock(tmp_path):
    with SteppableClock(tmp_path / "faketime.rc") as c:
        yield c


@pytest.fixture
def child(clock):
    c = Child(clock)
    yield c
    c.close()


def sample(child: Child) -> tuple[dict, float, float]:
    """The child's sample, and this process's real wall and monotonic clocks mid-way."""
    before_wall, before_mono = time.time(), time.monotonic()
    s = child.ask("sample")
    after_wall, after_mono = time.time(), time.monotonic()
    return s, (before_wall + after_wall) / 2, (before_mono + after_mono) / 2


def test_steps_move_the_wall_clock_not_the_monotonic_one(clock, child):
    pid = child.proc.pid
    s0, real0, mono0 = sample(child)
    assert abs(s0["main"]["wall"] - real0) < TOL

    # the child's monotonic clock is this process's: same CLOCK_MONOTONIC
    offset_mono = s0["main"]["mono"] - mono0
    assert abs(offset_mono) < TOL

    prev, prev_real = s0, real0
    for step, expected_offset in ((-3600, -3600), (86400, 82800)):
        time.sleep(0.3)
        clock.step(step)
        assert clock.offset == expected_offset
        s, real, mono = sample(child)
        # the jump is the step (plus the real time in between) ...
        jump = s["main"]["wall"] - prev["main"]["wall"]
        assert abs(jump - (step + (real - prev_real))) < TOL, (step, jump)
        assert abs(s["main"]["wall"] - (real + expected_offset)) < TOL
        # ... while monotonic went on at the real pace: no jump, never back
        assert s["main"]["mono"] > prev["main"]["mono"]
        assert abs((s["main"]["mono"] - offset_mono) - mono) < TOL
        assert abs((s["main"]["mono"] - prev["main"]["mono"]) - (real - prev_real)) < TOL
        assert child.proc.poll() is None and child.proc.pid == pid     # the same process, still running
        prev, prev_real = s, real

    clock.reset()
    s, real, _ = sample(child)
    assert abs(s["main"]["wall"] - real) < TOL
    assert s["main"]["mono"] > prev["main"]["mono"]


def test_threads_and_datetime_see_the_step(clock, child):
    for step in (0, -3600, 86400):
        clock.step(step)
        s, real, _ = sample(child)
        expected = real + clock.offset
        for who in ("main", "thread"):       # the thread was started before any step
            for key in ("wall", "ns", "local", "utc"):
                assert abs(s[who][key] - expected) < TOL, (step, who, key, s[who][key] - expected)
        assert abs(s["thread"]["mono"] - s["main"]["mono"]) < TOL


def test_timed_waits_keep_real_time_after_steps(clock, child):
    """libfaketime 0.9.10 alone breaks these: time.sleep raises EINVAL and
    monotonic condvar waits (the GIL) return at once; clock.py works around both."""
    for step in (0, -3600, 86400):
        clock.step(step)
        waits = child.ask("waits")
        for what, took in waits.items():
            assert 0.15 < took < 1.0, (step, what, took)
    ratio = child.ask("gil")["ratio"]
    assert ratio < 1.2, f"threads waiting for the GIL spin (cpu/real {ratio:.2f})"


GRPC_CHILD = r"""
import json, socket, sys, time
from concurrent import futures
import grpc

ident = lambda b: b
def slow(request, context):
    time.sleep(3.0)
    return b""
def echo(request, context):
    return json.dumps(context.time_remaining()).encode()
server = grpc.server(futures.ThreadPoolExecutor(4))
server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", {
    "Slow": grpc.unary_unary_rpc_method_handler(slow, ident, ident),
    "Echo": grpc.unary_unary_rpc_method_handler(echo, ident, ident)})])
port = server.add_insecure_port("127.0.0.1:0")
server.start()
silent = socket.socket()               # takes TCP connections, never speaks HTTP/2
silent.bind(("127.0.0.1", 0))
silent.listen(16)
served = grpc.insecure_channel(f"127.0.0.1:{port}")
mute = grpc.insecure_channel(f"127.0.0.1:{silent.getsockname()[1]}")

def call(channel, method, timeout):
    start = time.monotonic()
    try:
        out = json.loads(channel.unary_unary(f"/t.T/{method}", ident, ident)(b"", timeout=timeout) or b"null")
        code = "OK"
    except grpc.RpcError as e:
        out, code = None, e.code().name
    return {"code": code, "took": time.monotonic() - start, "out": out}

print("ready", flush=True)
for line in sys.stdin:
    print(json.dumps({"echo": call(served, "Echo", 5.0), "slow": call(served, "Slow", 1.0),
                      "mute": call(mute, "Echo", 1.0)}), flush=True)
"""


def test_grpc_deadlines_keep_real_time_after_steps(clock):
    """gRPC under the clock, as client and server: a 1 s deadline expires after
    1 s, and the server sees the full 5 s budget, after each step."""
    child = Child(clock, GRPC_CHILD)
    try:
        for step in (0, 86400, -3600, -86400):
            clock.step(step)
            r = child.ask("go")
            assert r["echo"]["code"] == "OK" and r["echo"]["took"] < 1.0, (step, r)
            assert 4.0 < r["echo"]["out"] < 5.5, (step, r)           # server's time_remaining()
            for what in ("slow", "mute"):
                assert r[what]["code"] == "DEADLINE_EXCEEDED", (step, what, r)
                assert 0.9 < r[what]["took"] < 2.0, (step, what, r)
    finally:
        child.close()


# A real node under a stepped clock: tests/test_clock_jumps.py (the clock scenario of
# tests/node_faults.py) steps the metadata leader of a 3-node cluster under load.
