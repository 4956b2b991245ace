"""Leader lease, leader stickiness and pre-vote, on top of pysyncobj's elections.

pysyncobj 0.3.17 lets a leader answer as leader until it notices, 30 s later
(``leaderFallbackTimeout``), that nobody replies; a node cut off from its
leader raises its term on every election timeout, and on heal that term
deposes a healthy leader. This mixin (``RaftGroup`` inherits it) adds:

* **Lease.** Every append a leader sends carries its monotonic send time
  (``lt``). A follower echoes the newest one it received in its replies; when
  a success reply waits for an fsync longer than ``loop.LEASE_ACK_AFTER``
  (50 ms), or the reply is a refusal, a small ``lease_ack`` carries the echo
  alone, so a slow disk does not cost the leader its lease. Once a majority
  (the leader counts itself) echoed a time ``t`` of the current term, no other node can become leader before
  ``t + min_timeout`` (stickiness, below): the leader holds a lease until
  ``t + LEASE_FRACTION * min_timeout``. ``read_ready`` is the check a leader
  read makes: leader, lease running, and an entry of its own term applied
  (a new leader's no-op, so everything committed before it is applied too).
  Clocks are compared only with themselves (the leader's times come back to
  it); only their rates must agree within ``1 - LEASE_FRACTION``.
* **Stickiness.** A node that heard from a leader within ``min_timeout``
  (or is a leader with a running lease) ignores vote requests: it neither
  grants nor raises its term (Raft thesis 4.2.3). A node that just started
  counts as having heard from a leader: its memory of that is gone.
  Leadership transfers (``timeout_now``) mark their vote requests and pass.
* **Pre-vote.** When its election timer fires, a node first asks whether
  it could win (``pre_vote``, term + 1, its log position) without raising
  its term; peers that heard from a leader within ``min_timeout`` or hold a
  newer log say no. Only with a majority of yeses does pysyncobj's election
  run. A node cut off from the leader therefore never raises its term, and
  rejoining does not depose anyone.
* **Hints.** ``leader_hint`` names the leader only while it is heard from;
  a follower that lost it says "unknown" rather than send clients to it.
"""
from __future__ import annotations

import itertools
import logging
import math

# pysyncobj's own clock (CLOCK_MONOTONIC_RAW on Linux), not time.monotonic: this
# module compares its times with pysyncobj's election deadlines and response times.
from pysyncobj.monotonic import monotonic as _now

from ._pysyncobj import LEADER

__all__ = ["LEASE_FRACTION", "LeaseElection"]

log = logging.getLogger(__name__)

# Of the minimum election timeout: what a lease may use of it. The rest
# covers clock-rate differences between nodes and the time a message takes.
LEASE_FRACTION = 0.8



