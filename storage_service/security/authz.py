"""Who is calling, and whether they may: every call of a secured node passes ``Gate``.

A caller is known by (first match):

* a node certificate (TLS, on the cluster port: its common name is one of
  the node names) - a node of the cluster, allowed everything;
* ``authorization: Bearer TOKEN`` (gRPC metadata; the produce port's hello)
  - the token's principal, if the token is valid (``security/tokens.py``);
* a client certificate (mTLS) - its subject's common name.

With ``--authorize`` a call without valid credentials is UNAUTHENTICATED
(``Health`` excepted: load balancers call it), and a call the ACLs
(``security/acl.py``, held by the metadata group) do not allow is
PERMISSION_DENIED, naming principal, operation and resource; either way the
handler never runs, so nothing changes. Superusers (``--superusers``) and
nodes may do everything. With TLS but without ``--authorize`` only the
node-only calls (``ReplicaFetch``, ``JoinCluster``) are checked: they need a
node certificate. ``POLICY`` says what each call needs.

An ACL or principal changed through the metadata leader is applied on the
other nodes a moment later: before denying, a node that is not the metadata
leader catches up with the leader's commit index (``security/meta_sync.py``)
and decides again, so a grant holds on every node as soon as it is answered.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import grpc

from ..security.tokens import BadToken, Claims, TokenKeys, expired_message
from ..protocol.errors import ServiceError

__all__ = ["Gate", "POLICY", "Principal", "SecurityConfig", "ANONYMOUS", "NODE_ONLY"]

BEARER = "bearer "
TOKEN_CACHE = 4096


@dataclass(frozen=True)
class Principal:
    name: str
    how: str            # node, token, certificate, anonymous
    superuser: bool = False

    @property
    def is_node(self) -> bool:
        return self.how == "node"

    @property
    def all_allowed(self) -> bool:
        return self.is_node or self.superuser


ANONYMOUS = Principal("", "anonymous")


@dataclass(frozen=True)
class SecurityConfig:
    authorize: bool = False                 # --authorize: ACLs on, credentials required
    tls: bool = False                       # the node runs TLS (node-only calls need a node certificate)
    token_keys: TokenKeys | None = None     # --token-secret-file
    superusers: frozenset = frozenset()     # --superusers
    node_names: frozenset = frozenset()     # certificate common names of the nodes

    @property
    def active(self) -> bool:
        return self.authorize or self.tls


def _topic(op: str):
    return lambda r: [(op, "topic", r.topic)]


def _cluster(op: str):
    return lambda r: [(op, "cluster", "")]


NODE_ONLY = ("ReplicaFetch", "JoinCluster")

# method -> what it needs: [(operation, resource type, name)]; None: any authenticated
# caller (the handler filters what it answers by what the caller may describe).
POLICY: dict[str, Callable | None] = {
    "CreateTopic": lambda r: [("alter", "topic", r.config.name)],
    "AlterTopic": lambda r: [("alter", "topic", r.name)],
    "DeleteTopic": lambda r: [("alter", "topic", r.name)],
    "ListTopics": None,
    "DescribeTopic": lambda r: [("describe", "topic", r.name)],
    "Produce": _topic("produce"),
    "ProduceBatches": lambda r: sorted({("produce", "topic", b.topic) for b in r.batches}),
    "Fetch": _topic("consume"),
    "KvPut": _topic("produce"),
    "KvRead": _topic("consume"),
    "Offsets": _topic("describe"),           # (its group is the raft group asked)
    "OffsetForTimestamp": _topic("describe"),
    "CommitOffsets": lambda r: [("consume", "group", r.consumer_group), ("consume", "topic", r.topic)],
    "GetCommittedOffsets": lambda r: [("describe", "group", r.consumer_group), ("describe", "topic", r.topic)],
    "ListConsumerGroups": _topic("describe"),
    # the tiering and compaction jobs: the topic's alter (and the lease's token, meta.py)
    "SetWatermark": _topic("alter"),
    "Lease": _topic("alter"),
    # every client learns the cluster's nodes and groups from it to route its calls
    # (as any Kafka client may read the brokers from the metadata)
    "ClusterStatus": None,
    "GetNodeStatus": _cluster("describe"),
    "GroupInfo": _cluster("describe"),
    "ChangeReplicas": _cluster("alter"),
    "TransferLeader": _cluster("alter"),
    "DropReplica": _cluster("alter"),
    "ClusterCommand": _cluster("alter"),
    "CreatePrincipal": _cluster("alter"),
    "DeletePrincipal": _cluster("alter"),
    "ListPrincipals": _cluster("describe"),
    "ChangeAcls": _cluster("alter"),
    "ListAcls": _cluster("describe"),
    "WhoAmI": None,
    # the HTTP port's own (storage_service/http): cluster-wide figures
    "Metrics": _cluster("describe"),
    "Status": _cluster("describe"),
}
OPEN = ("Health",)


def _what(op: str, rtype: str, name: str) -> str:
    return "the cluster" if rtype == "cluster" else f"{rtype} {name!r}"


def _hint(p: Principal, op: str, rtype: str, name: str) -> str:
    if rtype == "cluster":
        return f"rmq acl add {p.name} --cluster --allow {op}"
    return f"rmq acl add {p.name} --{rtype} {name} --allow {op}"


class Gate:
    """A node's authentication and authorization (see the module's doc)."""

    def __init__(self, config: SecurityConfig, meta, sync: Callable[[], None] = lambda: None):
        """``meta``: the node's ``MetaState`` (its ``security`` record); ``sync``: wait
        until this node applied what the metadata leader committed (no-op on it)."""
        self.config = config
        self.meta = meta
        self._sync = sync
        self._tokens: OrderedDict[str, Claims] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------- authentication
    def principal(self, token: str | None, cert_name: str | None) -> Principal:
        """The caller, from a bearer token (the header's value, or None) and the
        common name of a verified client certificate; ServiceError UNAUTHENTICATED
        for a token that is not valid."""
        if cert_name and cert_name in self.config.node_names:
            return Principal(cert_name, "node", True)
        if token:
            return self._from_token(token)
        if cert_name:
            return Principal(cert_name, "certificate", cert_name in self.config.superusers)
        return ANONYMOUS

    def _from_token(self, header: str) -> Principal:
        if not header[:len(BEARER)].lower() == BEARER:
            raise _unauthenticated("the authorization header must be 'Bearer TOKEN'")
        token = header[len(BEARER):].strip()
        keys = self.config.token_keys
        if keys is None:
            if not self.config.authorize:
                return ANONYMOUS         # a TLS-only node: credentials are not asked for
            raise _unauthenticated("this node takes no tokens (it has no --token-secret-file)")
        with self._lock:
            claims = self._tokens.get(token)
        if claims is None:
            try:
                claims = keys.verify(token)
            except BadToken as e:
                raise _unauthenticated(str(e)) from None
            with self._lock:
                self._tokens[token] = claims
                while len(self._tokens) > TOKEN_CACHE:
                    self._tokens.popitem(last=False)
        elif claims.expires is not None and claims.expires < time.time() - 5:
            raise _unauthenticated(expired_message(claims.expires))
        problem = self._revoked(claims)
        if problem:
            self._sync()                 # made or rotated a moment ago on the metadata leader?
            problem = self._revoked(claims)
            if problem:
                raise _unauthenticated(problem)
        name = claims.principal
        if name in self.config.node_names:
            raise _unauthenticated(f"{name!r} is a node's name: nodes show their certificate, not a token")
        return Principal(name, "token", name in self.config.superusers)

    def _revoked(self, claims: Claims) -> str | None:
        record = self.meta.security
        have = record.version(claims.principal)
        if have is None:
            if record.was_deleted(claims.principal):
                return f"principal {claims.principal!r} was deleted"
            if claims.version == 0 and claims.principal in self.config.superusers:
                return None              # a configured superuser's bootstrap token, never replaced
            return f"principal {claims.principal!r} does not exist"
        if have != claims.version:
            return (f"the token of principal {claims.principal!r} was replaced by a newer one "
                    f"(version {claims.version}, now {have})")
        return None

    # -------------------------------------------------------- authorization
    def allowed(self, p: Principal, op: str, rtype: str, name: str) -> bool:
        return p.all_allowed or self.meta.security.allows(p.name, op, rtype, name)

    def require(self, p: Principal, needs) -> None:
        missing = [n for n in needs if not self.allowed(p, *n)]
        if missing:
            self._sync()
            missing = [n for n in missing if not self.allowed(p, *n)]
        if missing:
            op, rtype, name = missing[0]
            raise ServiceError(grpc.StatusCode.PERMISSION_DENIED,
                               f"principal {p.name!r} may not {op} {_what(op, rtype, name)} "
                               f"(an admin can allow it: {_hint(p, op, rtype, name)})")

    def check_call(self, method: str, request, p: Principal) -> None:
        """Raise ServiceError unless ``p`` may make this call (before its handler runs)."""
        if method in OPEN:
            return
        if method in NODE_ONLY:
            if self.config.tls and not p.is_node:
                raise ServiceError(grpc.StatusCode.PERMISSION_DENIED,
                                   f"{method} is for the cluster's nodes: call it on a node's cluster "
                                   f"port with a node certificate (caller: {p.name or 'anonymous'})")
            if not self.config.authorize or p.is_node:
                return
        if not self.config.authorize:
            return
        if p is ANONYMOUS:
            raise _unauthenticated(f"{method} needs credentials: a bearer token (authorization "
                                   "metadata; --token, RMQ_TOKEN) or a client certificate")
        if method in NODE_ONLY:
            raise ServiceError(grpc.StatusCode.PERMISSION_DENIED,
                               f"{method} is for the cluster's nodes (caller: {p.name!r})")
        rule = POLICY.get(method, _cluster("alter"))
        if rule is not None and not p.all_allowed:
            self.require(p, rule(request))


def _unauthenticated(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.UNAUTHENTICATED, message)
