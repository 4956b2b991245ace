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
    raise it; ``server/errors.py`` has its kinds)."""

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
