"""What a follower does with an append, where raft's rules differ from pysyncobj's
(a mixin of ``RaftGroup``; ``group.py`` says why): entries it already holds are
skipped and only a real conflict truncates (a stale, shorter copy never does), and
a follower whose disk is below its reserve takes the bookkeeping of an append but
not its entries, the leader pausing its appends to it meanwhile; it says so again
with heartbeats, and a leader that a majority could not follow refuses writes
(``replicas_without_room``, used by ``server/writes.py``).
"""
from __future__ import annotations

import logging
import time

__all__ = ["FollowerAppends", "NO_ROOM_PAUSE"]

log = logging.getLogger(__name__)
# A follower out of disk space gets heartbeats only for this long after it said so.
NO_ROOM_PAUSE = 1.0


class FollowerAppends:
    def _no_room(self, node, message):
        """An append while the disk is below its reserve: the entries are not taken
        (and not acknowledged: the other replicas carry the group); the rest of the
        message (term, leader, commit index up to what matches) is. The leader
        sends them again, and once space is freed they are taken."""
        prev_idx = message["prevLogIdx"]
        if self._term_at(prev_idx) != message["prevLogTerm"]:
            return message                       # pysyncobj rejects it as before, writing nothing
        self.refused_appends += 1
        self._warn(f"{self.disk.shortfall()}: not taking {len(message['entries'])} entries from the leader")
        self.deliver(node, self._heartbeat(message, prev_idx))
        self.on_reply(node, False, prev_idx + 1, True)
        # The leader would send the whole backlog again with every heartbeat.
        self._say_no_room(node, message["term"])
        return None

    def _still_no_room(self, node, message) -> None:
        """A heartbeat while the disk is below its reserve: the leader hears again, at
        most every third of ``NO_ROOM_PAUSE``, that this replica takes no entries, so
        it knows before it sends any and refuses writes that could not reach a
        majority (``replicas_without_room``) instead of taking them into its journal."""
        if time.monotonic() - self._no_room_said >= NO_ROOM_PAUSE / 3:
            self._say_no_room(node, message["term"])

    def _say_no_room(self, node, term: int) -> None:
        self._no_room_said = time.monotonic()
        self.raft_send(node, {"type": "no_room", "term": term, "why": self.disk.shortfall()})

    def replicas_without_room(self) -> dict:
        """Leader: the followers that said within ``NO_ROOM_PAUSE`` that their disk is
        below its reserve (raft address -> what they said)."""
        now = time.monotonic()
        voters = self.peers
        return {n.address: self._no_room_why[n] for n, until in list(self._no_room_until.items()) if until > now and n in voters}

    def on_send_appends(self, base):
        """Appends, except that a follower which said it has no room (``_no_room``) gets
        only a heartbeat for ``NO_ROOM_PAUSE`` s: its entries go again after that."""
        now = time.monotonic()
        nxt = self.next_index
        paused = [n for n, until in self._no_room_until.items() if until > now and n in nxt]
        if not paused:
            return base()
        end = self.last_log_index() + 1
        saved = {n: nxt[n] for n in paused}
        for n in paused:
            nxt[n] = end
        try:
            return base()
        finally:
            for n in paused:
                if nxt.get(n) == end:
                    nxt[n] = saved[n]

    @staticmethod
    def _heartbeat(message: dict, commit_cap: int) -> dict:
        """The bookkeeping part of an append (term, leader, timers), commit capped."""
        beat = {k: v for k, v in message.items()
                if k not in ("prevLogIdx", "prevLogTerm", "entries", "serialized")}
        beat["commit_index"] = min(message["commit_index"], commit_cap)
        return beat

    def _term_at(self, idx):
        j = self.journal
        first = j[0][1]
        if idx is None or idx < first or idx > j[-1][1]:
            return None
        return j[idx - first][2]

    def _reconcile_append(self, node, message):
        """Raft's append rule on top of pysyncobj's (see module docstring)."""
        entries = message.get("entries") or []
        prev_idx = message["prevLogIdx"]
        if self._term_at(prev_idx) != message["prevLogTerm"]:
            return message                       # pysyncobj rejects it as before
        last = self.journal[-1][1]
        k = 0
        while k < len(entries) and entries[k][1] <= last and self._term_at(entries[k][1]) == entries[k][2]:
            k += 1
        matched_idx = entries[k - 1][1] if k else prev_idx
        matched_term = entries[k - 1][2] if k else message["prevLogTerm"]
        if k < len(entries) or matched_idx == last:
            # New entries or a real conflict follow matched_idx: pysyncobj's
            # truncation there is the raft rule. Drop the entries we hold.
            if k == 0:
                return message
            return dict(message, entries=entries[k:], prevLogIdx=matched_idx, prevLogTerm=matched_term)
        # We hold entries past everything this message covers: it is stale.
        self.stale_appends += 1
        log.warning("group %d: stale append (prev %d, %d entries) while holding up to %d; "
                    "not truncating", self.group_id, prev_idx, len(entries), last)
        self.deliver(node, self._heartbeat(message, matched_idx))
        self.on_reply(node, False, matched_idx + 1, True)
        return None
