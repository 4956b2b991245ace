"""The placement controller: RIP-20's nameserver role, on the metadata leader.

Every second, on the node that leads the metadata group, it looks at the
record (``MetaState``: nodes and each data group's wanted replicas) and at
what every node reports (``GetNodeStatus``: the groups it holds, their
voters as each leader sees them, applied indexes), and takes the next step
towards the record, then plans new steps. Everything it knows is in the
record or asked again, so a new metadata leader takes over mid-move.

Moving a group's replica from node F to node T (one membership change at a
time; ``raft/membership.py``):

1. plan: the record's replicas of the group become ``... T`` instead of
   ``... F`` (``SetReplicas``, applied only if the record did not change);
2. T's node sees itself in the record and opens an empty replica from the
   group's configuration as of its commit index (``replicas.py``);
3. the group's leader adds T as a voter (``ChangeReplicas``); T catches up
   from the leader (a snapshot, then the payloads from peers) and entries;
4. once T has applied up to the leader's commit index: if F leads the
   group, the leadership moves to a caught-up replica (``TransferLeader``);
   then the leader removes F;
5. F's node sees itself out of the record and out of the leader's voters,
   and drops its replica.

When F is down, step 4's removal comes first (a group of three with one
voter down and an empty one added could not commit until the new one caught
up). What is planned:

* replicas on a node being decommissioned (``leaving``) or down for longer
  than ``repair_after`` move to the live active node with the fewest
  replicas (ties: fewest leaders, then address), in the rack holding fewest
  of the group's other replicas (``racks.py``);
* a group with fewer than RF replicas gets one more;
* a group with more replicas in one rack than the rack rule allows (racks
  named at start, a rack back from being down) moves one to another rack;
  rebalancing moves never break the rule;
* after ``rmq cluster rebalance``: new data groups while the cluster holds
  fewer replicas per node than at its first start (``plan_growth``; new
  queues go to them, the groups holding fewest), then one replica from the
  node with the most to the one with the fewest while they differ by more
  than one, then the same with leaderships (``TransferLeader``), then data:
  a bigger group's replica from the node holding the most bytes to the one
  holding the fewest and a smaller one's back (``plan_swap``);
* a leaving node that holds nothing more is taken out of the metadata
  group and recorded ``removed``.

At most ``max_moves`` groups are in flight at once.
"""
from __future__ import annotations

import logging
import math
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import grpc

from ..proto import rmq_pb2
from ..protocol.placement import META_GROUP, raft_address
from ..statemachine.commands import RequestRebalance, SetNode, SetRack, SetReplicas
from ..protocol.errors import NotLeader, ServiceError
from .racks import Racks

__all__ = ["Controller", "ClusterView", "group_bytes", "plan_growth", "plan_move", "plan_rebalance", "plan_swap"]

log = logging.getLogger(__name__)

CATCH_UP_ENTRIES = 50     # an added voter within this many entries of the commit index counts as caught up


