"""Service-side errors: each carries the gRPC status code it maps to."""
from __future__ import annotations

import logging
import os

import grpc

__all__ = ["ServiceError", "NotLeader", "LEADER_METADATA_KEY", "fatal"]

LEADER_METADATA_KEY = "rmq-leader"
log = logging.getLogger(__name__)


class ServiceError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def trailing_metadata(self) -> tuple:
        return ()


class NotLeader(ServiceError):
    """This node does not lead the group; ``leader`` is the gRPC address to retry."""

    def __init__(self, group: int, leader: str | None):
        where = f"leader is {leader}" if leader else "no leader elected yet"
        super().__init__(grpc.StatusCode.UNAVAILABLE, f"not leader of group {group}: {where}")
        self.group = group
        self.leader = leader

    def trailing_metadata(self) -> tuple:
        return ((LEADER_METADATA_KEY, self.leader),) if self.leader else ()


def invalid(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.NOT_FOUND, message)


def fatal(why: str) -> None:
    """Stop the node process at once: a failed fdatasync cannot be retried.

    Linux reports a lost write-back to one fsync only; a retry would succeed
    over pages that never reached the disk. Restarting recovers from the
    files and from the peers, as after a crash.
    """
    log.critical("%s: stopping this node", why)
    logging.shutdown()
    os._exit(70)
