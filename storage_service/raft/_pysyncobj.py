"""The one seam to pysyncobj 0.3.17: every private name of it we use is here.

pysyncobj gives a raft core (elections, log replication, commit, snapshots)
and a TCP transport, and promises nothing about their insides. Our
durability, lease, pre-vote, membership and wire fixes need those insides.
This module is the only place that touches them; the rest of the raft
package sees an interface in our words (hashicorp/raft's ``Transport`` and
``FSM``, etcd raft's ``Storage`` and ``Ready`` take the same stance):

* ``Engine`` (a ``SyncObj``): read and change raft state (``raft_state``,
  ``match_index``, ``next_index``, ``peers``, ``election_deadline``,
  ``follow_term``, ``install_log``, ``set_voters``), send a raft message
  (``raft_send``), run pysyncobj's own handling (``deliver``,
  ``base_reply``), queue a command (``queue_command``) and wake the tick.
  pysyncobj's private methods we change call a hook of ours, each given the
  original as ``base``: ``on_message``, ``on_reply``, ``on_send_appends``,
  ``on_apply_entries``, ``on_load_snapshot``, ``on_change_cluster``,
  ``on_apply_command``, ``on_tick``, ``on_commands``.
* ``Connection`` (a ``TcpConnection``) and ``Server`` (a ``TcpServer``): the
  socket, buffers and poller of a raft connection, and the hooks
  ``on_event``, ``on_send_ready``, ``on_readable``, ``next_message``,
  ``on_accept``.
* ``install(connection_class)``: the module-level changes (the connection
  class pysyncobj builds, its pickle protocol); ``built_on(poller)``: a
  group built on a poller of ours.

``missing()`` lists the private names of ``RELIED_ON`` that the installed
pysyncobj lacks; importing this module fails naming them, so a pysyncobj
other than the pinned one stops the node at once instead of misbehaving.
"""
from __future__ import annotations

import contextlib
import functools
import pickle
import threading
import types

import pysyncobj
import pysyncobj.pickle
import pysyncobj.syncobj
import pysyncobj.tcp_connection as _tc
import pysyncobj.tcp_server
import pysyncobj.transport
from pysyncobj import SyncObj
from pysyncobj.syncobj import _COMMAND_TYPE, _RAFT_STATE, _bchr
from pysyncobj.tcp_server import TcpServer

__all__ = ["PINNED", "RELIED_ON", "FOLLOWER", "CANDIDATE", "LEADER", "MEMBERSHIP", "REGULAR",
           "CONNECTED", "DISCONNECTED", "Connection", "Engine", "Server", "built_on", "command_bytes",
           "check", "install", "is_membership", "membership_change", "membership_command", "missing"]

PINNED = "0.3.17"
FOLLOWER, CANDIDATE, LEADER = _RAFT_STATE.FOLLOWER, _RAFT_STATE.CANDIDATE, _RAFT_STATE.LEADER
MEMBERSHIP, REGULAR = _COMMAND_TYPE.MEMBERSHIP, _COMMAND_TYPE.REGULAR
CONNECTED, DISCONNECTED = _tc.CONNECTION_STATE.CONNECTED, _tc.CONNECTION_STATE.DISCONNECTED