@dataclass
class ClusterView:
    """One pass's picture: the record and what the live nodes report."""
    nodes: dict                       # address -> record {"state", "id", ...}
    record: dict                      # data group -> wanted replicas
    status: dict                      # address -> NodeStatus of nodes that answered
    down: set = field(default_factory=set)        # recorded nodes down past repair_after

    def group_report(self, g: int):
        """(leader address, its GroupStatus) of group g as its leader reports it, or (None, None)."""
        for addr, st in self.status.items():
            for gs in st.groups:
                if gs.group == g and gs.leader == addr:
                    return addr, gs
        return None, None

    def applied(self, addr: str, g: int) -> int:
        st = self.status.get(addr)
        if st is None:
            return -1
        return next((gs.applied_index for gs in st.groups if gs.group == g), -1)

    def usable(self) -> list[str]:
        """Nodes new replicas may go to: active, answering."""
        return sorted(a for a, rec in self.nodes.items() if rec.get("state") == "active" and a in self.status)

    def racks(self) -> Racks:
        return Racks(self.nodes, self.usable())

    def node_bytes(self) -> dict:
        """Segment bytes each usable node reports for the data groups it holds."""
        out = dict.fromkeys(self.usable(), 0)
        for a, st in self.status.items():
            if a in out and st is not None:
                out[a] = sum(gs.bytes for gs in st.groups if gs.group != META_GROUP)
        return out

    def load(self) -> tuple[dict, dict]:
        """(replicas, leaders) per usable node, from the record and the reports."""
        replicas = {a: 0 for a in self.usable()}
        leaders = dict.fromkeys(replicas, 0)
        for reps in self.record.values():
            for a in reps:
                if a in replicas:
                    replicas[a] += 1
        for a, st in self.status.items():
            if a in leaders:
                leaders[a] = sum(1 for gs in st.groups if gs.group != META_GROUP and gs.leader == a)
        return replicas, leaders


def plan_move(view: ClusterView, g: int, rf: int) -> list[str] | None:
    """The group's next wanted replicas, or None if it needs no move."""
    reps = list(view.record[g])
    usable = view.usable()
    replicas, leaders = view.load()
    size = view.node_bytes()
    racks = view.racks()

    def key(a: str) -> tuple:
        # fewest replicas; then fewest bytes (a move costs data, a leadership does not)
        return replicas[a], size[a], leaders[a], a

    bad = [a for a in reps if view.nodes.get(a, {}).get("state") != "active" or a in view.down]
    if bad:
        target = racks.choose([a for a in usable if a not in reps], [a for a in reps if a != bad[0]], key)
        if target is None:
            return None
        return [target if a == bad[0] else a for a in reps]
    if len(reps) < min(rf, len(usable)):
        target = racks.choose([a for a in usable if a not in reps], reps, key)
        return reps + [target] if target else None
    return racks.fix(reps, key)          # a rack holding more of it than the rule allows


def plan_growth(view: ClusterView, density: float, rf: int) -> tuple[int, list[str]] | None:
    """(number, replicas) of a data group to add, or None: the cluster keeps the
    replicas per node it started with (``density``), so as nodes join, groups are
    added (new queues go to them: they hold the fewest). A new group's replicas are
    the least loaded nodes, the one leading fewest first (its preferred leader)."""
    usable = view.usable()
    if not density or not usable:
        return None
    rf = min(rf, len(usable))
    want = math.ceil(density * len(usable) / rf - 1e-9)
    if len(view.record) >= want:
        return None
    replicas, leaders = view.load()
    reps = view.racks().pick(rf, lambda a: (replicas[a], leaders[a], a))
    reps.sort(key=lambda a: (leaders[a], replicas[a], a))
    return max(view.record, default=0) + 1, reps


def plan_rebalance(view: ClusterView) -> tuple[str, int, object] | None:
    """The next step towards even load, or None when balanced: ("replicas", g, the
    group's new replicas) moves one replica from a node with more to one with at
    least two fewer (the fullest and emptiest first); then ("leader", g, node)
    moves one leadership (see _leader_step)."""
    replicas, leaders = view.load()
    size = view.node_bytes()
    racks = view.racks()
    for donor in sorted(replicas, key=lambda a: (-replicas[a], -size[a], a)):
        for taker in sorted(replicas, key=lambda a: (replicas[a], size[a], a)):
            if replicas[donor] - replicas[taker] <= 1:
                break
            for g in sorted(view.record):
                reps = view.record[g]
                want = [taker if a == donor else a for a in reps]
                if donor in reps and taker not in reps and racks.keeps(reps, want):
                    return "replicas", g, want
    step = _leader_step(view, leaders)
    return ("leader", *step) if step is not None else None


