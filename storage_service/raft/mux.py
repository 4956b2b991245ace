"""One raft port per node: every raft group of a node talks over shared connections.

pysyncobj gives each SyncObj a TCP server and a connection per peer, so a
node with G groups listened on G+1 ports and held G connections to every
peer; the number of groups a node could host was bounded by the ports it
could take, and adding a group meant adding a port on every node. Here a
node's ``RaftHub`` listens on one address and keeps one outgoing connection
to every peer node it shares a group with (and accepts theirs). Each group's
``MuxTransport`` is a pysyncobj ``Transport`` that sends through the hub;
frames are tagged with the group number and handed to that group's
transport on arrival.

Wire (all nodes of a cluster run this code): ``FastTcpConnection`` frames
(``u32 length | pickle``). The first frame on a connection is
``("hub", sender_address)``; after it, ``(group, message)`` for a raft
message and ``("clock", wall ms)`` (or ``None``, from older nodes) for a
keep-alive: the sender's wall clock, from which ``cluster_time_ms`` takes
the median of the nodes' clocks. Both nodes of a pair connect out, so
a node that knows a peer reaches it even when the peer does not know it yet
(a joining node); a message goes out on the outgoing connection when it is
up, else on the incoming one. A peer is "connected" for its groups while
either connection is.

Keep-alives: pysyncobj's connection closes itself when it has read nothing
for ``timeout`` seconds, checked when it sends. With a group's heartbeats
that was enough; two nodes may now share no group that is led on either
side, so the hub sends a keep-alive every ``timeout / 4`` on each
connection. A connect that neither completes nor fails (a SYN into a
partition) is dropped after ``timeout`` and retried.
"""
from __future__ import annotations

import collections
import functools
import logging
import statistics
import time

from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import Transport

from . import transport
from .tls_wire import HubServer, RaftTls, make_connection
from .transport import FastTcpConnection

__all__ = ["MuxTransport", "RaftHub"]

log = logging.getLogger(__name__)

_HELLO = "hub"
_CLOCK = "clock"           # ("clock", wall ms): sent as the keep-alive (older nodes drop it)
CLOCK_FRESH_S = 10.0       # a peer's clock reading older than this is not used
# A reading is late by the time it waited on the way and in this node's sockets (never
# early), so of a peer's last few readings the latest-looking one is the truest: with
# the newest alone, a raft loop held up 20 ms put that peer's clock 20 ms behind, and
# two leaders' store timestamps apart by as much. Six readings: both connections of a
# pair ping every timeout / 4, so a peer's clock stepping back shows within ~3 pings
# (~6 with one connection up: still inside CLOCK_FRESH_S).
CLOCK_READINGS = 6


class _Conn:
    """One connection of a hub, outgoing or accepted, and what the hub knows of it."""
    __slots__ = ("conn", "peer", "ready", "since", "outgoing")

    def __init__(self, conn: FastTcpConnection, peer: str | None, outgoing: bool):
        self.conn = conn
        self.peer = peer            # known at once for an outgoing one, after the hello otherwise
        self.ready = False          # hello sent (outgoing) or received (accepted)
        self.since = monotonic_time()
        self.outgoing = outgoing

    @property
    def up(self) -> bool:
        return self.ready and self.conn.state != CONNECTION_STATE.DISCONNECTED