class LeaseElection:
    """Mixin for ``RaftGroup`` (a pysyncobj ``SyncObj``); ``_init_election`` after
    ``SyncObj.__init__``, ``_election_message`` first in message dispatch,
    ``_election_tick`` first in ``_onTick``."""

    def _init_election(self, min_timeout: float, preferred: bool = False) -> None:
        self._min_timeout = min_timeout
        if preferred:
            # Preferred leader: stand first, just after the start-up stickiness
            # (min_timeout) ends, before the others' timers (min_timeout..max)
            # fire, so a cluster's leaders start spread as its placement lays
            # them out (the first replica of each group goes round the nodes).
            self.election_deadline = _now() + min_timeout * 1.05
        self._lease_span = min_timeout * LEASE_FRACTION
        self._leader_contact = _now()   # just started: as if a leader was heard now
        self._echo: tuple[int, float] | None = None     # (term, leader's stamp) last received
        self._acked: dict = {}                    # node -> (term, stamp echoed to us)
        self._prevote: tuple[int, int, set] | None = None   # (term asked for, round, nodes that said yes)
        self._prevote_won: int | None = None      # the term a won pre-vote lets this node start
        self._transfer_election = False
        self._transfer_term = -1         # a term in which this leader handed leadership on
        self._rounds = itertools.count(1)
        self.prevotes_started = 0
        self.votes_ignored = 0
        self.wrap_send(self._stamping)

    def _stamping(self, send):
        """The group's raft send, stamping appends with the leader's time (lease)."""
        def stamped(node, message):
            kind = message.get("type")
            if kind == "append_entries":
                message["lt"] = _now()
            elif kind == "request_vote" and self._transfer_election:
                message["transfer"] = True
            elif kind == "timeout_now":
                # Leadership transfer: the target may win at once (its vote requests
                # pass stickiness), so this leader's lease ends now.
                self._transfer_term = self.raftCurrentTerm
                self._acked.clear()
            return send(node, message)
        return stamped

    # ------------------------------------------------------------- lease
    def lease_expiry(self) -> float:
        """Monotonic time until which this leader's lease runs (0.0: none)."""
        if self.raft_state != LEADER or self._transfer_term == self.raftCurrentTerm:
            return 0.0
        others = self.peers
        need = (len(others) + 1) // 2          # followers needed with the leader for a majority
        if need == 0:
            return math.inf
        term = self.raftCurrentTerm
        stamps = sorted((lt for t, lt in list(self._acked.values()) if t == term), reverse=True)
        if len(stamps) < need:
            return 0.0
        return stamps[need - 1] + self._lease_span

    def read_ready(self) -> bool:
        """May this node answer a read as the leader: no newer leader can exist,
        and every entry committed before the read began is applied here."""
        if self.raft_state != LEADER or _now() >= self.lease_expiry():
            return False
        noop = self.noop_index
        return noop is not None and self.raftLastApplied >= noop

    def _contact_said(self) -> str:
        """When this replica last heard from a leader, in words (for the log)."""
        if self.raft_state == LEADER:
            return f"leader, lease {'running' if _now() < self.lease_expiry() else 'lapsed'}"
        return f"a leader last heard {_now() - self._leader_contact:.2f} s ago"

    def _heard_from_leader(self) -> bool:
        if self.raft_state == LEADER:
            return _now() < self.lease_expiry()
        return _now() - self._leader_contact < self._min_timeout

    @property
    def leader_hint(self) -> str | None:
        """The leader's raft address while it is heard from, else None."""
        if self.raft_state == LEADER:
            return self.selfNode.address
        leader = self.leader_node()
        if leader is None or _now() - self._leader_contact >= self._min_timeout:
            return None
        return leader.address

    # ---------------------------------------------------------- messages
    def _election_message(self, node, message) -> bool:
        """Our messages and rules before pysyncobj's; True if the message is consumed."""
        kind = message.get("type")
        if kind == "append_entries":
            if message["term"] < self.raftCurrentTerm:
                # pysyncobj ignores it without a word, so a leader never learns that
                # a follower's term moved on; tell it (it steps down: _adopt_term).
                self.raft_send(node, {"type": "term_ahead", "term": self.raftCurrentTerm})
                return False
            if message["term"] >= self.raftCurrentTerm:
                self._leader_contact = _now()
                self._prevote, self._prevote_won = None, None
                if "lt" in message:
                    self._echo = (message["term"], message["lt"])
            return False
        if kind == "next_node_idx" or kind == "lease_ack":
            self._note_echo(node, message)
            return kind == "lease_ack"
        if kind == "timeout_now":
            log.info("group %d: timeout_now from %s (term %s): a leadership transfer, taken if it "
                     "comes from the leader", self.group_id, getattr(node, "address", node), message.get("term"))
            return False
        if kind == "request_vote":
            if self._recovering():
                self.votes_ignored += 1
                return True
            if not message.get("transfer") and self._heard_from_leader():
                self.votes_ignored += 1
                return True
            return False
        if kind == "pre_vote":
            self._answer_prevote(node, message)
            return True
        if kind == "pre_vote_response":
            self._count_prevote(node, message)
            return True
        if kind == "term_ahead":
            self._adopt_term(message["term"])
            return True
        return False

    def _adopt_term(self, term: int) -> None:
        """A peer is in a later term: follow it (raft's rule for any message of a
        higher term), so a node whose term ran ahead is not shut out for good."""
        if term > self.raftCurrentTerm:
            log.info("group %d: a peer is in term %d (this node was in %d): following it",
                     self.group_id, term, self.raftCurrentTerm)
            self.follow_term(term)
            self._prevote, self._prevote_won = None, None

    def _note_echo(self, node, message) -> None:
        term, lt = message.get("term"), message.get("lt")
        if lt is None or term != self.raftCurrentTerm or self.raft_state != LEADER:
            return
        prev = self._acked.get(node)
        if prev is None or prev[0] != term or prev[1] < lt:
            self._acked[node] = (term, lt)
        self.note_response(node, _now())

    def send_lease_ack(self, node, term: int) -> None:
        """The echo alone, now: the reply it would ride on is held back or a refusal."""
        lt = self.echo_for(term)
        if lt is not None:
            self.raft_send(node, {"type": "lease_ack", "term": term, "lt": lt})

    def echo_for(self, term: int) -> float | None:
        """The leader stamp a success reply of ``term`` carries back."""
        echo = self._echo
        return echo[1] if echo is not None and echo[0] == term else None

    def _recovering(self) -> bool:
        """Entries this replica had were lost to bit rot (``DurableJournal.lost_through``):
        it may have acknowledged them, so until it holds them again its vote could
        elect a leader without them. It neither votes nor stands (alone it must)."""
        j = getattr(self, "journal", None)
        return (j is not None and j.lost_through > j.last_idx
                and bool(self.peers))

    def _log_position(self) -> tuple[int, int]:
        return self.last_log_term(), self.last_log_index()

    def _answer_prevote(self, node, message) -> None:
        granted = (message["term"] > self.raftCurrentTerm and not self._heard_from_leader() and not self._recovering()
                   and (message["last_log_term"], message["last_log_index"]) >= self._log_position())
        if granted:         # rare, and what a leader change after a heal is traced back to
            log.info("group %d: pre-vote for term %d granted to %s (%s; its log %s, ours %s)", self.group_id,
                     message["term"], getattr(node, "address", node), self._contact_said(),
                     (message["last_log_term"], message["last_log_index"]), self._log_position())
        self.raft_send(node, {"type": "pre_vote_response", "term": message["term"],
                              "round": message.get("round"), "granted": granted,
                              "voter_term": self.raftCurrentTerm})

    def _count_prevote(self, node, message) -> None:
        if message.get("voter_term", 0) >= message.get("term", 0):
            self._adopt_term(message["voter_term"])        # we are behind: catch up first
        pv = self._prevote
        if pv is None or (message.get("term"), message.get("round")) != pv[:2] or not message.get("granted"):
            return
        pv[2].add(node)
        if len(pv[2]) + 1 > (len(self.peers) + 1) / 2:
            log.info("group %d: pre-vote for term %d won (yes from %s)", self.group_id, pv[0],
                     ", ".join(sorted(str(getattr(n, "address", n)) for n in pv[2])))
            self._prevote, self._prevote_won = None, self.raftCurrentTerm + 1
            self.election_deadline = 0.0      # pysyncobj's election, next tick
            self.wake()

    # -------------------------------------------------------------- tick
    def _election_tick(self) -> bool:
        """Where pysyncobj's election timer would start an election this tick: a
        pre-vote round instead, unless one was just won (or a transfer asks).
        Whether pysyncobj's own election may run in this tick (``_timer_held``)."""
        self._transfer_election = False
        if self.raft_state == LEADER or self.selfNode is None:
            return True
        now = _now()
        if self.election_deadline >= now or not self.connected_to_anyone():
            return False
        if self._recovering():
            self.election_deadline = now + self.new_election_timeout()
            return False
        won = self._prevote_won == self.raftCurrentTerm + 1      # won for the term it would start
        if won or self.transfer_in_progress or not self.peers:
            if not won and self.peers:
                log.info("group %d: standing for election without a pre-vote: a leadership transfer",
                         self.group_id)
            self._transfer_election = self.transfer_in_progress
            self._prevote_won = None
            return True                           # pysyncobj elects in this tick
        self._prevote_won = None
        term = self.raftCurrentTerm + 1
        rnd = next(self._rounds)
        self._prevote = (term, rnd, set())
        self.prevotes_started += 1
        self.election_deadline = now + self.new_election_timeout()
        self.forget_leader()          # not heard from: no longer named as leader
        last_term, last_idx = self._log_position()
        for other in self.peers:
            self.raft_send(other, {"type": "pre_vote", "term": term, "round": rnd,
                                   "last_log_index": last_idx, "last_log_term": last_term})
        return False

    def _timer_held(self, base):
        """pysyncobj's tick (``base``) with its election timer held for the tick.

        pysyncobj looks at the timer again a moment after ``_election_tick`` did.
        When the timer ran out in between (the tick preempted under load), it stood
        for election without a pre-vote: a node cut off from its leader raised its
        term, and on heal that term deposed the leader (the partition harness's
        ``flap`` under two CPU burners: one heal in 16 in one run). A timer set
        meanwhile (pysyncobj's own election cannot be: it is what is held) stays."""
        def tick():
            held = self.election_deadline
            self.election_deadline = math.inf
            try:
                return base()
            finally:
                if self.election_deadline == math.inf:
                    self.election_deadline = held
        return tick
