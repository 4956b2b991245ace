#!/usr/bin/env python
"""Why the raft journal recycles its files: fdatasync cost by how the file was prepared.

Each row writes ``--entries`` records of ``--size`` bytes, each followed by
``os.fdatasync``, as the journal does per raft entry, into a file that is

* ``append``     grown by every write (what a fresh journal file does),
* ``fallocate``  preallocated with ``posix_fallocate`` (blocks "unwritten"),
* ``overwrite``  already written once (a recycled journal file),

and prints wall and CPU time per sync (this process only; the kernel's
journal thread is not counted), median of ``--rounds`` rounds::

    .venv/bin/python bench/fsync.py                 # 360 KiB and 64 KiB entries
    .venv/bin/python bench/fsync.py --size 1048576 --entries 100
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

KINDS = ("append", "fallocate", "overwrite")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one(kind: str, size: int, entries: int, where: str) -> tuple[float, float]:
    """(wall ms, CPU ms) per write+fdatasync."""
    buf = os.urandom(size)
    fd, path = tempfile.mkstemp(dir=where, prefix="fsync-bench-")
    try:
        if kind == "fallocate":
            os.posix_fallocate(fd, 0, size * entries)
        elif kind == "overwrite":
            for _ in range(entries):
                os.write(fd, buf)
            os.lseek(fd, 0, os.SEEK_SET)
        os.fsync(fd)
        t, c = time.perf_counter(), _cpu()
        for _ in range(entries):
            os.write(fd, buf)
            os.fdatasync(fd)
        return 1e3 * (time.perf_counter() - t) / entries, 1e3 * (_cpu() - c) / entries
    finally:
        os.close(fd)
        os.unlink(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, action="append", help="bytes per entry (repeatable; default 368640 and 65536)")
    p.add_argument("--entries", type=int, default=300, help="syncs per round (default 300)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, kinds alternating (default 3)")
    p.add_argument("--dir", default=None, help="directory on the disk to measure (default: the system temp dir)")
    a = p.parse_args(argv)
    if a.entries <= 0 or a.rounds <= 0 or any(s <= 0 for s in a.size or []):
        p.error("--size, --entries and --rounds must be positive")
    sizes = a.size or [368640, 65536]
    where = a.dir or tempfile.gettempdir()
    print(f"fdatasync per entry, {a.entries} entries x {a.rounds} rounds, in {where}\n")
    print(f"{'entry':>9}  {'file':<10} {'wall ms':>8} {'CPU ms':>7}  {'wall vs append':>14}")
    for size in sizes:
        res = {k: [] for k in KINDS}
        for r in range(a.rounds):
            for k in KINDS:
                res[k].append(one(k, size, a.entries, where))
                print(f"  {size} B round {r + 1} {k} done", file=sys.stderr, flush=True)
        base = statistics.median(w for w, _ in res["append"])
        for k in KINDS:
            wall = statistics.median(w for w, _ in res[k])
            cpu = statistics.median(c for _, c in res[k])
            print(f"{size:>9}  {k:<10} {wall:>8.2f} {cpu:>7.3f}  {wall / base:>13.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
