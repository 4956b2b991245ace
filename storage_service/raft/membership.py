"""A raft group's members, derived only from what is durable.

pysyncobj's dynamic membership change appends ``['add'|'rem', address,
node]`` entries and applies each to the in-memory configuration when it is
appended (raft's rule: a node uses the latest configuration in its log),
reverses it when a conflicting append truncates it, and after a restart
re-applies the *committed* ones as it applies the log. It keeps no
configuration on disk but the one in a snapshot, and our snapshot did not
keep one. So a restarted node would start from the member list on its
command line, and re-applying old committed entries walks it through
configurations it already left (an ``add D`` then ``rem D`` makes D a voter
again between the two).

Here the configuration is a function of durable state, computed once at
start and after a snapshot is installed:

  config = the newer of two records: the config in the snapshot (as of the
           snapshot's index) and the replica's ``members`` file (as of the
           index written in it: 0 for a group's founding replicas, the
           group's commit index when a replica was added to a running group),
           + every membership entry in the journal after that index, in order.

A replica added to a running group takes the group's configuration as of
its commit index from the leader (``RaftGroup.config_at_commit``): committed
entries are never truncated, so its record never names a configuration the
group may roll back, and the entries it then receives apply on top of it.

Apply-time re-application is turned off (``RaftGroup``); append-time changes
and their reversal stay pysyncobj's. A snapshot records the configuration as
of its own index: the live configuration rewound past the entries after it.
"""
from __future__ import annotations

import json
import os
import struct
import time
from typing import Callable, Iterable

from ._pysyncobj import MEMBERSHIP, is_membership, membership_change

__all__ = ["MAGIC", "Membership", "SNAPSHOT_ENTRY", "change_of", "decode_config", "encode_config", "read_members", "replay", "rewind",
           "snapshot_config", "write_members"]

MAGIC = b"RMQMEMB1"          # a snapshot section; state-machine blobs never start with it
_LEN = struct.Struct("<I")
# A snapshot file starts with two entries, ``SNAPSHOT_ENTRY | command``: its last
# one, then the one before (``RaftGroup._write_snapshot``); this section follows.
SNAPSHOT_ENTRY = struct.Struct("<QQQ")         # command length, index, term
MEMBERS_FILE = "members"


def change_of(command: bytes) -> tuple[str, str] | None:
    """("add"|"rem", address) of a membership entry's command, else None."""
    return membership_change(command)


def _apply(config: set[str], change: tuple[str, str], reverse: bool = False) -> None:
    kind, address = change
    adding = (kind == "add") != reverse
    if adding:
        config.add(address)
    else:
        config.discard(address)


def replay(base: Iterable[str], commands: Iterable[bytes]) -> set[str]:
    """``base`` with the membership entries among ``commands`` (oldest first) applied."""
    config = set(base)
    for cmd in commands:
        change = change_of(cmd)
        if change is not None:
            _apply(config, change)
    return config


def rewind(current: Iterable[str], commands: Iterable[bytes]) -> set[str]:
    """The configuration before ``commands`` (oldest first) were appended."""
    config = set(current)
    for cmd in reversed(list(commands)):
        change = change_of(cmd)
        if change is not None:
            _apply(config, change, reverse=True)
    return config


def encode_config(members: Iterable[str]) -> bytes:
    body = json.dumps(sorted(members)).encode()
    return MAGIC + _LEN.pack(len(body)) + body


def decode_config(data: bytes, pos: int) -> tuple[set[str] | None, int]:
    """(members, position after) of a config section at ``pos``, or (None, pos) if none is there."""
    if data[pos:pos + len(MAGIC)] != MAGIC:
        return None, pos
    pos += len(MAGIC)
    (n,) = _LEN.unpack_from(data, pos)
    pos += _LEN.size
    return set(json.loads(bytes(data[pos:pos + n]))), pos + n


def snapshot_config(path: str) -> tuple[set[str] | None, int]:
    """(members, index) recorded in a snapshot file, or (None, 0) for a snapshot
    written before wave 2 (without the section)."""
    entry_head = SNAPSHOT_ENTRY
    with open(path, "rb") as f:
        n, idx, _ = entry_head.unpack(f.read(entry_head.size))
        f.seek(n, os.SEEK_CUR)
        n2, _, _ = entry_head.unpack(f.read(entry_head.size))
        f.seek(n2, os.SEEK_CUR)
        head = f.read(len(MAGIC) + _LEN.size)
        if not head.startswith(MAGIC) or len(head) < len(MAGIC) + _LEN.size:
            return None, 0
        (size,) = _LEN.unpack_from(head, len(MAGIC))
        members, _ = decode_config(head + f.read(size), 0)
    return members, idx


