"""Peer systems measured by ``bench/produce.py`` in the same run as rmq-spark.

Two peers live here, each started for real on loopback and torn down again:

* :class:`NatsCluster` - a 3-node NATS JetStream cluster (Debian's
  ``nats-server`` binary); the program runs its nats-py workloads on it.
* :class:`SyncObjCeiling` - three pysyncobj nodes in separate processes that
  do nothing but replicate opaque message batches: the ceiling a
  pysyncobj-based log can reach before it does any real work.

Nothing here prints or logs (pysyncobj's own warnings are counted, not
shown); the program reports progress by polling the counters exposed here.
"""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PAYLOAD_KINDS", "Counter", "make_payloads", "free_ports", "find_nats_server",
    "install_nats_server", "nats_server_version", "nats_server_with_sync", "ensure_nats_py", "NatsCluster",
    "SyncObjCeiling",
]

PAYLOAD_KINDS = ("random", "text", "repeat")


class Counter:
    """A thread-safe running total (acked messages, finished calls, ...)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0

    def add(self, n: int = 1) -> None:
        with self._lock:
            self._value += n

    @property
    def value(self) -> int:
        return self._value


def make_payloads(kind: str, count: int, size: int, seed: int = 7) -> list[bytes]:
    """``count`` distinct message values of ``size`` bytes.

    ``random``: incompressible bytes (worst case for pysyncobj, whose TCP
    transport zlib-compresses every message); ``text``: random capital
    letters, like Kafka's producer-perf-test (zlib: ~66 %); ``repeat``: one
    repeated byte (zlib: ~1 %, best case). The values are distinct objects:
    pickle memoizes a repeated object, so ``[v] * 100`` would replicate one
    value plus 99 back-references.
    """
    rng = random.Random(seed)
    if kind == "random":
        return [rng.randbytes(size) for _ in range(count)]
    if kind == "text":
        letters = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        return [bytes(rng.choices(letters, k=size)) for _ in range(count)]
    if kind == "repeat":
        return [bytes(bytearray(b"x" * size)) for _ in range(count)]
    raise ValueError(f"payload kind {kind!r}: expected one of {PAYLOAD_KINDS}")


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports the OS just handed out on 127.0.0.1 (another
    process could still take one before the caller binds it)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# --------------------------------------------------------------------------
# NATS JetStream
# --------------------------------------------------------------------------

def find_nats_server() -> str | None:
    """Path of the ``nats-server`` binary (Debian puts it in /usr/sbin)."""
    return shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/local/sbin")


def install_nats_server() -> str:
    """Install Debian's ``nats-server`` package; returns the binary's path.

    ``apt-cache policy`` is asked first, so a missing candidate fails with a
    clear message instead of an apt error."""
    subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True)
    policy = subprocess.run(["apt-cache", "policy", "nats-server"],
                            check=True, capture_output=True, text=True).stdout
    if "Candidate:" not in policy or "Candidate: (none)" in policy:
        raise RuntimeError(f"apt has no nats-server candidate:\n{policy}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    proc = subprocess.run(["apt-get", "install", "-y", "-qq", "nats-server"],
                          capture_output=True, text=True, env=env)
    path = find_nats_server()
    if proc.returncode != 0 or path is None:
        raise RuntimeError(f"apt-get install nats-server failed:\n{proc.stderr[-2000:]}")
    return path


def nats_server_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    return (out.stdout or out.stderr).strip()


def ensure_nats_py() -> str:
    """Import nats-py, pip-installing it into this interpreter if missing."""
    try:
        import nats  # noqa: F401  (only checks that it is there)
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "nats-py>=2.6"], check=True)
        import importlib
        importlib.invalidate_caches()
    from importlib.metadata import version
    return version("nats-py")


NATS_FOR_SYNC = "v2.15.2"        # sync_interval (every write synced) came in 2.10; Debian has 2.9


def nats_server_with_sync(log=None) -> str:
    """A ``nats-server`` that takes ``sync_interval: always``: the one found if it is
    2.10 or newer, else ``NATS_FOR_SYNC`` built with ``go install`` from the Go module
    proxy into ``bench/.peers/bin`` (once; a minute or two)."""
    found = find_nats_server()
    if found is not None:
        import re
        m = re.search(r"(\d+)\.(\d+)", nats_server_version(found))
        if m and (int(m.group(1)), int(m.group(2))) >= (2, 10):
            return found
    gobin = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".peers", "bin")
    binary = os.path.join(gobin, "nats-server")
    if os.path.exists(binary):
        return binary
    go = shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")
    if go is None:
        raise RuntimeError("nats-server >= 2.10 is needed for synced writes (sync_interval), and there is "
                           "no go command to build it: install Go, or put nats-server >= 2.10 on PATH")
    if log is not None:
        log.info("building nats-server %s with go install (once, into %s)", NATS_FOR_SYNC, gobin)
    subprocess.run([go, "install", f"github.com/nats-io/nats-server/v2@{NATS_FOR_SYNC}"], check=True,
                   env=dict(os.environ, GOBIN=gobin))
    return binary


def _nats_config(name: str, port: int, http: int, cluster: int,
                 routes: list[int], store_dir: str, sync_always: bool = False) -> str:
    """``sync_always``: JetStream fsyncs every write (``sync_interval: always``), as
    ``--fsync always`` does; by default it syncs every 2 minutes."""
    route_urls = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in routes)
    sync = "\n  sync_interval: always" if sync_always else ""
    return f"""
