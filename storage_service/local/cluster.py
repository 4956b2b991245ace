"""A local cluster: N storage nodes, each its own OS process, on loopback.

Used by ``rmq-storage local``, ``make demo``, the tests and the benchmarks.
Nodes keep their data under ``data_dir/node-<i>``; starting again with the
same directory (and ports, remembered in ``data_dir/cluster.json``) brings the
same data back.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, Sequence

import grpc

from ..proto import rmq_pb2, rmq_pb2_grpc
from ..log.dirlock import DirectoryLock
from ..protocol.placement import http_address
from .ports import free_port_block

__all__ = ["LocalCluster"]


# gRPC, raft (all groups of the node), produce port, cluster port (TLS), HTTP port
PORTS_PER_NODE = 5
# What a node prints when one of its ports is taken (storage_service/cli.py).
PORT_TAKEN = "each node needs its gRPC port"
ADMIN = "admin"      # a secure local cluster's superuser: its certificate's CN and its token's subject


def _admin_token(secret_file: str, path: str) -> str:
    """The admin's bootstrap token (version 0, no expiry: security/tokens.py), kept in
    ``path`` (0600) and made again when the secret changed."""
    from ..security.tokens import BadToken, TokenKeys
    keys = TokenKeys.from_file(secret_file)
    try:
        with open(path) as f:
            token = f.read().strip()
        keys.verify(token)
        return token
    except (OSError, BadToken):
        pass
    from ..security.certs import write_private
    token = keys.mint(ADMIN, 0)
    write_private(path, (token + "\n").encode())
    return token


class NodeExited(RuntimeError):
    """A node process ended while it was waited for; the message carries its log's last lines."""

    def __init__(self, i: int, returncode: int, log_path: str, lines: int = 12):
        try:
            with open(log_path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 16384))
                tail = f.read().decode(errors="replace").splitlines()[-lines:]
        except OSError:
            tail = []
        self.node, self.returncode, self.tail = i, returncode, "\n".join(tail)
        super().__init__(f"node {i} exited with {returncode}; see {log_path}; its last lines:\n{self.tail}")


