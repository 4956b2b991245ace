"""Step a running process's wall clock (CLOCK_REALTIME) while CLOCK_MONOTONIC runs on.

A real clock step (NTP stepping, an operator's ``date -s``, a VM resumed on
another host) moves ``time.time()`` and leaves the monotonic clock alone. This
module does the same to one process with Debian's libfaketime (package
``faketime``, which pulls in ``libfaketime``), preloaded into the process
(``LD_PRELOAD``) and told the offset through a file that it re-reads on every
clock read, so the offset can be changed while the process runs::

    clock = SteppableClock()                       # offset 0
    proc = subprocess.Popen(cmd, env={**os.environ, **clock.env()})
    clock.step(-3600)                              # the process's clock goes back an hour
    clock.step(+86400)                             # ... and then a day forward (net +23 h)
    clock.reset()                                  # back to the real time

For storage nodes, ``ClockCluster(clocks={0: clock}, ...)`` is a ``LocalCluster``
whose node 0 runs under ``clock``.

What is faked
-------------
``CLOCK_REALTIME`` (and ``_COARSE``), ``gettimeofday``, ``time``, ``ftime``,
``timespec_get``: Python's ``time.time()``, ``time.time_ns()``,
``datetime.now()``, in every thread. ``CLOCK_MONOTONIC`` (``_RAW``, ``_COARSE``)
and ``CLOCK_BOOTTIME`` are not (``FAKETIME_DONT_FAKE_MONOTONIC``). Absolute
realtime waits (``sem_timedwait``, ``pthread_cond_timedwait`` on a realtime
condvar, ``clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME)``, absolute realtime
timers) are translated by libfaketime, so a deadline taken from the faked
clock still expires after its real duration. File timestamps are left as the
kernel wrote them (``NO_FAKE_STAT``; CPython's ``os.stat`` is not intercepted
by libfaketime 0.9.10 anyway).

Not faked: anything that bypasses libc (raw syscalls, the vDSO called directly,
statically linked programs, Go binaries), and absolute *realtime* deadlines
handed to calls libfaketime does not intercept (``pthread_cond_clockwait`` /
``sem_clockwait`` with ``CLOCK_REALTIME``, ``futex`` with
``FUTEX_CLOCK_REALTIME``): those would expire an offset early or late.

Two bugs of Debian bookworm's libfaketime 0.9.10 are worked around
--------------------------------------------------------------------
With ``FAKETIME_DONT_FAKE_MONOTONIC=1`` (without it, ``time.monotonic()`` in
the child reads as the faked wall clock and every monotonic lock timeout in
CPython waits ~55 years):

* ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ...)`` is translated as if
  it were a faked wall-clock deadline: it fails with EINVAL, so CPython 3.11's
  ``time.sleep()`` raises ``OSError: [Errno 22]``. Fixed upstream after 0.9.10
  (libfaketime #426). Here a tiny preloaded fix-up library (``FIX_SOURCE``,
  built with gcc into the user's cache dir) sends every non-realtime
  ``clock_nanosleep`` straight to glibc.
* ``pthread_cond_timedwait`` on a ``CLOCK_MONOTONIC`` condvar (CPython's GIL,
  many C libraries) returns ETIMEDOUT at once (glibc >= 2.30 turns on
  libfaketime's "forced monotonic fix", which is wrong when monotonic is not
  faked). ``FAKETIME_FORCE_MONOTONIC_FIX=0`` makes it wait its real time.

Costs and caveats
-----------------
* ``FAKETIME_NO_CACHE=1`` (the default here, ``cache_seconds=None``) makes a
  step visible on the very next clock read, at the price of an open/read/close
  of the offset file per read: ``time.time()`` costs ~4 us instead of ~0.07 us.
  ``cache_seconds=N`` (``FAKETIME_CACHE_DURATION``) costs ~0.1-0.4 us a read but
  a step shows up only up to N+1 s later. ``time.monotonic()`` costs nothing
  extra either way.
* The multi-threaded library (``libfaketimeMT.so.1``) serializes every faked
  clock read on one mutex (with signals blocked); the single-threaded one
  re-parses the offset into static buffers without a lock, which threads
  reading the clock while it re-reads the file could tear. The MT one is used.
  A process that forks (without exec) while another thread holds that mutex
  would deadlock in the child's first clock read.
* libfaketime 0.9.10 creates ``/dev/shm/sem.faketime_sem_<pid>`` and
  ``/dev/shm/faketime_shm_<pid>`` in each process it is loaded into and removes
  them at a normal exit only; ``remove_shm(pid)`` removes them after a
  process was killed (``ClockCluster`` does so for its nodes).
  ``FAKETIME_DISABLE_SHM=1`` is set too, for libfaketime >= 0.9.11, which
  honours it.
* A step is cumulative, like a real one: it moves the clock relative to what
  the process sees now. ``set_offset`` sets the offset from the real clock.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Iterator, Mapping, Sequence

from storage_service.local import LocalCluster

__all__ = ["SteppableClock", "ClockCluster", "ensure_faketime", "ensure_fix", "find_faketime",
           "remove_shm", "FIX_SOURCE"]

# Preloaded before libfaketime: non-realtime clock_nanosleep goes straight to glibc.
FIX_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <time.h>

typedef int (*clock_nanosleep_fn)(clockid_t, int, const struct timespec *, struct timespec *);
static clock_nanosleep_fn libc_clock_nanosleep, next_clock_nanosleep;

__attribute__((constructor)) static void rmq_faketime_fix_init(void) {
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    clock_nanosleep_fn next = (clock_nanosleep_fn)dlsym(RTLD_NEXT, "clock_nanosleep");
    clock_nanosleep_fn own = libc ? (clock_nanosleep_fn)dlsym(libc, "clock_nanosleep") : 0;
    __atomic_store_n(&next_clock_nanosleep, next, __ATOMIC_RELEASE);
    __atomic_store_n(&libc_clock_nanosleep, own ? own : next, __ATOMIC_RELEASE);
}

/* libfaketime 0.9.10 translates a CLOCK_MONOTONIC TIMER_ABSTIME deadline as if it
   were a faked wall-clock one (EINVAL), even with FAKETIME_DONT_FAKE_MONOTONIC=1.
   Realtime deadlines still go through libfaketime, which translates them right. */
int clock_nanosleep(clockid_t clk, int flags, const struct timespec *req, struct timespec *rem) {
    clock_nanosleep_fn fn = __atomic_load_n(&libc_clock_nanosleep, __ATOMIC_ACQUIRE);
    if (!fn) {
        rmq_faketime_fix_init();
        fn = __atomic_load_n(&libc_clock_nanosleep, __ATOMIC_ACQUIRE);
    }
    if (clk == CLOCK_REALTIME) {
        clock_nanosleep_fn next = __atomic_load_n(&next_clock_nanosleep, __ATOMIC_ACQUIRE);
        if (next) return next(clk, flags, req, rem);
    }
    return fn(clk, flags, req, rem);
}
"""
FIX_CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall")
FIX_LIBS = ("-ldl",)
LIB_NAMES = ("libfaketimeMT.so.1", "libfaketime.so.1")     # preferred first
APT_LOCK_TIMEOUT_S = 300


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rmq-spark", "faketime")