# class -> the private and protected names of it this module uses: methods we call
# or replace, and attributes its methods set (found in their code).
RELIED_ON: dict[type, tuple[str, ...]] = {
    SyncObj: (
        "_SyncObj__onMessageReceived", "_SyncObj__sendNextNodeIdx", "_SyncObj__sendAppendEntries",
        "_SyncObj__applyLogEntries", "_SyncObj__loadDumpFile", "_SyncObj__changeCluster",
        "_SyncObj__doApplyCommand", "_SyncObj__updateClusterConfiguration", "_SyncObj__setCurrentTerm",
        "_SyncObj__setState", "_SyncObj__getCurrentLogIndex", "_SyncObj__getCurrentLogTerm",
        "_SyncObj__connectedToAnyone", "_SyncObj__generateRaftTimeout", "_onTick", "_checkCommandsToApply",
        "_methodToID", "_getFuncName", "_isLeader", "_getLeader", "_doDestroy",
        "_SyncObj__raftState", "_SyncObj__raftCurrentTerm", "_SyncObj__votedForNodeId",
        "_SyncObj__raftCommitIndex", "_SyncObj__raftLastApplied", "_SyncObj__raftLog",
        "_SyncObj__raftMatchIndex", "_SyncObj__raftNextIndex", "_SyncObj__raftElectionDeadline",
        "_SyncObj__raftLeader", "_SyncObj__otherNodes", "_SyncObj__transport", "_SyncObj__conf",
        "_SyncObj__serializer", "_SyncObj__noopIDx", "_SyncObj__lastResponseTime",
        "_SyncObj__transferInProgress", "_SyncObj__commandsWaitingCommit", "_SyncObj__commandsQueue",
        "_SyncObj__pipeNotifier", "_poller"),
    _tc.TcpConnection: (
        "_TcpConnection__processConnection", "_TcpConnection__processConnectionTimeout",
        "_TcpConnection__processSend", "_TcpConnection__processRead", "_TcpConnection__processParseMessage",
        "_TcpConnection__trySendBuffer", "_TcpConnection__socket", "_TcpConnection__fileno",
        "_TcpConnection__poller", "_TcpConnection__readBuffer", "_TcpConnection__writeBuffer",
        "_TcpConnection__recvBufferSize"),
    TcpServer: (
        "_TcpServer__onNewConnection", "_TcpServer__socket", "_TcpServer__fileno", "_TcpServer__poller",
        "_TcpServer__connectionTimeout", "_TcpServer__onNewConnectionCallback"),
}
# Module-level names replaced by ``install`` and ``built_on``.
PATCHED = ((pysyncobj.pickle, "__protocol"), (pysyncobj.transport, "TcpConnection"),
           (pysyncobj.tcp_server, "TcpConnection"), (pysyncobj.syncobj, "createPoller"))


def _names_in(cls: type) -> set[str]:
    """Every attribute and method name the class defines or its code uses."""
    names = set(dir(cls))
    codes = [f.__code__ for f in vars(cls).values() if isinstance(f, types.FunctionType)]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return names


def missing() -> list[str]:
    """The names this module relies on that the installed pysyncobj lacks."""
    out = [f"{cls.__module__}.{cls.__name__}.{name}" for cls, names in RELIED_ON.items()
           for name in names if name not in _names_in(cls)]
    out += [f"{mod.__name__}.{name}" for mod, name in PATCHED if not hasattr(mod, name)]
    return out


def check() -> None:
    """ImportError naming every relied-on name the installed pysyncobj lacks."""
    gone = missing()
    if gone:
        from importlib.metadata import version
        raise ImportError(f"pysyncobj {version('pysyncobj')} lacks what storage_service/raft relies "
                          f"on (pinned: pysyncobj=={PINNED}): {', '.join(gone)}")


check()


def command_bytes(method_id: int, cmd) -> bytes:
    """A regular raft command as pysyncobj's journal holds it (a ``@replicated`` call)."""
    return _bchr(REGULAR) + pysyncobj.pickle.dumps((method_id, (cmd,)))


def is_membership(command: bytes) -> bool:
    return command[:1] == _bchr(MEMBERSHIP)


def membership_command(kind: str, address: str) -> bytes:
    """A membership entry's command as pysyncobj writes it (``kind``: "add" or "rem")."""
    from pysyncobj.node import TCPNode
    return _bchr(MEMBERSHIP) + pysyncobj.pickle.dumps([kind, address, TCPNode(address)])


def membership_change(command: bytes) -> tuple[str, str] | None:
    """("add"|"rem", raft address) of a membership entry's command, else None."""
    if not command or command[0] != MEMBERSHIP:
        return None
    request = pysyncobj.pickle.loads(bytes(command[1:]))
    return request[0], request[1]


def install(connection_class: type) -> None:
    """pysyncobj's transport and server build ``connection_class`` (idempotent), and its
    own pickle (raft commands, journal entries) uses the highest protocol: under
    protocol 2 every ``bytes`` payload round-trips through a latin-1 ``str``."""
    setattr(pysyncobj.pickle, "__protocol", pickle.HIGHEST_PROTOCOL)
    pysyncobj.transport.TcpConnection = connection_class
    pysyncobj.tcp_server.TcpConnection = connection_class


