"""N network namespaces on one bridge, and links between them cut and healed.

Node *i* lives in namespace ``rmqpart-<run>-<pid>-<i>`` with address
``10.77.<N>.<i+1>/24`` on a veth whose other end is on the bridge ``rp<run>br``
in the root namespace; the bridge holds ``10.77.<N>.254``, so this process (a
client) reaches every node. ``<run>`` is random per run and ``<N>`` a /24 no
route of this machine uses, so parallel runs never collide; a run that died
without its teardown is swept by the next one (its pid is in the names).

A cut is a ``prohibit`` route to the peer's address inside each of the two
namespaces (both directions), so the path between the root namespace and
every node stays up; ``cut_off`` takes a node's link down instead (nobody
reaches it, the client neither). Needs root and iproute2 (``ip``); no tc or
iptables.
"""
from __future__ import annotations

import atexit
import itertools
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import threading
from typing import Callable, Iterable, Sequence

__all__ = ["Netns", "unavailable_reason"]

PREFIX = "rmqpart"
_NAME = re.compile(rf"^{PREFIX}-([0-9a-f]{{6}})-(\d+)-(\d+)\b")


def _ip(*args: str, check: bool = True, input: str | None = None) -> str:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, input=input)
    if check and res.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res.stdout


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (not root, no ``ip``, refused), else None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's ip binary"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode:
        return f"ip netns add failed: {res.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers() -> list[str]:
    """Remove the namespaces and bridges of runs whose process is gone (killed -9)."""
    swept = []
    for line in _ip("netns", "list", check=False).splitlines():
        m = _NAME.match(line)
        if m and not _alive(int(m.group(2))):
            name = line.split()[0]
            _kill_inside(name)
            _ip("netns", "del", name, check=False)
            _ip("link", "del", f"rp{m.group(1)}br", check=False)
            swept.append(name)
    return swept


def _kill_inside(ns: str) -> None:
    """SIGKILL what still runs in namespace ``ns`` (our nodes, if their stop was skipped)."""
    for pid in _ip("netns", "pids", ns, check=False).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _free_subnet(rng: random.Random) -> str:
    used = _ip("-4", "route", "show", "table", "all", check=False)
    for n in rng.sample(range(16, 250), 234):
        if f"10.77.{n}." not in used:
            return f"10.77.{n}"
    raise RuntimeError("no free 10.77.N.0/24 for the namespaces")