server_name: {name}
listen: 127.0.0.1:{port}
http: 127.0.0.1:{http}
jetstream {{
  store_dir: "{store_dir}"
  max_file_store: 8GB{sync}
}}
cluster {{
  name: bench
  listen: 127.0.0.1:{cluster}
  routes: [{route_urls}]
}}
"""


def _get_json(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


@dataclass
class NatsCluster:
    """A real 3-node JetStream cluster on loopback, one store dir per node.

    Use as a context manager: ``__exit__`` stops every server, also when
    start-up or the benchmark failed.
    """

    binary: str
    root: str
    nodes: int = 3
    sync_always: bool = False
    client_ports: list[int] = field(default_factory=list)
    http_ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.client_ports]

    def start(self) -> None:
        ports = free_ports(3 * self.nodes)
        self.client_ports, self.http_ports, cluster_ports = ports[0::3], ports[1::3], ports[2::3]
        for i in range(self.nodes):
            name = f"n{i + 1}"
            store = os.path.join(self.root, name)
            os.makedirs(store, exist_ok=True)
            routes = [p for j, p in enumerate(cluster_ports) if j != i]
            conf = os.path.join(self.root, f"{name}.conf")
            with open(conf, "w") as f:
                f.write(_nats_config(name, self.client_ports[i], self.http_ports[i],
                                     cluster_ports[i], routes, store, self.sync_always))
            log = open(os.path.join(self.root, f"{name}.log"), "wb")
            self.procs.append(subprocess.Popen([self.binary, "-c", conf],
                                               stdout=log, stderr=subprocess.STDOUT))
            log.close()

    def _meta_leaders(self) -> list[str]:
        leaders = []
        for port in self.http_ports:
            jsz = _get_json(f"http://127.0.0.1:{port}/jsz") or {}
            meta = jsz.get("meta_cluster") or {}
            leaders.append(meta.get("leader", "") if meta.get("cluster_size") == self.nodes else "")
        return leaders

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Block until all servers agree on an elected JetStream meta leader.

        Returns the leader's name; raises with the servers' log tails if a
        server died or no leader was agreed within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"nats-server exited early: {dead}\n{self.log_tails()}")
            leaders = self._meta_leaders()
            if leaders[0] and len(set(leaders)) == 1:
                return leaders[0]
            time.sleep(0.1)
        raise TimeoutError(f"no JetStream meta leader after {timeout}s\n{self.log_tails()}")

    def log_tails(self, lines: int = 15) -> str:
        out = []
        for i in range(len(self.procs)):
            path = os.path.join(self.root, f"n{i + 1}.log")
            with open(path, errors="replace") as f:
                out.append(f"--- {path}\n" + "".join(f.readlines()[-lines:]))
        return "\n".join(out)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)

    def __enter__(self) -> "NatsCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------
# pysyncobj ceiling
# --------------------------------------------------------------------------

def _syncobj_conf(journal: str, tick: float, overrides: dict[str, Any]):
    from pysyncobj import SyncObjConf

    return SyncObjConf(**{**dict(
        autoTickPeriod=tick,
        appendEntriesPeriod=tick,
        journalFile=journal,
        # Every ~100-200 KiB entry fits one append_entries message: bigger ones
        # take pysyncobj's chunked path ("pickle data was truncated", DESIGN.md).
        appendEntriesBatchSizeBytes=2 ** 20,
        sendBufferSize=2 ** 21,
        recvBufferSize=2 ** 21,
        # The journal's offsets are uint32 and it is also held in RAM: compact
        # often (the state is one integer) so a long run does neither overflow.
        logCompactionMinEntries=500,
        logCompactionMinTime=5,
        commandsQueueSize=10_000,
    ), **overrides})


def _use_fast_wire() -> None:
    """Give this process's pysyncobj the wire rmq's nodes run
    (``storage_service.raft.transport``: bytearray buffers, highest pickle protocol, no
    zlib), so the ceiling and our rows pay the same transport costs."""
    from storage_service.raft import transport

    transport.install()


def _make_log_class():
    from pysyncobj import SyncObj, replicated

    class AppendLog(SyncObj):
        """Replicated state: how many messages were appended."""

        def __init__(self, self_addr: str, others: list[str], conf) -> None:
            super().__init__(self_addr, others, conf)
            self.messages = 0

        @replicated
        def append(self, batch: list[bytes]) -> int:
            self.messages += len(batch)
            return self.messages

    return AppendLog


def _status(obj) -> dict:
    """pysyncobj's public ``getStatus``, asked again when its tick thread changed the
    dicts it walks meanwhile (a node just elected: "dictionary changed size during
    iteration"); {} if that kept happening."""
    for _ in range(20):
        try:
            return obj.getStatus()
        except RuntimeError:
            time.sleep(0.01)
    return {}


def _wait_leader(obj, timeout: float, stable: float = 0.3) -> str:
    """Leader address, once ready and unchanged for ``stable`` seconds."""
    deadline, seen, since = time.monotonic() + timeout, None, 0.0
    while (now := time.monotonic()) < deadline:
        leader = _status(obj).get("leader") if obj.isReady() else None
        if leader is None or leader.address != seen:
            seen, since = leader and leader.address, now
        elif now - since >= stable:
            return seen
        time.sleep(0.02)
    raise TimeoutError(f"pysyncobj: no stable leader after {timeout}s")


def _drive(obj, batch: list[bytes], seconds: float, warmup: float, window: int,
           acked) -> dict[str, Any]:
    """Keep ``window`` appends in flight for ``warmup + seconds`` (leader only).

    ``acked`` (a shared RawValue) counts committed commands; only the tick
    thread's callback writes it, the parent process polls it for progress.
    """
    from pysyncobj import FAIL_REASON

    slots = threading.Semaphore(window)
    failures: list[int] = []

    def on_commit(_res: object, err: int) -> None:
        if err == FAIL_REASON.SUCCESS:
            acked.value += 1
        else:
            failures.append(err)
        slots.release()

    t0 = time.monotonic()
    first: tuple[float, int] | None = None
    while (now := time.monotonic()) < t0 + warmup + seconds:
        if first is None and now >= t0 + warmup:
            first = (now, acked.value)
        if slots.acquire(timeout=0.1):
            obj.append(batch, callback=on_commit)
    last = (time.monotonic(), acked.value)
    for _ in range(window):  # drain what is still in flight
        slots.acquire(timeout=10)
    first = first or last
    return {"commands": last[1] - first[1], "seconds": last[0] - first[0],
            "failures": len(failures)}


class _WarningTally(logging.Handler):
    """Counts pysyncobj's warnings (e.g. "truncating already-applied log
    entries") so the parent can report them in the row's note."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count, self.first = 0, ""

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        self.first = self.first or record.getMessage()[:100]


def _node_main(idx: int, addrs: list[str], workdir: str, spec: dict[str, Any],
               ctl, go, stop, driver, acked) -> None:
    """One pysyncobj node (a spawned process); the chosen leader drives load."""
    tally = _WarningTally()
    logging.getLogger("pysyncobj").addHandler(tally)
    logging.getLogger("pysyncobj").propagate = False
    if spec["fast_wire"]:
        _use_fast_wire()
    log_cls = _make_log_class()
    others = [a for a in addrs if a != addrs[idx]]
    journal = os.path.join(workdir, f"node{idx}.journal")
    obj = log_cls(addrs[idx], others, _syncobj_conf(journal, spec["tick"], spec["conf"]))
    try:
        ctl.put(("leader", idx, _wait_leader(obj, timeout=30)))
        if not go.wait(timeout=60):
            return
        if driver.value == idx:
            if _status(obj).get("state") != 2:          # pysyncobj's LEADER
                raise RuntimeError("leadership moved before the run started")
            batch = make_payloads(spec["payload"], spec["batch"], spec["msg_size"])
            ctl.put(("result", idx, _drive(obj, batch, spec["seconds"], spec["warmup"],
                                           spec["window"], acked)))
        stop.wait(timeout=spec["seconds"] + 120)
    except Exception as e:  # reported to the parent, which raises it
        ctl.put(("error", idx, f"{type(e).__name__}: {e}"))
    finally:
        obj.destroy()
        ctl.put(("warnings", idx, (tally.count, tally.first)))


@dataclass
class SyncObjCeiling:
    """Raw replicated append on 3 local pysyncobj nodes (journal on).

    Each command carries ``batch`` messages of ``msg_size`` bytes; the state
    machine only counts them, so the result is the replication ceiling, not
    a storage engine's throughput.
    """

    workdir: str
    batch: int = 100
    msg_size: int = 1024
    window: int = 32
    tick: float = 0.005
    nodes: int = 3
    payload: str = "random"
    fast_wire: bool = False
    conf: dict[str, Any] = field(default_factory=dict)  # SyncObjConf overrides

    def __post_init__(self) -> None:
        self._ctx = mp.get_context("spawn")  # never fork a process that runs threads
        self._acked = self._ctx.RawValue("q", 0)

    def acked_messages(self) -> int:
        return self._acked.value * self.batch

    def run(self, seconds: float, warmup: float) -> dict[str, Any]:
        addrs = [f"127.0.0.1:{p}" for p in free_ports(self.nodes)]
        spec = {"tick": self.tick, "batch": self.batch, "msg_size": self.msg_size,
                "seconds": seconds, "warmup": warmup, "window": self.window,
                "payload": self.payload, "conf": self.conf, "fast_wire": self.fast_wire}
        ctl, go, stop = self._ctx.Queue(), self._ctx.Event(), self._ctx.Event()
        driver = self._ctx.RawValue("i", -1)
        procs = [self._ctx.Process(target=_node_main, daemon=True,
                                   args=(i, addrs, self.workdir, spec, ctl, go, stop,
                                         driver, self._acked))
                 for i in range(self.nodes)]
        tallies: dict[int, tuple[int, str]] = {}
        try:
            for p in procs:
                p.start()
            driver.value = addrs.index(self._agreed_leader(ctl))
            go.set()
            result = self._result(ctl, timeout=seconds + warmup + 60)
        finally:
            stop.set()
            _drain_tallies(ctl, tallies, self.nodes)
            _join_all(procs)
        result["warnings"] = sum(n for n, _ in tallies.values())
        result["first_warning"] = next((w for _, w in tallies.values() if w), "")
        return result

    def _agreed_leader(self, ctl) -> str:
        leaders: dict[int, str] = {}
        for _ in range(self.nodes):
            kind, idx, value = ctl.get(timeout=60)
            if kind == "error":
                raise RuntimeError(f"pysyncobj node {idx}: {value}")
            leaders[idx] = value
        if len(set(leaders.values())) != 1:
            raise RuntimeError(f"pysyncobj nodes disagree on the leader: {leaders}")
        return leaders[0]

    def _result(self, ctl, timeout: float) -> dict[str, Any]:
        kind, idx, value = ctl.get(timeout=timeout)
        if kind != "result":
            raise RuntimeError(f"pysyncobj node {idx}: {value}")
        msgs = value["commands"] * self.batch
        return {**value, "messages": msgs, "bytes": msgs * self.msg_size,
                "batch": self.batch, "window": self.window, "tick_s": self.tick}


def _drain_tallies(ctl, tallies: dict, nodes: int, timeout: float = 15.0) -> None:
    """Collect each node's warning tally (sent on exit) before joining it."""
    deadline = time.monotonic() + timeout
    while len(tallies) < nodes and time.monotonic() < deadline:
        try:
            kind, idx, value = ctl.get(timeout=max(0.01, deadline - time.monotonic()))
        except Exception:  # queue.Empty: a node died without reporting
            return
        if kind == "warnings":
            tallies[idx] = value


def _join_all(procs: list) -> None:
    for p in procs:
        p.join(timeout=10)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