def _leader_step(view: ClusterView, leaders: dict) -> tuple[int, str] | None:
    """(group, new leader) of one leadership move towards even leaders, or None.

    The node leading most looks for one leading at least two fewer along a chain
    "x leads g, y is a replica of g" through nodes leading fewer than it (a
    direct move may not exist: none of its groups has a replica on the emptiest
    node). The chain's last hop goes first, so no node ever leads more than the
    donor; the next pass finds the same chain one hop shorter. No chain from any
    node means no single leadership move can even the leaders out further."""
    led = {g: view.group_report(g)[0] for g in view.record}
    for donor in sorted(leaders, key=lambda a: (-leaders[a], a)):
        came_from = {donor: None}
        frontier = [donor]
        while frontier:
            nxt = []
            for x in frontier:
                for g in sorted(view.record):
                    if led[g] != x:
                        continue
                    for y in sorted(view.record[g]):
                        if y in came_from or y not in leaders or leaders[y] >= leaders[donor]:
                            continue
                        came_from[y] = (x, g)
                        if leaders[donor] - leaders[y] >= 2:
                            return g, y          # the chain's last hop: x hands g to y
                        nxt.append(y)
            frontier = nxt
    return None


def group_bytes(view: ClusterView) -> dict[int, int]:
    """Each data group's segment bytes, the most any of its replicas reports."""
    out: dict[int, int] = {}
    for st in view.status.values():
        if st is None:
            continue
        for gs in st.groups:
            if gs.group != META_GROUP:
                out[gs.group] = max(out.get(gs.group, 0), gs.bytes)
    return out


def plan_swap(view: ClusterView, sizes: dict[int, int], spread: float = 0.1) -> list | None:
    """Two moves that even out data between the node holding the most bytes and the
    one holding the fewest without changing how many replicas either holds: a
    bigger group's replica from the heavy node to the light one and a smaller
    one's back ([(group, replicas), (group, replicas)]), or None. Only while the
    two differ by more than ``spread`` of the mean, and with a pair that closes
    a tenth of their gap or more, the one that brings them closest to even;
    each swap lowers the spread, so a rebalance ends."""
    weight = view.node_bytes()
    usable = [a for a in weight]
    if len(usable) < 2:
        return None
    mean = sum(weight.values()) / len(usable)
    heavy = max(usable, key=lambda a: (weight[a], a))
    light = min(usable, key=lambda a: (weight[a], a))
    gap = weight[heavy] - weight[light]
    if mean <= 0 or gap <= spread * mean:
        return None
    swap = lambda g, a, b: [b if x == a else x for x in view.record[g]]     # noqa: E731
    racks = view.racks()
    give = [g for g, r in view.record.items() if heavy in r and light not in r
            and racks.keeps(r, swap(g, heavy, light))]
    take = [g for g, r in view.record.items() if light in r and heavy not in r
            and racks.keeps(r, swap(g, light, heavy))]
    best = None
    for g1 in give:
        for g2 in take:
            d = sizes.get(g1, 0) - sizes.get(g2, 0)
            if gap / 20 <= d < gap and (best is None or abs(gap / 2 - d) < abs(gap / 2 - best[0])):
                best = (d, g1, g2)
    if best is None:
        return None
    _, g1, g2 = best
    return [(g1, swap(g1, heavy, light)), (g2, swap(g2, light, heavy))]