class LocalCluster:
    """Start/stop a local multi-process cluster; ``endpoints`` is the client string."""

    def __init__(self, nodes: int | None = None, groups: int | None = None, data_dir: str = "./data",
                 port: int = 0, host: str = "127.0.0.1", fsync: str = "always",
                 extra_args: Sequence[str] = (), log_dir: str | None = None,
                 hosts: Sequence[str] | None = None, secure: bool = False, racks: int = 0):
        """``nodes``/``groups`` default to what ``data_dir`` was created with (else 3 and 4).
        ``racks``: node i runs with ``--rack r{i % racks}`` (0: no racks; default: what
        ``data_dir`` was created with).
        ``secure``: a CA, a node and an admin certificate under ``data_dir/security``
        (``security/certs.py``), TLS on every node's ports (``tls``: the admin's files).

        ``hosts`` gives each node its own address instead of ``host`` (nodes in network
        namespaces, ``tests/netns.py``); this process cannot probe ports on addresses
        it does not have, so give ``port`` with it."""
        self.data_dir = os.path.abspath(data_dir)
        # One cluster per directory: held until stop(); raises DirectoryInUse first,
        # before cluster.json or anything else is touched.
        self._lock = DirectoryLock(self.data_dir).acquire()
        try:
            self._configure(nodes, groups, port, host, fsync, extra_args, log_dir, hosts, racks)
            if not secure and os.path.exists(os.path.join(self.data_dir, "security", "ca.pem")):
                raise ValueError(f"{self.data_dir} holds a cluster made with --secure (TLS): start it "
                                 "with --secure, so it is not served in plaintext")
            self.token = self.token_file = None     # secure: the admin's bearer token
            self.tls = self._secure() if secure else None
        except BaseException:
            self._lock.release()
            raise

    def _configure(self, nodes, groups, port, host, fsync, extra_args, log_dir, hosts, racks) -> None:
        saved = self._saved()
        if racks < 0:
            raise ValueError(f"racks {racks}: give 0 (no racks) or more")
        self.racks = racks or (saved or {}).get("racks", 0)
        self.node_racks: dict[int, str] = {}      # a node's rack other than r{i % racks} (add_node)
        if saved and (nodes or saved["nodes"], groups or saved["groups"]) != (saved["nodes"], saved["groups"]):
            raise ValueError(f"{self.data_dir} holds a cluster of {saved['nodes']} nodes and "
                             f"{saved['groups']} groups; start it with those (or use a new --data-dir)")
        self.nodes = nodes or (saved["nodes"] if saved else 3)
        self.groups = groups or (saved["groups"] if saved else 4)
        self.host = host
        self.hosts = list(hosts) if hosts else [host] * self.nodes
        if len(self.hosts) != self.nodes:
            raise ValueError(f"{len(self.hosts)} hosts for {self.nodes} nodes")
        self.fsync = fsync
        self.extra_args = list(extra_args)
        self.log_dir = log_dir or self.data_dir
        os.makedirs(self.data_dir, exist_ok=True)
        self.founders = saved.get("founders", self.nodes) if saved else self.nodes
        # Ports this process chose for a new cluster may be chosen again if one is taken
        # before its node binds it (start); a saved or given layout is kept as it is.
        self._may_move = not saved and not port and not hosts
        self.addresses = self._addresses(port)
        self.procs: list[subprocess.Popen | None] = [None] * self.nodes

    def _secure(self):
        from ..security.certs import ensure_local
        from ..security.tokens import make_secret
        from ..protocol.tls import TlsFiles
        ca, node, admin = ensure_local(self.data_dir, tuple(dict.fromkeys(self.hosts)))
        secret = make_secret(os.path.join(self.data_dir, "security", "token-secret"))
        self.token_file = os.path.join(self.data_dir, "security", "admin.token")
        self.token = _admin_token(secret, self.token_file)
        self.extra_args += ["--tls-ca", ca.cert, "--tls-cert", node.cert, "--tls-key", node.key,
                            "--authorize", "--token-secret-file", secret, "--superusers", ADMIN]
        return TlsFiles(ca.cert, admin.cert, admin.key)

    def channel(self, address: str) -> grpc.Channel:
        """A channel to a node as the admin (TLS when the cluster is secure)."""
        if self.tls is None:
            return grpc.insecure_channel(address)
        from ..protocol.tls import channel_credentials
        return grpc.secure_channel(address, channel_credentials(self.tls))

    def _saved(self) -> dict | None:
        try:
            with open(os.path.join(self.data_dir, "cluster.json")) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def _addresses(self, port: int) -> list[str]:
        saved = self._saved()
        if saved and not port:
            return saved["addresses"]
        span = PORTS_PER_NODE
        if port:
            bases = [port + i * span for i in range(self.nodes)]
        else:
            bases = []
            for h in self.hosts:
                used = [b + k for b in bases for k in range(span)]
                bases.append(free_port_block(span, h, used))
        addresses = [f"{h}:{b}" for h, b in zip(self.hosts, bases)]
        self._save(addresses)
        return addresses

    def _save(self, addresses: list[str]) -> None:
        with open(os.path.join(self.data_dir, "cluster.json"), "w") as f:
            json.dump({"nodes": len(addresses), "groups": self.groups, "addresses": addresses,
                       "founders": self.founders, "racks": self.racks}, f)

    def add_node(self, timeout: float = 60.0, start: bool = True, rack: str | None = None) -> int:
        """Start one more node that joins the running cluster (``--join``); its index.
        ``rack``: its rack, if not ``r{i % racks}``."""
        used = [int(a.rsplit(":", 1)[1]) + k for a in self.addresses for k in range(PORTS_PER_NODE)]
        base = free_port_block(PORTS_PER_NODE, self.host, used)
        self.addresses.append(f"{self.host}:{base}")
        self.hosts.append(self.host)
        self.procs.append(None)
        self.nodes += 1
        self._save(self.addresses)
        i = self.nodes - 1
        if rack is not None:
            self.node_racks[i] = rack
        for attempt in range(3 if start else 0):
            self.start_node(i)
            try:
                self.wait_ready(timeout, nodes=[i])
                break
            except NodeExited as e:
                # Its ports were free when chosen, but something else (another test's
                # node, a Spark driver) bound one before it did. It has not joined yet,
                # so nothing names the address: choose another block and start again.
                if attempt == 2 or PORT_TAKEN not in e.tail or "joined the cluster" in e.tail:
                    raise
                used.extend(int(self.addresses[i].rsplit(":", 1)[1]) + k for k in range(PORTS_PER_NODE))
                base = free_port_block(PORTS_PER_NODE, self.host, used)
                self.addresses[i] = f"{self.host}:{base}"
                self._save(self.addresses)
                shutil.rmtree(os.path.join(self.data_dir, f"node-{i}"), ignore_errors=True)
        return i

    @property
    def endpoints(self) -> str:
        return ",".join(self.addresses)

    @property
    def http_urls(self) -> list[str]:
        """Each node's HTTP port (status page, /metrics, JSON API) as a URL."""
        scheme = "https" if self.tls is not None else "http"
        return [f"{scheme}://{http_address(a)}" for a in self.addresses]

    def node_command(self, i: int) -> list[str]:
        founders = ",".join(self.addresses[:self.founders])
        who = (["--id", str(i), "--nodes", founders] if i < self.founders
               else ["--listen", self.addresses[i], "--join", founders])
        rack = self.rack_of(i)
        return [sys.executable, "-m", "storage_service.cli", "node", *who, "--groups", str(self.groups),
                "--data-dir", os.path.join(self.data_dir, f"node-{i}"),
                "--fsync", self.fsync, *(["--rack", rack] if rack else []), *self.extra_args]

    def rack_of(self, i: int) -> str:
        """Node i's rack ("" without racks)."""
        return self.node_racks.get(i, f"r{i % self.racks}" if self.racks else "")

    def start_node(self, i: int) -> None:
        log = open(os.path.join(self.log_dir, f"node-{i}.log"), "ab")
        self.procs[i] = subprocess.Popen(self.node_command(i), stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        log.close()

    def start(self, timeout: float = 60.0, say: Callable[[str], None] | None = None) -> "LocalCluster":
        """Start every node and wait until each sees a leader for every group
        (``wait_ready``: ``timeout`` seconds without progress). If that fails, the
        nodes started are stopped again (``with`` never reaches ``__exit__``)."""
        self._lock.acquire()             # again after a stop()
        for attempt in range(3):
            try:
                for i in range(self.nodes):
                    self.start_node(i)
                self.wait_ready(timeout, say=say)
                break
            except NodeExited as e:
                self.stop()
                if not (self._may_move and attempt < 2 and PORT_TAKEN in e.tail):
                    raise
                # A port was free when chosen and bound by something else before its
                # node could: nothing has run on these addresses yet, so choose again.
                self._lock.acquire()
                for i in range(self.nodes):
                    shutil.rmtree(os.path.join(self.data_dir, f"node-{i}"), ignore_errors=True)
                os.remove(os.path.join(self.data_dir, "cluster.json"))
                self.addresses = self._addresses(0)
            except BaseException:
                self.stop()
                raise
        self._may_move = False
        return self

    def health(self, i: int) -> rmq_pb2.HealthResponse | None:
        with self.channel(self.addresses[i]) as ch:
            try:
                return rmq_pb2_grpc.MessageLogStub(ch).Health(rmq_pb2.HealthRequest(), timeout=1.0)
            except grpc.RpcError:
                return None

    def wait_ready(self, timeout: float = 60.0, nodes: Sequence[int] | None = None,
                   say: Callable[[str], None] | None = None) -> None:
        """Block until every running node sees a leader for every group.

        ``timeout``: seconds without progress, not in all: a node that answers
        for the first time, leads or sees a leader for one more group, or opens
        more queues starts the wait again (a node replaying a long journal is
        not given up on while it gets on). ``say`` gets a line about the nodes
        still waited for every 2 s."""
        nodes = list(range(self.nodes)) if nodes is None else list(nodes)
        deadline = time.monotonic() + timeout
        seen: dict[int, tuple] = {}
        said = time.monotonic()
        while True:
            pending, progress = [], False
            for i in nodes:
                p = self.procs[i]
                if p is not None and p.poll() is not None:
                    raise NodeExited(i, p.returncode, os.path.join(self.log_dir, f"node-{i}.log"))
                h = self.health(i) if p is not None else None
                if p is not None and (h is None or not h.serving):
                    pending.append(i)
                    # (answers, groups with a leader, queues open): a new best is progress
                    mark = (1, h.groups_with_leader, h.queues_open) if h is not None else (0, 0, 0)
                    best = seen.get(i, (0, 0, 0))
                    if any(m > b for m, b in zip(mark, best)):
                        progress = True
                        seen[i] = tuple(map(max, mark, best))
            if not pending:
                return
            now = time.monotonic()
            if progress:
                deadline = now + timeout
            if now > deadline:
                raise TimeoutError(f"nodes {pending} not ready: no progress for {timeout}s; "
                                   f"see logs in {self.log_dir}")
            if say is not None and now - said >= 2:
                said = now
                say("waiting for nodes: " + ", ".join(
                    f"{i} ({'starting' if not seen.get(i, (0,))[0] else f'{seen[i][1]} groups with a leader'})"
                    for i in pending))
            time.sleep(0.1)

    def pid(self, i: int) -> int | None:
        p = self.procs[i]
        return p.pid if p is not None and p.poll() is None else None

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        p = self.procs[i]
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                p.wait(timeout=30)
                self.procs[i] = None

    def stop(self) -> None:
        for i, p in enumerate(self.procs):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for i, p in enumerate(self.procs):
            if p is not None:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    print(f"node {i} did not stop within 15 s of SIGTERM: killed (its restart replays "
                          "its journals; see its log)", file=sys.stderr, flush=True)
                    p.kill()
                    p.wait()
            self.procs[i] = None
        self._lock.release()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
