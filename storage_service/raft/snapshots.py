"""A raft group's snapshot files, and a snapshot received from the leader (a mixin of
``RaftGroup``).

A snapshot file holds the last two entries it covers (``SNAPSHOT_ENTRY |
command`` each), the group's configuration as of its last index
(``membership.py``), then the state machine's ``snapshot()`` blob: a data
group's segment manifest, never message payloads. What this changes in
pysyncobj: a snapshot received or loaded never drops entries this replica
acknowledged (``_install_snapshot``, ``on_load_snapshot``).
"""
from __future__ import annotations

import contextlib
import logging
import os

from pysyncobj.node import TCPNode

from . import membership
from ._pysyncobj import MEMBERSHIP
from ..log.durability import fsync_dir

__all__ = ["SnapshotFiles"]

log = logging.getLogger(__name__)
_LEN = membership.SNAPSHOT_ENTRY


class SnapshotFiles:
    """Needs of its ``RaftGroup``: ``journal``, ``state``, ``_term_at``, ``_heartbeat``,
    ``_load_members`` and the ``_pysyncobj.Engine`` interface."""

    # "<snapshot>.own" holds the last index of the snapshot this replica wrote itself; a
    # snapshot received from a leader removes it. Loaded at start, an own snapshot lets a
    # data group leave its queues closed (statemachine/queue_logs.py): they were synced
    # before it was written. Lost, stale or torn, the mark only costs opening them.
    def _mark_own(self, index: int) -> None:
        try:
            with open(self.snapshot_path + ".own", "w") as f:
                f.write(str(index))
        except OSError:
            pass

    def _is_own(self, index: int) -> bool:
        try:
            with open(self.snapshot_path + ".own") as f:
                return f.read().strip() == str(index)
        except (OSError, ValueError):
            return False

    def _install_snapshot(self, node, message):
        """Snapshot transfer from the leader, without dropping acknowledged entries.

        pysyncobj installs every snapshot it receives with a cleared journal.
        A stale "reset" reply can make the leader re-send a snapshot older
        than entries this follower already acknowledged; clearing the journal
        then loses them, exactly like a stale append. If the journal already
        holds the snapshot's last entry (same index and term) we keep it and
        acknowledge up to that entry only.
        """
        if not self.take_snapshot_part(message["serialized"]):
            self.deliver(node, self._heartbeat(message, self.raftCommitIndex))
            return None
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.snapshot_path + ".own")    # the file is the leader's now
        last_idx, last_term = self._peek_snapshot()
        if self._term_at(last_idx) == last_term:
            self.snapshot_skips += 1
            log.warning("group %d: snapshot at %d received while the journal already holds it; "
                        "keeping the journal", self.group_id, last_idx)
            self.forceLogCompaction()        # rewrite our own snapshot file soon
        else:
            try:
                self.on_load_snapshot(True)
            except Exception as e:
                if not getattr(e, "retry_later", False):
                    raise
                # The state machine could not take it yet (its catch-up from peers
                # failed: a partition, peers down). Not acknowledged: the leader
                # sends it again, and the install goes on from what it got.
                log.warning("group %d: snapshot at %d not installed yet: %s", self.group_id, last_idx, e)
                return None
        self.deliver(node, self._heartbeat(message, last_idx))
        # reset=True moves the leader's next index to just past the snapshot
        # (a plain success does not when its match index is already higher,
        # and the leader would send the same snapshot again and again).
        self.on_reply(node, True, last_idx + 1, True)
        return None

    def on_load_snapshot(self, clearJournal):
        """Load the snapshot file: state from the manifest, journal kept if it agrees.

        pysyncobj clears the journal unless its first two entries are exactly
        the snapshot's. After a crash between writing a snapshot and compacting
        the journal they are not, and the clear would drop acknowledged
        entries past the snapshot. We keep every entry from the snapshot's
        first entry on when the journal holds the snapshot's last entry.
        """
        last, prev, _ = self._read_snapshot(self.snapshot_path)
        j = self.journal
        if not clearJournal and self._term_at(last[1]) == last[2] and self._term_at(prev[1]) == prev[2]:
            j.deleteEntriesTo(prev[1] - j[0][1])
        else:
            j.clear()
            j.add(*prev)
            j.add(*last)
            j.sync()
        commit = max(min(self.raftCommitIndex, j[-1][1]), last[1])
        self.set_applied(last[1], commit)
        j.setRaftCommitIndex(commit)
        self._load_members()

    def snapshot_at_stop(self) -> bool:
        """On a graceful stop (the loop stopped: nothing ticks), write a snapshot of
        everything applied, as a log compaction would; False when there is nothing new.

        A restart then replays nothing, and a data group's queues stay closed until
        used: replaying a journal of first appends to 100,000 queues opened every
        one of them again before the node served (68 s, issue 39.5). The journal
        is left as it is: loading the snapshot drops the entries it covers."""
        applied, j = self.raftLastApplied, self.journal
        if not len(j) or applied <= self.snapshot_index + 1:
            return False
        first = j[0][1]
        if applied - 1 < first or applied > j[-1][1]:
            return False
        last, prev = j[applied - first], j[applied - 1 - first]
        cluster = {TCPNode(a) for a in [self.selfNode.address] + [n.address for n in self.otherNodes]}
        tmp = self.snapshot_path + ".tmp"
        self._write_snapshot(tmp, (last, prev, cluster))
        os.replace(tmp, self.snapshot_path)
        fsync_dir(os.path.dirname(os.path.abspath(self.snapshot_path)))
        return True

    def _peek_snapshot(self) -> tuple[int, int]:
        """(index, term) of the last entry a snapshot file covers."""
        with open(self.snapshot_path, "rb") as f:
            _, idx, term = _LEN.unpack(f.read(_LEN.size))
        return idx, term

    def _write_snapshot(self, path: str, data) -> None:
        last, prev, cluster = data
        blob = self.state.snapshot()
        # the configuration as of the snapshot's own index (membership.py)
        config = membership.rewind({n.address for n in cluster},
                                   self.journal.commands_after(last[1], MEMBERSHIP))
        with open(path, "wb") as f:
            for entry in (last, prev):
                cmd = bytes(entry[0])
                f.write(_LEN.pack(len(cmd), entry[1], entry[2]))
                f.write(cmd)
            f.write(membership.encode_config(config))
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        self._mark_own(last[1])
        self.snapshots_written += 1
        self.snapshot_index = last[1]

    def _read_snapshot(self, path: str):
        with open(path, "rb") as f:
            data = f.read()
        pos, entries = 0, []
        for _ in range(2):
            n, idx, term = _LEN.unpack_from(data, pos)
            pos += _LEN.size
            entries.append((data[pos:pos + n], idx, term))
            pos += n
        _, pos = membership.decode_config(data, pos)      # absent in snapshots written before wave 2
        leader = self.leader_node()
        self.state.restore(data[pos:], entries[0][1], leader.address if leader else None,
                           own=self._is_own(entries[0][1]))
        self.snapshot_index = entries[0][1]
        cluster = {TCPNode(a) for a in [self.selfNode.address] + [n.address for n in self.otherNodes]}
        return entries[0], entries[1], cluster
