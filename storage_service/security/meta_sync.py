"""A secured node's view of the metadata group: its security settings, and how it
makes sure ACL and principal changes hold on every node (``security/authz.py``).

A mixin of ``StorageNode`` (its ``groups``, ``stub``, ``leader_of``, ``replicas_of``).
"""
from __future__ import annotations

import time

import grpc

from ..proto import rmq_pb2
from ..protocol.placement import META_GROUP
from ..security.certs import certificate_common_name
from ..security.tokens import TokenKeys
from .authz import SecurityConfig

__all__ = ["MetaSync", "security_config"]


def security_config(config) -> SecurityConfig:
    """A node's ``SecurityConfig`` from its ``NodeConfig`` (node names default to its
    own certificate's common name; the token secret is read here, once)."""
    names = frozenset(config.node_names) or (
        frozenset({certificate_common_name(config.tls.cert)}) if config.tls is not None else frozenset())
    return SecurityConfig(
        authorize=config.authorize, tls=config.tls is not None,
        token_keys=TokenKeys.from_file(config.token_secret_file) if config.token_secret_file else None,
        superusers=frozenset(config.superusers), node_names=names)


class MetaSync:
    """Catching up with the metadata leader before a denial, and confirming that
    every metadata replica applied a change before answering it."""

    def meta_sync(self, timeout: float = 2.0) -> None:
        """Wait until this node has applied what the metadata leader had committed when
        asked (a no-op on the leader): an ACL or principal made there a moment ago then
        holds here too (``authz.Gate`` calls this before denying). A sync that started
        after this call was made covers it; after a failed one (leader unreachable) none
        is tried for a second, so denials never queue up behind a dead leader."""
        raft = self.groups.get(META_GROUP)
        if raft is None or raft.is_leader:
            return
        asked = time.monotonic()
        with self._meta_sync_lock:
            if self._meta_synced >= asked or asked - self._meta_sync_failed < 1.0:
                return
        leader = self.leader_of(META_GROUP)
        if not leader or leader == self.config.address:
            return
        started = time.monotonic()
        try:
            commit = self.stub(leader).GroupInfo(rmq_pb2.GroupInfoRequest(group=META_GROUP),
                                                 timeout=timeout).commit_index
        except grpc.RpcError:
            with self._meta_sync_lock:
                self._meta_sync_failed = time.monotonic()
            return
        deadline = time.monotonic() + timeout
        while raft.raftLastApplied < commit and time.monotonic() < deadline:
            time.sleep(0.005)
        if raft.raftLastApplied >= commit:
            with self._meta_sync_lock:
                self._meta_synced = max(self._meta_synced, started)

    def await_meta_applied(self, timeout: float = 3.0) -> list[str]:
        """On the metadata leader, after a change it applied: wait until every node of
        the metadata group applied as far (a revoked ACL or token then holds on every
        node at once); the nodes that did not confirm within ``timeout`` (down, cut
        off: they apply it when they are back)."""
        target = self.groups[META_GROUP].raftLastApplied
        pending = [a for a in self.replicas_of(META_GROUP) if a != self.config.address]
        deadline = time.monotonic() + timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            behind = []
            for a in pending:
                try:
                    st = self.stub(a).GetNodeStatus(rmq_pb2.NodeStatusRequest(), timeout=min(1.0, left))
                    applied = next((g.applied_index for g in st.groups if g.group == META_GROUP), -1)
                except grpc.RpcError:
                    applied = -1
                if applied < target:
                    behind.append(a)
            pending = behind
            if pending:
                time.sleep(0.02)
        return pending