def read_members(group_dir: str) -> tuple[list[str], int] | None:
    """(members, index) of the replica's ``members`` file, or None if it has none."""
    try:
        with open(os.path.join(group_dir, MEMBERS_FILE)) as f:
            rec = json.load(f)
    except FileNotFoundError:
        return None
    return rec["members"], int(rec["index"])


def write_members(group_dir: str, members: Iterable[str], index: int = 0) -> None:
    """The replica's configuration as of raft index ``index``, durably (written
    once, when the replica is created)."""
    path = os.path.join(group_dir, MEMBERS_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"members": sorted(members), "index": index}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(group_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Membership:
    """RaftGroup's membership: the configuration rebuilt from durable state, and
    replicas added and removed one at a time (a mixin of ``RaftGroup``)."""

    def _load_members(self) -> None:
        """Set the group's configuration from durable state (membership.py): the
        snapshot's config (else the initial members) + the journal's changes after it."""
        path = self.snapshot_path
        base, base_idx = snapshot_config(path) if os.path.isfile(path) else (None, 0)
        if base is None or base_idx < self.members_index:
            base, base_idx = self.initial_members, self.members_index
        config = replay(base, self.journal.commands_after(base_idx, MEMBERSHIP))
        me = self.selfNode.address
        self.set_voters([a for a in config if a != me])

    def config_at_commit(self) -> tuple[list[str], int]:
        """(voters, commit index): the configuration as of the commit index, what a
        replica added now starts from (tick thread, or under ``RaftLoop.call``)."""
        commit = self.raftCommitIndex
        current = {n.address for n in self.otherNodes} | {self.selfNode.address}
        return sorted(rewind(current, self.journal.commands_after(commit, MEMBERSHIP))), commit

    @property
    def members(self) -> list[str]:
        """Raft addresses of the group's voters as this replica knows them (itself included)."""
        return sorted({n.address for n in self.otherNodes} | {self.selfNode.address})

    def add_member(self, address: str, callback: Callable) -> None:
        """Propose adding a replica (leader only; one change at a time: pysyncobj
        refuses a second one, REQUEST_DENIED, until the first is applied)."""
        self.addNodeToCluster(address, callback=callback)

    def remove_member(self, address: str, callback: Callable) -> None:
        self.removeNodeFromCluster(address, callback=callback)

    def transfer_to(self, address: str, timeout: float = 3.0) -> bool:
        """Hand the leadership to voter ``address`` (any thread; blocks): True once
        this node no longer leads and names ``address`` as leader.

        pysyncobj sends TimeoutNow only to a target whose match index is the
        leader's last index, which under load it never is. So new entries wait
        (``_transfer_step`` on the tick thread holds the command queue) until the
        target has everything, then TimeoutNow goes; if the target has not
        taken over by ``timeout``, entries flow again and the answer is False.
        """
        deadline = time.monotonic() + timeout
        self._transfer = [address, deadline, False]
        self.wake()
        try:
            while time.monotonic() < deadline:
                if not self.is_leading():
                    return self.leader_hint == address or self._wait_hint(address, deadline)
                time.sleep(0.01)
            return False
        finally:
            self._transfer = None
            self.wake()

    def _wait_hint(self, address: str, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if self.leader_hint == address:
                return True
            time.sleep(0.01)
        return False

    def _transfer_step(self) -> bool:
        """Tick thread: True while new entries must wait for a transfer."""
        target = self._transfer
        if target is None or time.monotonic() >= target[1] or not self.is_leading():
            return False
        if not target[2]:
            node = next((n for n in self.otherNodes if n.address == target[0]), None)
            if node is None:
                return False
            if self.match_index.get(node, 0) == self.last_log_index():
                self.transferLeadership(node)
                target[2] = True
        return True

    def on_change_cluster(self, base, request):
        # One change at a time: pysyncobj means to refuse a change while the last
        # one is uncommitted, but never records it (0.3.17's __changeClusterIDx
        # stays None), so two changes submitted together were both appended. A
        # membership entry anywhere past the commit index (also one a previous
        # leader appended) holds the next change back: REQUEST_DENIED.
        if self.journal.commands_after(self.raftCommitIndex, MEMBERSHIP):
            return False
        return base(request)

    def on_apply_command(self, base, command):
        # pysyncobj re-applies a membership entry when it applies it, to rebuild
        # the configuration after a restart; ours is rebuilt from durable state
        # at start (_load_members), and re-applying old entries would walk it
        # back through configurations already left.
        if is_membership(command):
            return None
        return base(command)