class Netns:
    """``nodes`` namespaces on a bridge; ``with Netns(3) as net:`` sets up and always tears down."""

    def __init__(self, nodes: int = 3):
        self.nodes = nodes
        self.run = secrets.token_hex(3)
        self.namespaces = [f"{PREFIX}-{self.run}-{os.getpid()}-{i}" for i in range(nodes)]
        self.bridge_dev = f"rp{self.run}br"
        self.subnet = ""
        self.addresses: list[str] = []
        self._cut: set[frozenset[int]] = set()      # pairs with prohibit routes both ways
        self._down: set[int] = set()                # nodes whose link is down
        self._lock = threading.Lock()
        self._up = False

    # ------------------------------------------------------------ lifecycle
    def setup(self) -> "Netns":
        sweep_leftovers()
        self._up = True
        atexit.register(self.teardown)
        try:
            self.subnet = _free_subnet(random.Random(self.run))
            self.addresses = [f"{self.subnet}.{i + 1}" for i in range(self.nodes)]
            _ip("link", "add", self.bridge_dev, "type", "bridge")
            _ip("addr", "add", f"{self.subnet}.254/24", "dev", self.bridge_dev)
            _ip("link", "set", self.bridge_dev, "up")
            for i, ns in enumerate(self.namespaces):
                host, inner = f"rp{self.run}h{i}", f"rp{self.run}n{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", host, "type", "veth", "peer", "name", inner, "netns", ns)
                _ip("link", "set", host, "master", self.bridge_dev, "up")
                _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.teardown()
            raise
        return self

    def teardown(self) -> None:
        """Remove every namespace and the bridge; safe to call twice, or after a failed setup."""
        if not self._up:
            return
        self._up = False
        for ns in self.namespaces:
            _kill_inside(ns)
            _ip("netns", "del", ns, check=False)     # takes the veth pair with it
        _ip("link", "del", self.bridge_dev, check=False)
        atexit.unregister(self.teardown)

    def __enter__(self) -> "Netns":
        return self.setup()

    def __exit__(self, *exc) -> None:
        self.teardown()

    def exec_prefix(self, i: int) -> list[str]:
        """The command prefix that runs a program in node ``i``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[i]]

    # ------------------------------------------------------------ faults
    def isolate(self, node: int) -> None:
        """Cut ``node`` from every other node; the root namespace still reaches it."""
        self._set_cut({frozenset((node, j)) for j in range(self.nodes) if j != node})

    def split(self, groups: Sequence[Iterable[int]]) -> None:
        """Nodes talk only within their group (e.g. ``[[0, 1], [2]]``: majority/minority)."""
        side = {n: k for k, g in enumerate(groups) for n in g}
        self._set_cut({frozenset(p) for p in itertools.combinations(range(self.nodes), 2)
                       if side.get(p[0], -1 - p[0]) != side.get(p[1], -1 - p[1])})

    def bridge(self, a: int, b: int, via: int) -> None:
        """``a`` and ``b`` cannot talk to each other; ``via`` reaches both (and each sees it)."""
        if len({a, b, via}) != 3:
            raise ValueError(f"bridge needs three different nodes, got {a}, {b}, {via}")
        self._set_cut({frozenset((a, b))})

    def cut_off(self, node: int) -> None:
        """Take ``node``'s link down: no other node and not the client reaches it."""
        with self._lock:
            _ip("-n", self.namespaces[node], "link", "set", f"rp{self.run}n{node}", "down")
            self._down.add(node)

    def heal(self) -> None:
        """Every link up and every cut removed."""
        self._set_cut(set())
        with self._lock:
            for node in sorted(self._down):
                ns, inner = self.namespaces[node], f"rp{self.run}n{node}"
                _ip("-n", ns, "link", "set", inner, "up")    # its /24 route comes back with it
            self._down.clear()

    def flap(self, fault: Callable[[], None], stop: threading.Event,
             period: tuple[float, float] = (1.0, 2.0), rng: random.Random | None = None,
             on_change: Callable[[str], None] = lambda _: None) -> int:
        """Apply ``fault``, heal, apply again, every ``period`` seconds (uniform), until
        ``stop`` is set; ends healed. Returns how many times the fault was applied."""
        rng = rng or random.Random()
        count = 0
        try:
            while not stop.is_set():
                fault()
                count += 1
                on_change("cut")
                if stop.wait(rng.uniform(*period)):
                    break
                self.heal()
                on_change("heal")
                stop.wait(rng.uniform(*period))
        finally:
            self.heal()
        return count

    @property
    def cut_pairs(self) -> set[frozenset[int]]:
        return set(self._cut)

    def _set_cut(self, pairs: set[frozenset[int]]) -> None:
        """Make the prohibit routes exactly ``pairs`` (both directions each), changing only the difference."""
        with self._lock:
            add, remove = pairs - self._cut, self._cut - pairs
            batches: dict[int, list[str]] = {}
            for verb, change in (("del", remove), ("replace", add)):
                for pair in change:
                    a, b = sorted(pair)
                    batches.setdefault(a, []).append(f"route {verb} prohibit {self.addresses[b]}/32")
                    batches.setdefault(b, []).append(f"route {verb} prohibit {self.addresses[a]}/32")
            for node, lines in batches.items():
                _ip("-n", self.namespaces[node], "-batch", "-", input="\n".join(lines) + "\n")
            self._cut = set(pairs)
