"""One exception tree for the client; gRPC statuses are mapped to it here only.

``from_status`` is the one table: a gRPC status (code or its number, as the
produce port and ``ProduceOutcome`` carry it), its details and the leader
hint of a not-leader answer -> the exception. ``from_rpc_error`` reads those
from a ``grpc.RpcError`` (a real call's, or the produce port's
``WireCallError``).
"""
from __future__ import annotations

import re

import grpc

from storage_service.protocol.errors import LEADER_METADATA_KEY, RETRY_AFTER_METADATA_KEY, status_code

__all__ = ["RmqError", "InvalidArgument", "NotFound", "AlreadyExists", "OutOfRange",
           "ResourceExhausted", "Overloaded", "FailedPrecondition", "Unavailable", "NotLeader",
           "DeadlineExceeded", "InternalError", "PermissionDenied", "Unauthenticated", "TlsRefused",
           "Aborted", "OutOfOrderSequence", "KvConflict",
           "from_status", "from_rpc_error", "TOKEN_HINT"]

# Where a valid token comes from, named in every UNAUTHENTICATED error the client raises.
TOKEN_HINT = ("A valid token is the cluster's admin token (the file `rmq-storage local --secure` "
              "prints as admin-token-file:) or one made by `rmq principal create NAME`; pass it as "
              "--token-file / RMQ_TOKEN_FILE (CLI) or the tokenFile option (Spark).")


class RmqError(Exception):
    """Base of every client error. ``retriable`` says whether a retry may succeed."""
    retriable = False

    def __init__(self, message: str, code: grpc.StatusCode | None = None):
        super().__init__(message)
        self.message = message
        self.code = code


class InvalidArgument(RmqError, ValueError):
    pass


class NotFound(RmqError, LookupError):
    pass


class AlreadyExists(RmqError):
    pass


class OutOfRange(RmqError, IndexError):
    """An offset outside [earliest, latest]; both are parsed from the message."""

    def __init__(self, message: str, code=None):
        super().__init__(message, code)
        m = re.search(r"earliest=(\d+) latest=(\d+)", message)
        self.earliest = int(m.group(1)) if m else None
        self.latest = int(m.group(2)) if m else None


class ResourceExhausted(RmqError):
    pass


class Overloaded(ResourceExhausted):
    """A node at its limit of requests in progress or of waiting fetches: a moment's
    load, not a limit of the request, so it is retried (after ``retry_after_ms``)."""
    retriable = True
    retry_after_ms = 50


class FailedPrecondition(RmqError):
    pass


class Unavailable(RmqError, ConnectionError):
    retriable = True


class NotLeader(Unavailable):
    def __init__(self, message: str, code=None, leader: str | None = None):
        super().__init__(message, code)
        self.leader = leader


class Unauthenticated(RmqError, PermissionError):
    """No valid credentials: no token (or certificate) where the node needs one, or a
    token that is malformed, expired or revoked."""


class TlsRefused(RmqError, ConnectionError):
    """The TLS handshake with a node failed for a reason a retry cannot change: the
    node's certificate is not signed by the CA given (or does not name the node's
    address), or the node requires a client certificate and none was given."""


class PermissionDenied(RmqError, PermissionError):
    """The principal may not do this (the message names principal, operation, resource)."""


class Aborted(RmqError):
    """The operation met a conflict (a condition it was given no longer held)."""


class OutOfOrderSequence(Aborted):
    """A pipelined batch reached its queue before an earlier batch of its producer was
    stored (that one failed or is still on its way): sent again after it."""
    retriable = True


class KvConflict(Aborted):
    """A key-value write's condition failed (``if_revision``/``if_absent``): nothing was
    stored. ``current_revision``: the key's live revision, or None if it has none."""

    def __init__(self, message: str, code=None):
        super().__init__(message, code)
        tail = message.rsplit("current revision ", 1)[-1].split()[0] if "current revision " in message else ""
        try:
            rev = int(tail)
        except ValueError:
            rev = -1
        self.current_revision = rev if rev >= 0 else None


class DeadlineExceeded(RmqError, TimeoutError):
    retriable = True


class InternalError(RmqError):
    retriable = True


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNKNOWN: InternalError,
    grpc.StatusCode.CANCELLED: Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.ABORTED: Aborted,
}


def from_status(code: grpc.StatusCode | int | None, details: str, leader: str | None = None,
                address: str = "", retry_after: str | None = None) -> RmqError:
    """The exception for a status; ``address`` (the node that answered) is named in it.
    UNAVAILABLE with a leader hint, or saying "not leader", is ``NotLeader``."""
    if isinstance(code, int):
        code = status_code(code)
    message = details + (f" [{address}]" if address else "")
    if code == grpc.StatusCode.UNAUTHENTICATED and TOKEN_HINT not in message:
        message = f"{message}. {TOKEN_HINT}"
    if code == grpc.StatusCode.UNAVAILABLE and UNTRUSTED in details:
        return TlsRefused(untrusted_message(details, address), code)
    if code == grpc.StatusCode.UNAVAILABLE and (leader or "not leader" in details):
        return NotLeader(message, code, leader or None)
    if code == grpc.StatusCode.ABORTED and details.startswith("out of order"):
        return OutOfOrderSequence(message, code)
    if code == grpc.StatusCode.ABORTED and details.startswith("kv conflict"):
        return KvConflict(message, code)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and retry_after:
        return Overloaded(message, code)
    return _BY_CODE.get(code, RmqError)(message, code)


UNTRUSTED = "CERTIFICATE_VERIFY_FAILED"


def untrusted_message(details: str, address: str) -> str:
    """A handshake whose check of the node's certificate failed (gRPC's details, or
    ``ssl``'s ``SSLCertVerificationError``): what was checked, and what to give."""
    reason = details.split(UNTRUSTED, 1)[-1].strip(" :)")
    reason = reason.removesuffix(": OK").strip(" :") or "verify failed"     # gRPC's tail
    return (f"TLS: the certificate of node {address or '?'} was not accepted ({reason}): it must be "
            "signed by the CA given as --tls-ca / RMQ_TLS_CA (tlsCaFile in Spark), the cluster's "
            "ca.pem (`rmq-storage local --secure` prints it as tls-ca:), and name the address dialled")


def from_rpc_error(e: grpc.RpcError, address: str = "") -> RmqError:
    """``from_status`` of a failed call: its code, details and leader metadata."""
    code = e.code() if hasattr(e, "code") else None
    details = (e.details() if hasattr(e, "details") else None) or str(e)
    leader = retry_after = None
    try:
        for k, v in e.trailing_metadata() or ():
            if k == LEADER_METADATA_KEY:
                leader = v
            elif k == RETRY_AFTER_METADATA_KEY:
                retry_after = v
    except Exception:       # a call that failed before any metadata arrived
        pass
    return from_status(code, details, leader, address, retry_after)