class RaftHub:
    """A node's raft port: one listening socket and the connections to its peers.

    Lives on the node's ``RaftLoop`` (its poller, its thread): every method
    but ``__init__`` and ``close`` runs on that thread.
    """

    def __init__(self, address: str, poller, timeout: float = 3.5, retry: float = 0.5,
                 buffer_bytes: int = 1 << 20, tls: RaftTls | None = None):
        """``tls``: both ends of every connection show a node certificate of the
        cluster (``tls_wire``); None: plaintext."""
        self.address = address
        self.tls = tls
        self._poller = poller
        self.timeout = timeout
        self.retry = retry
        self._buffer = buffer_bytes
        transport.install()          # accepted connections are FastTcpConnections too
        host, port = address.rsplit(":", 1)
        self._server = HubServer(poller, host, int(port), onNewConnection=self._accepted, tls=tls,
                                 sendBufferSize=buffer_bytes, recvBufferSize=buffer_bytes,
                                 connectionTimeout=timeout)
        try:
            self._server.bind()
        except OSError as e:
            raise OSError(e.errno, f"raft port {address}: {e.strerror}") from None
        self._groups: dict[int, "MuxTransport"] = {}
        self._wanted: dict[str, int] = {}          # peer -> groups of this node that have it
        self._out: dict[str, _Conn] = {}
        self._in: dict[str, _Conn] = {}
        self._pending: set[_Conn] = set()          # accepted, hello not read yet
        # peer -> its last CLOCK_READINGS readings: (wall ms - this node's monotonic ms, when),
        # and the least delayed of them (kept at each reading: the cluster's time is taken
        # for every produce batch)
        self._clocks: dict[str, collections.deque] = {}
        self._best_clock: dict[str, tuple[float, float]] = {}
        self._up: set[str] = set()
        self._last_try: dict[str, float] = {}
        self._last_ping = 0.0
        self.dropped = 0                            # frames for a group this node does not host

    # ------------------------------------------------------------ groups
    def attach(self, group: int, transport: "MuxTransport") -> None:
        if group in self._groups:
            raise ValueError(f"group {group} already has a transport on {self.address}")
        self._groups[group] = transport

    def detach(self, group: int) -> None:
        self._groups.pop(group, None)

    def want(self, peer: str) -> None:
        """A group of this node has ``peer`` among its nodes: keep a connection to it."""
        self._wanted[peer] = self._wanted.get(peer, 0) + 1
        self._connect(peer)

    def unwant(self, peer: str) -> None:
        n = self._wanted.get(peer, 0) - 1
        if n > 0:
            self._wanted[peer] = n
            return
        self._wanted.pop(peer, None)
        out = self._out.pop(peer, None)
        if out is not None:
            out.conn.disconnect()
        self._last_try.pop(peer, None)

    def is_up(self, peer: str) -> bool:
        return peer in self._up

    @property
    def peers(self) -> list[str]:
        return sorted(self._wanted)

    # ------------------------------------------------------------- sending
    def send(self, peer: str, group: int, message) -> bool:
        """Queue a group's message to ``peer``; False if no connection to it is up."""
        c = self._out.get(peer)
        if c is None or not c.up:
            c = self._in.get(peer)
            if c is None or not c.up:
                return False
        c.conn.send((group, message))
        return c.conn.state != CONNECTION_STATE.DISCONNECTED

    def tick(self) -> None:
        """Connect to wanted peers, drop stuck connects, send keep-alives, accept again
        after a failed accept (loop thread)."""
        now = monotonic_time()
        self._server.resume_if_paused(now)
        for peer in list(self._wanted):
            c = self._out.get(peer)
            if c is not None and c.conn.state == CONNECTION_STATE.CONNECTING and \
                    now - c.since > self.timeout:
                c.conn.disconnect()                 # the callback refreshes the peer's state
            self._connect(peer, now)
        if now - self._last_ping >= self.timeout / 4:
            self._last_ping = now
            wall = time.time() * 1000
            for c in list(self._out.values()) + list(self._in.values()):
                if c.up:
                    c.conn.send((_CLOCK, wall))     # also closes a connection silent past timeout
            for c in list(self._pending):
                if now - c.since > self.timeout:    # accepted, never said who it is
                    c.conn.disconnect()

    def _connect(self, peer: str, now: float | None = None) -> None:
        c = self._out.get(peer)
        if c is not None and c.conn.state != CONNECTION_STATE.DISCONNECTED:
            return
        now = monotonic_time() if now is None else now
        if now - self._last_try.get(peer, -1e9) < self.retry:
            return
        self._last_try[peer] = now
        conn = make_connection(self._poller, self.tls, timeout=self.timeout,
                               sendBufferSize=self._buffer, recvBufferSize=self._buffer)
        c = _Conn(conn, peer, outgoing=True)
        conn.setOnConnectedCallback(functools.partial(self._out_connected, c))
        conn.setOnMessageReceivedCallback(functools.partial(self._received, c))
        conn.setOnDisconnectedCallback(functools.partial(self._closed, c))
        self._out[peer] = c
        host, port = peer.rsplit(":", 1)
        try:
            started = conn.connect(host, int(port))
        except (OSError, ValueError) as e:          # a name that does not resolve, a bad address
            log.warning("raft hub %s: cannot connect to %s (%s)", self.address, peer, e)
            started = False
        if not started:
            self._out.pop(peer, None)

    # ------------------------------------------------------------ callbacks
    def _out_connected(self, c: _Conn) -> None:
        c.conn.send((_HELLO, self.address))
        c.ready = True
        self._refresh(c.peer)

    def _accepted(self, conn: FastTcpConnection) -> None:
        c = _Conn(conn, None, outgoing=False)
        self._pending.add(c)
        conn.setOnMessageReceivedCallback(functools.partial(self._received, c))
        conn.setOnDisconnectedCallback(functools.partial(self._closed, c))

    def _received(self, c: _Conn, frame) -> None:
        if not c.ready:
            if c.outgoing:
                return
            if not (isinstance(frame, tuple) and len(frame) == 2 and frame[0] == _HELLO
                    and isinstance(frame[1], str)):
                log.warning("raft hub %s: a connection opened without a hello; closing it", self.address)
                c.conn.disconnect()
                return
            self._pending.discard(c)
            c.peer, c.ready = frame[1], True
            old = self._in.get(c.peer)
            self._in[c.peer] = c
            if old is not None and old is not c:
                old.conn.disconnect()               # the peer reconnected: its old socket is dead
            self._refresh(c.peer)
            return
        if frame is None:
            return                                  # keep-alive
        group, message = frame
        if group == _CLOCK:
            if isinstance(message, (int, float)):
                now = monotonic_time()
                readings = self._clocks.get(c.peer)
                if readings is None:
                    readings = self._clocks[c.peer] = collections.deque(maxlen=CLOCK_READINGS)
                readings.append((message - now * 1000, now))
                self._best_clock[c.peer] = max(readings)
            return
        t = self._groups.get(group)
        if t is None:
            self.dropped += 1
            return
        t.deliver(c.peer, message)

    def _closed(self, c: _Conn) -> None:
        self._pending.discard(c)
        c.ready = False
        if c.peer is None:
            return
        book = self._out if c.outgoing else self._in
        if book.get(c.peer) is c:
            del book[c.peer]
        self._refresh(c.peer)

    def _refresh(self, peer: str) -> None:
        up = any(c is not None and c.up for c in (self._out.get(peer), self._in.get(peer)))
        if up == (peer in self._up):
            return
        if up:
            self._up.add(peer)
        else:
            self._up.discard(peer)
        for t in list(self._groups.values()):
            t.peer_changed(peer, up)

    def cluster_time_ms(self) -> int:
        """The median of this node's wall clock and its peers' (of each peer's last
        ``CLOCK_READINGS`` readings the least delayed, carried forward on this node's
        monotonic clock): one node's clock stepping back
        an hour or forward a day does not move it. With one peer heard the earlier of
        the two; this node's own clock alone when it has heard no peer for
        ``CLOCK_FRESH_S``."""
        now = monotonic_time()
        readings = [time.time() * 1000]
        for peer, (diff, at) in list(self._best_clock.items()):
            if now - at >= CLOCK_FRESH_S:       # (rare: a peer silent for seconds) the fresh ones
                diff = max((d for d, a in list(self._clocks[peer]) if now - a < CLOCK_FRESH_S), default=None)
                if diff is None:
                    continue
            readings.append(diff + now * 1000)     # the least delayed of its readings
        # Of two clocks the earlier: a step forward (which would make retention delete
        # early and leases end early) never wins; three or more outvote any one.
        return int(statistics.median(readings) if len(readings) >= 3 else min(readings))

    def close(self) -> None:
        for c in list(self._out.values()) + list(self._in.values()) + list(self._pending):
            c.conn.disconnect()
        self._server.unbind()


