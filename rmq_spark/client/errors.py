"""One exception tree for the client; gRPC status codes are mapped here only."""
from __future__ import annotations

import re

import grpc

from storage_service.server.errors import LEADER_METADATA_KEY

__all__ = ["RmqError", "InvalidArgument", "NotFound", "AlreadyExists", "OutOfRange",
           "ResourceExhausted", "FailedPrecondition", "Unavailable", "NotLeader",
           "DeadlineExceeded", "InternalError", "from_rpc_error"]


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


class FailedPrecondition(RmqError):
    pass


class Unavailable(RmqError, ConnectionError):
    retriable = True


class NotLeader(Unavailable):
    def __init__(self, message: str, code=None, leader: str | None = None):
        super().__init__(message, code)
        self.leader = leader


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
}


def from_rpc_error(e: grpc.RpcError, address: str = "") -> RmqError:
    code = e.code() if hasattr(e, "code") else None
    details = (e.details() if hasattr(e, "details") else None) or str(e)
    where = f" [{address}]" if address else ""
    leader = None
    try:
        for k, v in e.trailing_metadata() or ():
            if k == LEADER_METADATA_KEY:
                leader = v
    except Exception:
        pass
    if code == grpc.StatusCode.UNAVAILABLE and (leader or "not leader" in details):
        return NotLeader(details + where, code, leader)
    cls = _BY_CODE.get(code, RmqError)
    return cls(details + where, code)
