"""A ``Client``'s security calls: principals and their tokens, ACLs, who am I
(``rmq principal``, ``rmq acl``; the node side is ``storage_service/server/security_rpc.py``)."""
from __future__ import annotations

from storage_service.proto import rmq_pb2
from storage_service.protocol.placement import META_GROUP

__all__ = ["SecurityCalls"]


def _acl(e) -> dict:
    return dict(principal=e.principal, resource_type=e.resource_type, name=e.name, prefix=e.prefix,
                operations=sorted(e.operations))


class SecurityCalls:
    """Mixed into ``Client`` (its ``call``)."""

    def create_principal(self, name: str, rotate: bool = False, ttl_seconds: int = 0) -> dict:
        """A principal and its bearer token (``rotate``: a new token for an existing
        one, ending every older token); needs the cluster's alter."""
        r = self.call("CreatePrincipal", rmq_pb2.CreatePrincipalRequest(
            name=name, rotate=rotate, ttl_seconds=ttl_seconds), group=META_GROUP)
        return dict(name=r.name, token=r.token, version=r.version, expires_ms=r.expires_ms,
                    unconfirmed=list(r.unconfirmed))

    def delete_principal(self, name: str) -> list[str]:
        """Delete a principal (its tokens end); the nodes that had not applied it within
        3 s (down or cut off: they apply it when back)."""
        return list(self.call("DeletePrincipal", rmq_pb2.DeletePrincipalRequest(name=name),
                              group=META_GROUP).unconfirmed)

    def list_principals(self) -> dict:
        r = self.call("ListPrincipals", rmq_pb2.ListPrincipalsRequest(), group=META_GROUP)
        return dict(principals=[dict(name=p.name, version=p.version, created_ms=p.created_ms,
                                     rotated_ms=p.rotated_ms, superuser=p.superuser) for p in r.principals],
                    superusers=list(r.superusers))

    def change_acls(self, add: bool, entries: list[dict], unconfirmed: list | None = None) -> int:
        """Allow (``add``) or stop allowing: each entry ``principal``, ``resource_type``
        (topic, group, cluster), ``name``, ``prefix``, ``operations``; how many changed.
        Answered once every node applied it, or named in ``unconfirmed`` (a list to fill)."""
        req = rmq_pb2.ChangeAclsRequest(add=add, entries=[rmq_pb2.AclEntry(**e) for e in entries])
        r = self.call("ChangeAcls", req, group=META_GROUP)
        if unconfirmed is not None:
            unconfirmed.extend(r.unconfirmed)
        return r.changed

    def list_acls(self, principal: str = "") -> list[dict]:
        r = self.call("ListAcls", rmq_pb2.ListAclsRequest(principal=principal), group=META_GROUP)
        return [_acl(e) for e in r.entries]

    def whoami(self, address: str | None = None) -> dict:
        r = self.call("WhoAmI", rmq_pb2.WhoAmIRequest(), address=address)
        return dict(principal=r.principal, how=r.how, superuser=r.superuser, authorize=r.authorize)
