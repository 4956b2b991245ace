"""``rmq_thread_cpu_seconds_total``: CPU by thread role, read from /proc (``metrics/threads.py``)."""
from __future__ import annotations

import os
import threading
import time

import pytest

from storage_service.metrics.threads import ThreadCpu, note_thread_exit, role_of

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc (Linux)")


def test_role_of_takes_the_numbers_out():
    assert role_of("raft-node-3") == "raft-node"
    assert role_of("raft-node-3-sync") == "raft-node-sync"
    assert role_of("ThreadPoolExecutor-0_7") == "ThreadPoolExecutor"
    assert role_of("produce-wire-conn") == "produce-wire-conn"
    assert role_of("Thread-7 (run)") == "Thread (run)"


def _burn(seconds: float) -> None:
    start = time.thread_time()             # this thread's own CPU: the same on a busy machine
    while time.thread_time() - start < seconds:
        sum(range(1000))


def test_a_role_counts_its_threads_cpu_and_keeps_it_after_they_end():
    cpu = ThreadCpu()
    before = cpu.totals().get("burner-test", 0.0)
    assert before == 0.0
    stop = threading.Event()
    burnt = [threading.Event() for _ in range(2)]

    def burner(done: threading.Event) -> None:
        _burn(0.2)
        done.set()
        stop.wait()

    threads = [threading.Thread(target=burner, args=(burnt[i],), name=f"burner-test-{i}") for i in range(2)]
    for t in threads:
        t.start()
    try:
        for done in burnt:
            assert done.wait(60)
        live = cpu.totals()["burner-test"]
        assert live >= 0.35, live           # both threads' 0.2 s (/proc counts in ticks of 10 ms)
    finally:
        stop.set()
        for t in threads:
            t.join()
    ended = cpu.totals()["burner-test"]     # the threads are gone: what was seen stays
    assert ended >= live
    fam = next(iter(cpu.collect()))
    assert fam.name == "rmq_thread_cpu_seconds"
    assert any(s.labels == {"thread": "burner-test"} and s.value >= live for s in fam.samples)


def test_a_thread_that_says_so_as_it_ends_is_counted_whole_though_no_scrape_saw_it():
    cpu = ThreadCpu()
    assert "exiter-test" not in cpu.totals()

    def exiter() -> None:
        _burn(0.1)
        note_thread_exit()

    t = threading.Thread(target=exiter, name="exiter-test-1")
    t.start()
    t.join()
    first = cpu.totals()["exiter-test"]
    assert first >= 0.1, first              # time.thread_time(): exact, not in ticks
    assert cpu.totals()["exiter-test"] == first     # counted once, also once /proc no longer lists it
