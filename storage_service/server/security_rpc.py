"""The security methods of a node's gRPC service (a mixin of ``MessageLogService``):
principals and their tokens, ACLs, and who the caller is (``rmq principal``,
``rmq acl``). Changes go through the metadata group (``statemachine/security.py``);
who may call them is ``authz.POLICY`` (the cluster's alter or describe)."""
from __future__ import annotations

import grpc

from ..proto import rmq_pb2
from ..security.acl import check_entry
from ..statemachine.commands import ChangeAcls, SetPrincipal
from ..protocol.errors import ServiceError, invalid
from .guard import _guard

__all__ = ["SecurityAdmin"]

MAX_TTL_S = 10 * 365 * 86400


class SecurityAdmin:

    def _security(self):
        return self.node.security

    @_guard
    def CreatePrincipal(self, request, context):
        sec = self._security()
        name = request.name
        try:
            check_entry(name, "cluster", "", False, ["describe"])
        except ValueError as e:
            raise invalid(str(e)) from None
        if name == "*":
            raise invalid("* stands for every principal in an ACL; it is not a principal's name")
        if name in sec.node_names:
            raise invalid(f"{name!r} is a node's name (--node-names): nodes show a certificate, not a token")
        if sec.token_keys is None:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               "this cluster makes no tokens: start its nodes with --token-secret-file "
                               "(rmq-storage local --secure does)")
        if not 0 <= request.ttl_seconds <= MAX_TTL_S:
            raise invalid(f"ttl_seconds={request.ttl_seconds}: give 0 (never expires) to {MAX_TTL_S}")
        now = self.node.now_ms()
        version = self.node.meta_command(SetPrincipal(name, now, rotate=request.rotate))
        ttl = request.ttl_seconds or None
        token = sec.token_keys.mint(name, version, ttl, now=now / 1000)
        return rmq_pb2.CreatePrincipalResponse(name=name, token=token, version=version,
                                               expires_ms=now + ttl * 1000 if ttl else 0,
                                               unconfirmed=self.node.await_meta_applied())

    @_guard
    def DeletePrincipal(self, request, context):
        if not request.name:
            raise invalid("give the principal's name")
        self.node.meta_command(SetPrincipal(request.name, self.node.now_ms(), delete=True))
        return rmq_pb2.DeletePrincipalResponse(unconfirmed=self.node.await_meta_applied())

    @_guard
    def ListPrincipals(self, request, context):
        sec = self._security()
        record = self.node.meta.security
        out = [rmq_pb2.PrincipalInfo(name=n, version=p["version"], created_ms=p["created_ms"],
                                     rotated_ms=p.get("rotated_ms", 0), superuser=n in sec.superusers)
               for n, p in sorted(record.principals.items())]
        return rmq_pb2.ListPrincipalsResponse(principals=out, superusers=sorted(sec.superusers))

    @_guard
    def ChangeAcls(self, request, context):
        if not request.entries:
            raise invalid("give at least one ACL entry")
        entries = []
        for e in request.entries:
            try:
                entries.append(check_entry(e.principal, e.resource_type, e.name, e.prefix, e.operations))
            except ValueError as err:
                raise invalid(str(err)) from None
        changed = self.node.meta_command(ChangeAcls(request.add, tuple(x.encode() for x in entries)))
        # a revoke must hold everywhere once answered (a grant does anyway: authz syncs
        # before it denies); the nodes that could not confirm are named
        return rmq_pb2.ChangeAclsResponse(changed=changed, unconfirmed=self.node.await_meta_applied())

    @_guard
    def ListAcls(self, request, context):
        return rmq_pb2.ListAclsResponse(entries=[
            rmq_pb2.AclEntry(principal=e.principal, resource_type=e.resource_type, name=e.name,
                             prefix=e.prefix, operations=sorted(e.operations))
            for e in self.node.meta.security.entries()
            if not request.principal or e.principal == request.principal])

    @_guard
    def WhoAmI(self, request, context):
        p = getattr(context, "principal", None)
        sec = self._security()
        if p is None:
            return rmq_pb2.WhoAmIResponse(how="anonymous", authorize=sec.authorize)
        return rmq_pb2.WhoAmIResponse(principal=p.name, how=p.how, superuser=p.all_allowed,
                                      authorize=sec.authorize)