_construct = threading.Lock()      # createPoller is swapped while a group is built


@contextlib.contextmanager
def built_on(poller_factory):
    """SyncObjs built inside take their poller from ``poller_factory()`` (None:
    pysyncobj's own): pysyncobj has no argument for it."""
    with _construct:
        make = pysyncobj.syncobj.createPoller
        if poller_factory is not None:
            pysyncobj.syncobj.createPoller = lambda _type: poller_factory()
        try:
            yield
        finally:
            pysyncobj.syncobj.createPoller = make


class Engine(SyncObj):
    """pysyncobj's ``SyncObj`` seen through the seam (module doc)."""

    # --------------------------------------------------------------- state
    @property
    def raft_state(self) -> int:
        return self._SyncObj__raftState

    @property
    def peers(self) -> set:
        """The other voters (pysyncobj's set itself: do not change it)."""
        return self._SyncObj__otherNodes

    @property
    def match_index(self) -> dict:
        return self._SyncObj__raftMatchIndex

    @match_index.setter
    def match_index(self, value: dict) -> None:
        self._SyncObj__raftMatchIndex = value

    @property
    def next_index(self) -> dict:
        return self._SyncObj__raftNextIndex

    @property
    def election_deadline(self) -> float:
        return self._SyncObj__raftElectionDeadline

    @election_deadline.setter
    def election_deadline(self, value: float) -> None:
        self._SyncObj__raftElectionDeadline = value

    @property
    def noop_index(self) -> int | None:
        """The index of this leader's first entry of its term (None before it)."""
        return self._SyncObj__noopIDx

    @property
    def transfer_in_progress(self) -> bool:
        return bool(self._SyncObj__transferInProgress)

    def waiting_commit(self) -> dict:
        """raft index -> callbacks of commands waiting for it to commit (a method: pysyncobj
        reads every attribute of the object before it sets this one)."""
        return self._SyncObj__commandsWaitingCommit

    @property
    def raft_log(self):
        """pysyncobj's journal (``DurableJournal`` once ``install_log`` ran)."""
        return self._SyncObj__raftLog

    @property
    def snapshot_path(self) -> str:
        return self._SyncObj__conf.fullDumpFile

    def response_times(self) -> dict:
        """Follower -> monotonic time of its last reply (check-quorum's record)."""
        return self._SyncObj__lastResponseTime

    def note_response(self, node, when: float) -> None:
        self._SyncObj__lastResponseTime[node] = when

    def last_log_index(self) -> int:
        return self._SyncObj__getCurrentLogIndex()

    def last_log_term(self) -> int:
        return self._SyncObj__getCurrentLogTerm()

    def connected_to_anyone(self) -> bool:
        return self._SyncObj__connectedToAnyone()

    def new_election_timeout(self) -> float:
        return self._SyncObj__generateRaftTimeout()

    def forget_leader(self) -> None:
        self._SyncObj__raftLeader = None

    def follow_term(self, term: int) -> None:
        """Raft's rule for a message of a later term: take it, as a follower."""
        self._SyncObj__setCurrentTerm(term, None)
        self._SyncObj__setState(FOLLOWER)
        self._SyncObj__raftLeader = None

    def set_voters(self, addresses: list[str]) -> None:
        """The group's other voters, replacing pysyncobj's configuration."""
        self._SyncObj__updateClusterConfiguration(addresses)

    def force_role(self, state: int, term: int) -> None:
        """Put this replica in ``state`` (FOLLOWER, CANDIDATE, LEADER) of ``term`` as is,
        with no election: for tests that drive one replica's handlers by hand."""
        self._SyncObj__raftCurrentTerm = term
        self._SyncObj__raftState = state

    def set_applied(self, last_applied: int, commit_index: int) -> None:
        self._SyncObj__raftLastApplied = last_applied
        self._SyncObj__raftCommitIndex = commit_index

    def install_log(self, journal) -> None:
        """Replace pysyncobj's journal and reload term, vote and commit index from it."""
        self._SyncObj__raftLog._destroy()
        self._SyncObj__raftLog = journal
        if len(journal) == 0:
            journal.add(b"\x01", 1, 0)     # pysyncobj's initial NO_OP entry
            journal.sync()
        self._SyncObj__raftCurrentTerm = max(journal.getCurrentTerm(), journal[-1][2])
        self._SyncObj__votedForNodeId = journal.getVotedForNodeId()
        self._SyncObj__raftCommitIndex = journal.getRaftCommitIndex()

    def take_snapshot_part(self, data) -> bool:
        """Hand a received snapshot transmission part to pysyncobj's serializer: True
        once the whole snapshot file is written and may be loaded."""
        return self._SyncObj__serializer.setTransmissionData(data)

    def method_id(self, name: str) -> int:
        """The id pysyncobj gives a ``@replicated`` method in its commands."""
        return self._methodToID[self._getFuncName(name)]

    # -------------------------------------------------------------- acting
    def raft_send(self, node, message: dict) -> bool:
        return self._SyncObj__transport.send(node, message)

    def wrap_send(self, wrap) -> None:
        """Every raft message this group sends goes through ``wrap(send)``'s result."""
        transport = self._SyncObj__transport
        transport.send = wrap(transport.send)

    def deliver(self, node, message: dict) -> None:
        """pysyncobj's own handling of a raft message (no hook of ours)."""
        SyncObj._SyncObj__onMessageReceived(self, node, message)

    def base_reply(self, node, reset=False, next_idx=None, success=False) -> None:
        """pysyncobj's own reply to an append (no hook of ours)."""
        SyncObj._SyncObj__sendNextNodeIdx(self, node, reset, next_idx, success)

    def queue_command(self, data: bytes, callback) -> None:
        """Queue an encoded command (``command_bytes``) from the tick thread itself."""
        self._SyncObj__commandsQueue.put_nowait((data, callback))

    def wake(self) -> None:
        """Make the tick run now (any thread)."""
        self.tick_wanted = True
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            notifier.notify()

    def do_tick(self, wait: float) -> None:
        self.doTick(wait)

    def engine_poller(self):
        """The poller pysyncobj built this group with (``built_on``)."""
        return self._poller

    def destroy_engine(self) -> None:
        self._doDestroy()

    def is_leading(self) -> bool:
        return self._isLeader()

    def leader_node(self):
        return self._getLeader()

    # ---------------------------------------------------- pysyncobj -> hooks
    def _SyncObj__onMessageReceived(self, node, message):
        return self.on_message(node, message)

    def _SyncObj__sendNextNodeIdx(self, node, reset=False, nextNodeIdx=None, success=False):
        return self.on_reply(node, reset, nextNodeIdx, success)

    def _SyncObj__sendAppendEntries(self):
        return self.on_send_appends(functools.partial(SyncObj._SyncObj__sendAppendEntries, self))

    def _SyncObj__applyLogEntries(self):
        return self.on_apply_entries(functools.partial(SyncObj._SyncObj__applyLogEntries, self))

    def _SyncObj__loadDumpFile(self, clearJournal):
        return self.on_load_snapshot(clearJournal)

    def _SyncObj__changeCluster(self, request):
        return self.on_change_cluster(functools.partial(SyncObj._SyncObj__changeCluster, self), request)

    def _SyncObj__doApplyCommand(self, command):
        return self.on_apply_command(functools.partial(SyncObj._SyncObj__doApplyCommand, self), command)

    def _onTick(self, timeToWait=0.0):
        return self.on_tick(functools.partial(SyncObj._onTick, self, timeToWait))

    def _checkCommandsToApply(self):
        return self.on_commands(functools.partial(SyncObj._checkCommandsToApply, self))

    # hooks: pysyncobj's behaviour unless a subclass changes it
    def on_message(self, node, message):
        return self.deliver(node, message)

    def on_reply(self, node, reset, next_idx, success):
        return self.base_reply(node, reset, next_idx, success)

    def on_send_appends(self, base):
        return base()

    def on_apply_entries(self, base):
        return base()

    def on_load_snapshot(self, clear_journal):
        return SyncObj._SyncObj__loadDumpFile(self, clear_journal)

    def on_change_cluster(self, base, request):
        return base(request)

    def on_apply_command(self, base, command):
        return base(command)

    def on_tick(self, base):
        return base()

    def on_commands(self, base):
        return base()