class Controller:
    def __init__(self, node, repair_after: float = 300.0, max_moves: int = 2, interval: float = 1.0):
        self.node = node
        self.repair_after = repair_after
        self.max_moves = max_moves
        self.interval = interval
        self._last_seen: dict[str, float] = {}
        self._since = time.monotonic()
        self.doing = ""                  # what the last pass did (ClusterStatus shows it)

    @property
    def rf(self) -> int:
        return self.node.config.replication

    def run(self, stopping) -> None:
        while not stopping.wait(self.interval):
            try:
                self.doing = self.pass_once() or ""
            except (NotLeader, ServiceError, grpc.RpcError) as e:
                log.info("controller: %s", getattr(e, "message", None) or e)
            except Exception:
                log.exception("controller pass failed")

    # ------------------------------------------------------------------ view
    def view(self) -> ClusterView:
        nodes, record = self.node.meta.placement()
        asked = {a: self.node.stub(a).GetNodeStatus.future(rmq_pb2.NodeStatusRequest(), timeout=1.0)
                 for a, rec in nodes.items() if rec.get("state") != "removed"}
        status, now = {}, time.monotonic()
        for a, fut in asked.items():
            try:
                status[a] = fut.result(timeout=1.5)
                self._last_seen[a] = now
            except (grpc.RpcError, grpc.FutureTimeoutError, FutureTimeout):
                fut.cancel()             # down, cut off or paused: not seen this pass
        down = {a for a in asked if a not in status
                and now - self._last_seen.get(a, self._since) > self.repair_after}
        self._record_racks(nodes, status)
        return ClusterView(nodes, record, status, down)

    def _record_racks(self, nodes: dict, status: dict) -> None:
        """A node's rack as it reports it (``--rack``) goes into the record: placement
        then knows it also while the node is down."""
        for a, st in status.items():
            if st.rack != nodes[a].get("rack", ""):
                try:
                    self.node.meta_command(SetRack(a, st.rack))
                except ServiceError as e:
                    log.info("controller: rack of %s not recorded: %s", a, e.message)
                    continue
                log.info("controller: node %s is in rack %r", a, st.rack)
                nodes[a]["rack"] = st.rack

    # ------------------------------------------------------------------ pass
    def pass_once(self) -> str:
        if not self.node.groups[0].is_leader:
            self._since = time.monotonic()      # a new leader gives nodes the full repair time
            return ""
        view = self.view()
        in_flight = []
        for g in sorted(view.record):
            leader, gs = view.group_report(g)
            if gs is None:
                continue
            if set(gs.replicas) != set(view.record[g]):
                in_flight.append(g)
                self._step(view, g, leader, gs)
        planned = 0
        for g in sorted(view.record):
            if len(in_flight) + planned >= self.max_moves:
                break
            if g in in_flight:
                continue
            want = plan_move(view, g, self.rf)
            if want is not None and self._set(g, want, view.record[g]):
                view.record[g] = want           # the next plan counts this one's load
                planned += 1
        if not in_flight and not planned:
            if self._rebalance(view):
                return "rebalancing"
            self._finish_leaving(view)
        return f"{len(in_flight) + planned} group(s) moving" if in_flight or planned else ""

    def _set(self, g: int, want: list[str], was: list[str]) -> bool:
        try:
            self.node.meta_command(SetReplicas(g, tuple(want), tuple(was)))
        except ServiceError as e:
            log.info("controller: group %d not moved: %s", g, e.message)
            return False
        log.info("controller: group %d: replicas %s -> %s", g, was, want)
        return set(was) != set(want)

    def _ask(self, leader: str, method: str, request):
        return getattr(self.node.stub(leader), method)(request, timeout=self.node.config.commit_timeout + 2)

    def _step(self, view: ClusterView, g: int, leader: str, gs) -> None:
        """One step of group g towards its record (see the module docstring)."""
        wanted, voters = list(view.record[g]), list(gs.replicas)
        adds = [a for a in wanted if a not in voters]
        removes = [a for a in voters if a not in wanted]
        dead = [a for a in removes if a not in view.status]
        if dead and leader not in dead:
            self._ask(leader, "ChangeReplicas", rmq_pb2.ChangeReplicasRequest(group=g, remove=dead[0]))
            return
        if adds:
            target = adds[0]
            if view.applied(target, g) < 0:
                return                   # its node has not opened the replica yet (or is down)
            self._ask(leader, "ChangeReplicas", rmq_pb2.ChangeReplicasRequest(group=g, add=target))
            return
        if not removes:
            return
        lagging = [a for a in wanted if a in view.status and view.applied(a, g) < gs.commit_index - CATCH_UP_ENTRIES]
        if lagging:
            return                       # an added voter is still catching up
        gone = removes[0]
        if gone == leader:
            to = max((a for a in wanted if a in view.status), key=lambda a: view.applied(a, g), default=None)
            if to is not None:
                self._ask(leader, "TransferLeader", rmq_pb2.TransferLeaderRequest(group=g, to=to))
            return
        self._ask(leader, "ChangeReplicas", rmq_pb2.ChangeReplicasRequest(group=g, remove=gone))
        if gone in view.status:
            try:
                self.node.stub(gone).DropReplica(rmq_pb2.DropReplicaRequest(group=g), timeout=10)
            except grpc.RpcError as e:
                log.info("controller: %s keeps group %d for now (%s); it drops it itself", gone, g, e.details())

    # ------------------------------------------------------------- rebalance
    def _rebalance(self, view: ClusterView) -> bool:
        """One rebalancing step if one was asked for and is not done; False when balanced."""
        meta = self.node.meta
        if meta.rebalance <= meta.rebalanced:
            return False
        if any(view.group_report(g)[0] is None for g in view.record):
            return True                  # a group without a leader yet (a new one): count it once it has one
        grow = plan_growth(view, meta.density, self.rf)
        if grow is not None:
            g, reps = grow
            self.node.meta_command(SetReplicas(g, tuple(reps), ()))
            log.info("controller: new data group %d on %s", g, reps)
            return True
        step = plan_rebalance(view)
        if step is None:
            swap = plan_swap(view, group_bytes(view))
            if swap is None:
                return self._rebalanced(meta.rebalance)
            for g, want in swap:           # both at once: counts never drift in between
                self._set(g, want, view.record[g])
            return True
        kind, g, target = step
        if kind == "replicas":
            return self._set(g, target, view.record[g])
        leader, _ = view.group_report(g)
        self._ask(leader, "TransferLeader", rmq_pb2.TransferLeaderRequest(group=g, to=target))
        return True

    def _rebalanced(self, index: int) -> bool:
        self.node.meta_command(RequestRebalance(self.node.now_ms(), done=index))
        log.info("controller: rebalance %d done", index)
        return False

    # ------------------------------------------------------------- leaving
    def _finish_leaving(self, view: ClusterView) -> None:
        """A leaving node that holds no data group any more is recorded ``removed``
        (while still a metadata voter, so it learns it and stops answering), then,
        once it applied that (or is down), taken out of the metadata group."""
        meta = self.node.groups[META_GROUP]
        for a, rec in view.nodes.items():
            state = rec.get("state")
            if state == "leaving":
                if any(a in reps for reps in view.record.values()) or any(
                        a in gs.replicas for st in view.status.values() for gs in st.groups
                        if gs.group != META_GROUP and gs.leader == st.address):
                    continue             # the record or a group's leader still counts it
                self.node.meta_command(SetNode(a, "removed", self.node.now_ms()))
                log.info("controller: node %s holds no replica any more: removed", a)
            elif state == "removed" and raft_address(a) in meta.members:
                st = view.status.get(a)
                if st is not None and view.applied(a, META_GROUP) < rec.get("index", 0):
                    continue             # it has not learnt it was removed yet
                if a == self.node.config.address:
                    # This node, removed, still leads the metadata group: hand it on, straight
                    # to raft (its RPC handlers refuse everything now, transfer_leader too).
                    others = [x for x in view.status if x != a and view.nodes.get(x, {}).get("state") == "active"]
                    if others and not meta.transfer_to(raft_address(others[0])):
                        log.info("controller: %s did not take the metadata group over yet", others[0])
                    return
                self.node.change_replicas(META_GROUP, remove=a)
                log.info("controller: node %s left the metadata group", a)
