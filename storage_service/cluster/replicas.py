"""The replicas a node holds, and the cluster changes it carries out (a mixin of
``StorageNode``).

Placement is recorded by the metadata group (``MetaState.replicas``: each data
group's wanted replicas; ``MetaState.nodes``: the cluster's nodes). Each node
follows the record on its own (``_reconcile``, every second): it opens a
replica the record gives it, starting from the group's configuration as of
its commit index (raft/membership.py), and drops one the record took away
once the group's leader no longer counts it. The controller (controller.py,
on the metadata leader) changes the record and asks groups' leaders to change
their membership (``change_replicas``, ``transfer_leader``), one change at a
time per group.
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time

import grpc

from ..proto import rmq_pb2
from ..protocol.placement import META_GROUP, grpc_address, raft_address
from ..raft.group import RaftGroup
from ..statemachine.commands import RequestRebalance, SetNode, SetPlacement, SetReplicas
from .racks import Racks
from ..protocol.errors import NotLeader, ServiceError, invalid, not_found
from .peers import ask_group

__all__ = ["ReplicaSet"]

log = logging.getLogger(__name__)

RECONCILE_S = 1.0


class ReplicaSet:
    # ---------------------------------------------------------------- reading
    def replicas_of(self, group: int) -> list[str]:
        """gRPC addresses of the group's replicas: as the metadata group recorded them,
        else as this node started with them."""
        if group == META_GROUP:
            return [grpc_address(m) for m in self.groups[META_GROUP].members]
        return self.meta.replicas_of(group) or list(self.layout.get(group, ()))

    def cluster_nodes(self) -> list[str]:
        """The cluster's nodes (gRPC addresses) but those removed: as recorded, else as
        this node started with them."""
        nodes = self.meta.placement()[0]
        live = [a for a, rec in sorted(nodes.items(), key=lambda kv: kv[1].get("id", 0))
                if rec.get("state") != "removed"]
        return live or list(self.config.addresses)

    def check_member(self) -> None:
        """UNAVAILABLE once this node was removed from the cluster: its metadata replica
        no longer follows the cluster, so it must not answer for it."""
        if self.meta.node_state(self.config.address) == "removed":
            raise ServiceError(grpc.StatusCode.UNAVAILABLE,
                               f"node {self.config.address} was removed from the cluster (rmq cluster "
                               "decommission): ask the other nodes; it can be stopped")

    def hosted(self, group: int) -> RaftGroup:
        """This node's replica of ``group``; NotLeader naming one that has it if there is none here."""
        self.check_member()
        raft = self.groups.get(group)
        if raft is None:
            others = [a for a in self.replicas_of(group) if a != self.config.address]
            raise NotLeader(group, others[0] if others else None,
                            f"node {self.config.address} holds no replica of group {group}")
        return raft

    # -------------------------------------------------------- following the record
    def _reconcile(self) -> None:
        wait = 0.05
        while not self._stopping.wait(wait):
            # quickly until the placement is recorded (a node serves only then), then every second
            wait = RECONCILE_S if self.meta.replicas else 0.05
            try:
                self.reconcile_once()
            except (NotLeader, ServiceError) as e:
                log.debug("placement pass: %s", e)
            except Exception:
                log.exception("placement pass failed")

    def reconcile_once(self) -> None:
        """Record the starting placement once (on the metadata leader); open the
        replicas the record gives this node, drop those it took away."""
        if self.groups[META_GROUP].is_leader:
            self.record_initial_placement()
        me = self.config.address
        for g, replicas in self.meta.placement()[1].items():
            if me in replicas and g not in self.groups:
                self._join_group(g, [a for a in replicas if a != me])
            elif me not in replicas and g in self.groups:
                self.drop_replica(g)

    def record_initial_placement(self) -> None:
        """On the metadata leader: record the founding placement if none is yet."""
        if not self.meta.replicas and not self.config.join:
            self.meta_command(SetPlacement(tuple(self.config.addresses), self.layout, init=True))

    def _join_group(self, g: int, others: list[str]) -> None:
        founding = self.meta.founding_replicas(g)
        if self.config.address in founding and not os.path.isdir(
                os.path.join(self.config.data_dir, f"group-{g}")):
            # A group added as the cluster grew: its founding replicas start it
            # together, from its first configuration (index 0).
            log.info("founding group %d with %s", g, founding)
            self.raft_loop.call(lambda: self._open_group(g, founding, 0))
            return
        info, _ = ask_group(self.stub, others, "GroupInfo", rmq_pb2.GroupInfoRequest(group=g))
        log.info("opening a replica of group %d: voters %s as of index %d", g, list(info.replicas),
                 info.commit_index)
        self.raft_loop.call(lambda: self._open_group(g, list(info.replicas), info.commit_index))

    def drop_replica(self, g: int) -> bool:
        """Close and delete this node's replica of data group ``g`` once the record
        and the group's leader both leave it out; False if there is none here."""
        if g == META_GROUP:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION, "the metadata group's replica is not dropped")
        me = self.config.address
        if me in self.meta.replicas_of(g):
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"group {g}: the placement record still names {me} as a replica")
        if g not in self.groups:
            return False
        others = [a for a in self.replicas_of(g) if a != me]
        info, _ = ask_group(self.stub, others, "GroupInfo", rmq_pb2.GroupInfoRequest(group=g))
        if me in info.replicas:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"group {g}: its leader still counts {me} as a voter")
        with self._drop_lock:
            raft = self.groups.get(g)
            if raft is None:
                return False
            self.committers[g].stop()
            self.groups = {k: v for k, v in self.groups.items() if k != g}
            self.states = {k: v for k, v in self.states.items() if k != g}
            self.committers = {k: v for k, v in self.committers.items() if k != g}
            self.raft_loop.call(raft.close)
            path = os.path.join(self.config.data_dir, f"group-{g}")
            trash = os.path.join(self.config.data_dir, f".dropped-group-{g}-{int(time.time() * 1000)}")
            os.rename(path, trash)          # atomic: a restart never opens half a replica
            shutil.rmtree(trash, ignore_errors=True)
        log.info("dropped the replica of group %d (moved to %s)", g, ", ".join(info.replicas))
        return True

    # -------------------------------------------------- asked of a group's leader
    def group_info(self, g: int) -> rmq_pb2.GroupStatus:
        """The group's voters as of its commit index, from its leader."""
        raft = self.require_leader(g)
        members, commit = self.raft_loop.call(raft.config_at_commit)
        return rmq_pb2.GroupStatus(group=g, leader=self.config.address, commit_index=commit,
                                   applied_index=raft.raftLastApplied, term=raft.raftCurrentTerm,
                                   replicas=[grpc_address(m) for m in members])

    def change_replicas(self, g: int, add: str = "", remove: str = "") -> list[str]:
        """Add or remove one voter of group ``g`` (this node leads it); its voters after."""
        raft = self.require_leader(g)
        if bool(add) == bool(remove):
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "give one of add or remove")
        target = raft_address(add or remove)
        if (add and target in raft.members) or (remove and target not in raft.members):
            return [grpc_address(m) for m in raft.members]          # done already
        self._check_change_recorded(g, add, remove)
        if remove == self.config.address:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"group {g}: {remove} leads it; transfer the leadership before removing it")
        done, box = threading.Event(), []
        (raft.add_member if add else raft.remove_member)(target, lambda res, err: (box.append(err), done.set()))
        if not self._await(raft, done.wait):
            raise ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED, f"group {g}: membership change not committed "
                                                                  f"within {self.config.commit_timeout}s")
        if box[0] != 0:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"group {g}: membership change refused (reason {box[0]}): another change is "
                               "not committed yet, or the leader is new; retry")
        log.info("group %d: %s %s", g, "added" if add else "removed", add or remove)
        return [grpc_address(m) for m in raft.members]

    def _check_change_recorded(self, g: int, add: str, remove: str) -> None:
        """A voter change must follow the record (what the controller asks): a data
        group's new voter is one of its recorded replicas and a removed one is not;
        the metadata group takes active nodes (a join) and lets removed ones go."""
        who = add or remove
        if g == META_GROUP:
            state = self.meta.node_state(who)
            ok = state == "active" if add else state in ("removed", "")
            why = f"node {who} is {state or 'not in the cluster'}"
        else:
            named = who in self.meta.replicas_of(g)
            ok = named if add else not named
            why = f"the placement record {'does not name' if add else 'still names'} {who} for group {g}"
        if not ok:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"group {g}: {'adding' if add else 'removing'} {who} refused: {why} "
                               "(replicas move through rmq cluster move / rebalance / decommission)")

    def transfer_leader(self, g: int, to: str) -> str:
        raft = self.require_leader(g)
        if raft_address(to) not in raft.members or to == self.config.address:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"group {g}: {to} is not another voter of it")
        if not raft.transfer_to(raft_address(to)):
            raise ServiceError(grpc.StatusCode.UNAVAILABLE,
                               f"group {g}: {to} did not take the leadership over in time; retry")
        return to

    def join(self, address: str) -> tuple[list[str], int]:
        """A new node at ``address`` joins (this node leads the metadata group):
        recorded, then made a voter of the metadata group. Its voters as of the commit
        index (the new node starts its metadata replica from them)."""
        raft = self.require_leader(META_GROUP)
        host, port = address.rsplit(":", 1)
        try:                             # a joining node listens on its raft port before it asks
            socket.create_connection((host, int(port) + 1), timeout=2).close()
        except OSError as e:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"node {address} cannot join: its raft port {host}:{int(port) + 1} does not "
                               f"answer ({e.strerror or e}); start it with rmq-storage node --listen "
                               f"{address} --join ...") from None
        self.record_initial_placement()
        self.meta_command(SetNode(address, "active", self.now_ms()))
        self.change_replicas(META_GROUP, add=address)
        members, commit = self.raft_loop.call(raft.config_at_commit)
        return [grpc_address(m) for m in members], commit

    def cluster_command(self, action: str, node: str, group: int = 0, to: str = "",
                        ignore_racks: bool = False) -> str:
        """``rmq cluster rebalance`` / ``decommission NODE`` / ``move GROUP NODE TO``
        (this node leads the metadata group). A decommission that would leave fewer
        racks than a group has replicas is refused unless ``ignore_racks``."""
        self.require_leader(META_GROUP)
        now = self.now_ms()
        if action == "rebalance":
            index = self.meta_command(RequestRebalance(now))
            return f"rebalance {index} asked: replicas, then leaders, move until nodes differ by at most one"
        if action == "move":
            return self._move(group, node, to)
        if action != "decommission":
            raise invalid(f"action {action!r}: allowed decommission, move, rebalance")
        nodes, record = self.meta.placement()
        if node not in nodes:
            raise not_found(f"node {node!r} is not in the cluster; nodes: {', '.join(sorted(nodes))}")
        if nodes[node].get("state") == "removed":
            return f"node {node} was removed already"
        stay = [a for a, rec in nodes.items() if a != node and rec.get("state") == "active"]
        need = max(len(r) for r in record.values()) if record else 1
        if len(stay) < need:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"decommissioning {node} would leave {len(stay)} active node(s) for groups of "
                               f"{need} replicas; add a node first (rmq-storage node --join)")
        why = Racks(nodes, [a for a, rec in nodes.items() if rec.get("state") == "active"]).after_leaving(node, need)
        if why and not ignore_racks:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"decommissioning {node} would break the rack spread: {why}; add a node to "
                               f"that rack first (rmq-storage node --rack ... --join), or decommission with "
                               f"--ignore-racks")
        self.meta_command(SetNode(node, "leaving", now))
        held = sum(node in r for r in record.values())
        return f"node {node} is leaving: its {held} replica(s) move to other nodes, then it leaves the cluster"

    def _move(self, g: int, node: str, to: str) -> str:
        """Record that ``to`` takes ``node``'s replica of group ``g`` (the controller moves it)."""
        nodes, record = self.meta.placement()
        if g not in record:
            raise invalid(f"group {g}: this cluster's data groups are {min(record)}..{max(record)}")
        reps = record[g]
        if node not in reps:
            raise invalid(f"group {g}: {node!r} holds no replica of it (its replicas: {', '.join(reps)})")
        if to in reps:
            raise invalid(f"group {g}: {to} holds a replica of it already")
        if nodes.get(to, {}).get("state") != "active":
            raise invalid(f"node {to!r} is not an active node of the cluster; nodes: "
                          + ", ".join(a for a, r in sorted(nodes.items()) if r.get("state") == "active"))
        want = [to if a == node else a for a in reps]
        self.meta_command(SetReplicas(g, tuple(want), tuple(reps)))
        return f"group {g}: {to} takes {node}'s replica (replicas {', '.join(want)})"