class Connection(_tc.TcpConnection):
    """pysyncobj's ``TcpConnection`` seen through the seam (module doc)."""

    @property
    def sock(self):
        return self._TcpConnection__socket

    @property
    def poller(self):
        return self._TcpConnection__poller

    @property
    def recv_buffer_size(self) -> int:
        return self._TcpConnection__recvBufferSize

    def buffers(self) -> tuple[bytearray, bytearray]:
        """(read, write) buffers as bytearrays (pysyncobj resets them to ``bytes()`` on
        connect and disconnect; it grows them with ``+=``, a full copy each time)."""
        if not isinstance(self._TcpConnection__readBuffer, bytearray):
            self._TcpConnection__readBuffer = bytearray(self._TcpConnection__readBuffer)
        if not isinstance(self._TcpConnection__writeBuffer, bytearray):
            self._TcpConnection__writeBuffer = bytearray(self._TcpConnection__writeBuffer)
        return self._TcpConnection__readBuffer, self._TcpConnection__writeBuffer

    def check_timeout(self) -> None:
        """pysyncobj's read-timeout check (it may disconnect)."""
        self._TcpConnection__processConnectionTimeout()

    def try_send_buffer(self) -> None:
        self._TcpConnection__trySendBuffer()

    def watch(self, events: int, descr=None) -> None:
        """Have the poller call this connection for ``events`` on its socket."""
        self._TcpConnection__poller.subscribe(self._TcpConnection__fileno if descr is None else descr,
                                              self._TcpConnection__processConnection, events)

    def base_event(self, descr, events: int) -> None:
        """pysyncobj's own handling of a poll event (no hook of ours)."""
        _tc.TcpConnection._TcpConnection__processConnection(self, descr, events)

    # pysyncobj -> hooks
    def _TcpConnection__processConnection(self, descr, eventType):
        return self.on_event(descr, eventType)

    def _TcpConnection__processSend(self):
        return self.on_send_ready()

    def _TcpConnection__processRead(self):
        return self.on_readable()

    def _TcpConnection__processParseMessage(self):
        return self.next_message()

    def on_event(self, descr, events):
        return self.base_event(descr, events)

    def on_send_ready(self):
        return _tc.TcpConnection._TcpConnection__processSend(self)

    def on_readable(self):
        return _tc.TcpConnection._TcpConnection__processRead(self)

    def next_message(self):
        return _tc.TcpConnection._TcpConnection__processParseMessage(self)


