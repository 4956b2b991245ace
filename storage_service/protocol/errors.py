"""The storage package's error root, and the status words both sides share.

Every error raised by ``storage_service`` derives from ``StorageError`` and
carries the gRPC status code it maps to (``code``) and whether a retry may
succeed (``retriable``). Status codes travel as gRPC statuses and, in the
produce port's frames and in ``ProduceOutcome``, as their numbers:
``status_code`` is the one table from number back to code.
"""
from __future__ import annotations

import grpc

__all__ = ["LEADER_METADATA_KEY", "RETRY_AFTER_METADATA_KEY", "StorageError", "status_code"]

# Trailing metadata of a NOT-leader answer: the gRPC address of the leader to retry at.
LEADER_METADATA_KEY = "rmq-leader"
# Trailing metadata of a RESOURCE_EXHAUSTED answer that is a node's momentary load, not
# a limit of the request: milliseconds to wait before retrying (the client retries).
RETRY_AFTER_METADATA_KEY = "rmq-retry-after-ms"

_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


def status_code(number: int) -> grpc.StatusCode:
    """The gRPC status code of a status number (UNKNOWN for a number gRPC does not define)."""
    return _BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)


class StorageError(Exception):
    """Base of every storage-service error: ``code`` is its gRPC status."""
    retriable = False

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INTERNAL):
        super().__init__(message)
        self.message = message
        self.code = code


class ServiceError(StorageError):
    """A request's failure, answered with ``code`` and ``message`` (the node's handlers
    raise it; ``protocol/errors.py`` has its kinds)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message, code)

    def trailing_metadata(self) -> tuple:
        return ()


class CallFailed(Exception):
    """A call ``server.dispatch.AsyncServer.invoke`` made ended in ``code``; ``trailing``:
    its metadata (the leader's address on a not-leader error, retry-after when at a
    limit). The HTTP port and the produce port answer with it."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple = ()):
        super().__init__(details)
        self.code, self.details, self.trailing = code, details, dict(trailing)

__all__ = ["Backlog", "OutOfOrder", "ServiceError", "NotLeader", "NodeFull", "invalid", "not_found"]


class NotLeader(ServiceError):
    """This node does not lead the group; ``leader`` is the gRPC address to retry."""
    retriable = True

    def __init__(self, group: int, leader: str | None, why: str = ""):
        where = f"leader is {leader}" if leader else "no leader known here (an election may be running)"
        super().__init__(grpc.StatusCode.UNAVAILABLE, f"not leader of group {group}: {why or where}")
        self.group = group
        self.leader = leader

    def trailing_metadata(self) -> tuple:
        return ((LEADER_METADATA_KEY, self.leader),) if self.leader else ()


class NodeFull(ServiceError):
    """This node is short of disk space: a moment's condition (space is freed, or the
    group's leadership moves to a replica with room), so the client retries."""
    retriable = True
    retry_after_ms = 500

    def __init__(self, message: str):
        super().__init__(grpc.StatusCode.RESOURCE_EXHAUSTED, message)

    def trailing_metadata(self) -> tuple:
        return ((RETRY_AFTER_METADATA_KEY, str(self.retry_after_ms)),)


class Backlog(ServiceError):
    """A group's batches waiting to be committed reached the node's limit: refused
    rather than queued without bound; the client backs off and retries."""
    retriable = True
    retry_after_ms = 20

    def __init__(self, group: int, waiting: int, limit: int, items: bool = False):
        if items:
            text = (f"group {group}: {waiting:,} produce batches wait to be committed; the limit is "
                    f"{limit:,} batches per group: retry in a moment")
        else:
            text = (f"group {group}: {_size(waiting)} of produce batches wait to be committed; the "
                    f"limit is {_size(limit)} per group (--max-commit-backlog): retry in a moment")
        super().__init__(grpc.StatusCode.RESOURCE_EXHAUSTED, text)

    def trailing_metadata(self) -> tuple:
        return ((RETRY_AFTER_METADATA_KEY, str(self.retry_after_ms)),)


class OutOfOrder(ServiceError):
    """An in-order batch came before an earlier batch of its producer was stored
    (that one failed, or is still on its way): the producer sends again from there."""
    retriable = True

    def __init__(self, group: int, producer: str, sequence: int, expected: int):
        super().__init__(grpc.StatusCode.ABORTED,
                         f"out of order: producer {producer} sent sequence {sequence} to a queue of group "
                         f"{group} where sequence {expected} comes next; send the batches from {expected} "
                         "again, in order")
        self.expected = expected


def _size(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 and not n % (1 << 20) else \
        f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


def invalid(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.NOT_FOUND, message)