@contextlib.contextmanager
def _install_lock() -> Iterator[None]:
    """One installer/builder at a time among this machine's test processes."""
    os.makedirs(_cache_dir(), exist_ok=True)
    with open(os.path.join(_cache_dir(), ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def find_faketime() -> str | None:
    """Path of an installed libfaketime (the multi-threaded variant if there is one)."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = [f"/usr/lib/{multiarch}/faketime"] if multiarch else []
    dirs += sorted(glob.glob("/usr/lib/*/faketime")) + ["/usr/lib/faketime", "/usr/lib64/faketime",
                                                         "/usr/local/lib/faketime"]
    for name in LIB_NAMES:
        for d in dirs:
            path = os.path.join(d, name)
            if os.path.isfile(path):
                return path
    return None


def _apt_install(packages: Sequence[str], why: str) -> None:
    """``apt-get install -y -q packages``; ``apt-get update -q`` first only if that fails."""
    if not shutil.which("apt-get"):
        raise RuntimeError(f"{why}: {' '.join(packages)} is not installed and there is no apt-get "
                           f"here; install it with the system's package manager")
    if os.geteuid() != 0:
        raise RuntimeError(f"{why}: {' '.join(packages)} is not installed and this process is not "
                           f"root; run: sudo apt-get install -y {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock_wait = ["-o", f"DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_S}"]
    install = ["apt-get", *lock_wait, "install", "-y", "-q", *packages]
    res = subprocess.run(install, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if res.returncode != 0:          # a fresh machine has no package lists yet
        upd = subprocess.run(["apt-get", *lock_wait, "update", "-q"], env=env, capture_output=True,
                             text=True, stdin=subprocess.DEVNULL)
        res = subprocess.run(install, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            tail = "\n".join((upd.stdout + upd.stderr + res.stdout + res.stderr).splitlines()[-15:])
            raise RuntimeError(f"{why}: `{' '.join(install)}` failed (also after apt-get update):\n{tail}")


def ensure_faketime() -> str:
    """Path of libfaketime (``libfaketimeMT.so.1`` where Debian ships it, as bookworm
    does); installs the Debian package ``faketime`` when it is missing. Raises
    RuntimeError when that is impossible (no apt-get, not root, install failed)."""
    path = find_faketime()
    if path:
        return path
    with _install_lock():
        path = find_faketime()
        if not path:
            _apt_install(["faketime"], "stepping a process's clock needs libfaketime")
            path = find_faketime()
    if not path:
        raise RuntimeError(f"the faketime package is installed but none of {LIB_NAMES} was found "
                           f"under /usr/lib/*/faketime")
    return path


def ensure_fix() -> str:
    """Path of the fix-up library (``FIX_SOURCE``), built once per source into the
    user's cache dir (gcc; Debian's ``gcc`` and ``libc6-dev`` installed if missing)."""
    src = FIX_SOURCE.encode()
    digest = hashlib.sha256(src + " ".join(FIX_CFLAGS + FIX_LIBS).encode()).hexdigest()[:16]
    out = os.path.join(_cache_dir(), f"faketime-fix-{digest}.so")
    if os.path.isfile(out):
        return out
    with _install_lock():
        if os.path.isfile(out):
            return out
        cc = shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            _apt_install(["gcc", "libc6-dev"], "building the libfaketime fix-up library")
            cc = shutil.which("gcc") or "gcc"
        c_file = os.path.join(_cache_dir(), f"faketime-fix-{digest}.c")
        with open(c_file, "wb") as f:
            f.write(src)
        tmp = f"{out}.{os.getpid()}.tmp"
        res = subprocess.run([cc, *FIX_CFLAGS, "-o", tmp, c_file, *FIX_LIBS], capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"building the libfaketime fix-up library failed:\n{res.stderr}")
        os.replace(tmp, out)
    return out


def remove_shm(pid: int) -> None:
    """Remove the shared-memory objects libfaketime 0.9.10 made for process ``pid``
    (left behind when it was killed). Only call it once ``pid`` has exited."""
    for path in (f"/dev/shm/sem.faketime_sem_{pid}", f"/dev/shm/faketime_shm_{pid}"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class SteppableClock:
    """The wall-clock offset of the processes started with ``env()``, in a file they
    re-read on each clock read (``FAKETIME_TIMESTAMP_FILE``).

    ``path``: the offset file (default: one in a new temporary directory, removed
    by ``close()``). ``cache_seconds``: None re-reads the file on every clock read
    (a step is seen at once; ~4 us per ``time.time()``); N re-reads it at most
    every N s (cheaper; a step is seen up to N+1 s late).
    """

    def __init__(self, path: str | os.PathLike | None = None, cache_seconds: int | None = None):
        self._tmpdir = None
        if path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="rmq-clock-")
            path = os.path.join(self._tmpdir, "faketime.rc")
        self.path = os.path.abspath(os.fspath(path))
        if cache_seconds is not None and (int(cache_seconds) != cache_seconds or cache_seconds < 0):
            raise ValueError("cache_seconds: a whole number of seconds >= 0, or None (no cache)")
        self.cache_seconds = cache_seconds
        self.library = ensure_faketime()
        self.fix = ensure_fix()
        self._offset = 0.0
        self._write()

    @property
    def offset(self) -> float:
        """Seconds the processes' wall clock is ahead of the real one (negative: behind)."""
        return self._offset

    def now(self) -> float:
        """What ``time.time()`` reads in the processes under this clock."""
        return time.time() + self._offset

    def step(self, seconds: float) -> float:
        """Step the clock by ``seconds`` from where it is now (cumulative:
        ``step(-3600)`` then ``step(86400)`` leaves it 23 h ahead); the new offset."""
        return self.set_offset(self._offset + seconds)

    def set_offset(self, seconds: float) -> float:
        """Set the clock ``seconds`` away from the real one (absolute)."""
        self._offset = float(seconds)
        self._write()
        return self._offset

    def reset(self) -> None:
        """Back to the real time."""
        self.set_offset(0.0)

    def _write(self) -> None:
        # libfaketime fopen()s the file on each read: replace it whole, never half-written.
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{self._offset:+.6f}\n")
        os.replace(tmp, self.path)

    def env(self) -> dict[str, str]:
        """Environment variables to add to a child process's environment. An
        ``LD_PRELOAD`` already in this process's environment is kept (after ours)."""
        preload = [self.fix, self.library]
        if os.environ.get("LD_PRELOAD"):
            preload.append(os.environ["LD_PRELOAD"])
        env = {
            "LD_PRELOAD": " ".join(preload),
            "FAKETIME_TIMESTAMP_FILE": self.path,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "DONT_FAKE_MONOTONIC": "1",              # the name older libfaketime reads
            "FAKETIME_FORCE_MONOTONIC_FIX": "0",     # monotonic condvar waits: their real time
            "NO_FAKE_STAT": "1",                     # file times as the kernel wrote them
            "FAKETIME_DISABLE_SHM": "1",             # libfaketime >= 0.9.11 only
        }
        if self.cache_seconds is None:
            env["FAKETIME_NO_CACHE"] = "1"
        else:
            env["FAKETIME_CACHE_DURATION"] = str(int(self.cache_seconds))
        return env

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run under this clock via env(1) (a ``FAKETIME`` inherited from this
        process would override the offset file, so it is removed)."""
        return ["env", "-u", "FAKETIME", *(f"{k}={v}" for k, v in self.env().items()), *argv]

    def close(self) -> None:
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> "SteppableClock":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SteppableClock(offset={self._offset:+.3f}s, path={self.path!r})"


class ClockCluster(LocalCluster):
    """A ``LocalCluster`` whose node ``i`` runs under ``clocks[i]`` (nodes without a
    clock run on the real one). Takes LocalCluster's arguments, plus ``clocks``."""

    def __init__(self, *args, clocks: Mapping[int, SteppableClock] | None = None, **kwargs):
        self.clocks: dict[int, SteppableClock] = dict(clocks or {})
        self._clock_pids: set[int] = set()
        super().__init__(*args, **kwargs)

    def node_command(self, i: int) -> list[str]:
        cmd = super().node_command(i)
        clock = self.clocks.get(i)
        return clock.command(cmd) if clock is not None else cmd

    def start_node(self, i: int) -> None:
        super().start_node(i)
        if i in self.clocks and self.procs[i] is not None:
            self._clock_pids.add(self.procs[i].pid)      # env(1) execs the node: same pid

    def _remove_shm_of_exited(self) -> None:
        running = {p.pid for p in self.procs if p is not None and p.poll() is None}
        for pid in list(self._clock_pids - running):
            remove_shm(pid)
            self._clock_pids.discard(pid)

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        super().kill(i, sig)
        self._remove_shm_of_exited()

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self._remove_shm_of_exited()


if __name__ == "__main__":            # python -m tests.faults.clock: install/build, print paths
    print(ensure_faketime())
    print(ensure_fix())
    sys.exit(0)