class MuxTransport(Transport):
    """pysyncobj's transport for one group of a node, over the node's ``RaftHub``.

    Built by pysyncobj as ``transportClass(syncObj, selfNode, otherNodes)``:
    pass ``functools.partial(MuxTransport, hub, group)``.
    """

    def __init__(self, hub: RaftHub, group: int, syncObj, selfNode, otherNodes):
        super().__init__(syncObj, selfNode, otherNodes)
        self._hub = hub
        self._group = group
        self._nodes: dict = {}           # address -> pysyncobj Node
        hub.attach(group, self)
        for node in otherNodes:
            self.addNode(node)

    def setOnNodeConnectedCallback(self, callback) -> None:
        # pysyncobj sets its callbacks after building the transport, and the
        # constructor's addNode calls ran without one: a group opened while the
        # node already talks to its peers (a replica added to a running group)
        # would never count them as connected (no election, no appends).
        super().setOnNodeConnectedCallback(callback)
        for address, node in self._nodes.items():
            if self._hub.is_up(address):
                self._onNodeConnected(node)

    def addNode(self, node) -> None:
        if node.address in self._nodes:
            return
        self._nodes[node.address] = node
        self._hub.want(node.address)
        if self._hub.is_up(node.address):
            self._onNodeConnected(node)

    def dropNode(self, node) -> None:
        if self._nodes.pop(node.address, None) is None:
            return
        self._onNodeDisconnected(node)
        self._hub.unwant(node.address)

    def send(self, node, message) -> bool:
        return self._hub.send(node.address, self._group, message)

    def deliver(self, peer: str, message) -> None:
        node = self._nodes.get(peer)
        if node is not None:         # not (or no longer) a member of this group: ignored
            self._onMessageReceived(node, message)

    def peer_changed(self, peer: str, up: bool) -> None:
        node = self._nodes.get(peer)
        if node is None:
            return
        if up:
            self._onNodeConnected(node)
        else:
            self._onNodeDisconnected(node)

    def destroy(self) -> None:
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)
        for address in list(self._nodes):
            self._hub.unwant(address)
        self._nodes.clear()
        self._hub.detach(self._group)
