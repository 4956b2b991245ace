"""Errors of reading an archive, rooted in the client's ``RmqError``."""
from __future__ import annotations

from rmq_spark.client.errors import RmqError

__all__ = ["ArchiveError"]


class ArchiveError(RmqError, RuntimeError):
    """The archive cannot be read as it is (named reason): a missing commit, a
    table feature the reader does not support, statistics it needs are absent.
    Not retriable: reading again finds the same files."""