class Server(TcpServer):
    """pysyncobj's ``TcpServer`` seen through the seam: ``on_accept`` is called for
    events on the listening socket."""

    @property
    def listening(self):
        return self._TcpServer__socket

    @listening.setter
    def listening(self, sock) -> None:
        self._TcpServer__socket = sock

    @property
    def bound(self) -> bool:
        """Whether the listening socket is open."""
        return self._TcpServer__fileno is not None

    @property
    def server_poller(self):
        return self._TcpServer__poller

    @property
    def connection_timeout(self) -> float:
        return self._TcpServer__connectionTimeout

    def accept_again(self) -> bool:
        """Have the poller report the listening socket again; False if it is closed."""
        if not self.bound:
            return False
        from pysyncobj.poller import POLL_EVENT_TYPE
        self._TcpServer__poller.subscribe(self._TcpServer__fileno, self._TcpServer__onNewConnection,
                                          POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)
        return True

    def hand_over(self, conn) -> None:
        """Give an accepted connection to whoever the server was made for."""
        self._TcpServer__onNewConnectionCallback(conn)

    def _TcpServer__onNewConnection(self, descr, event):
        return self.on_accept(descr, event)

    def on_accept(self, descr, event):
        return TcpServer._TcpServer__onNewConnection(self, descr, event)
