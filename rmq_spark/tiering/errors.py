"""Errors of the tiering job, rooted in the client's ``RmqError``.

``TierConfigError`` is raised before anything is started or changed: a bad
argument (format, trigger, path), a topic that does not exist, or a topic
already tiered to another archive. The CLI turns it into exit code 2.
"""
from __future__ import annotations

from rmq_spark.client.errors import RmqError
from rmq_spark.jobs.errors import JobConfigError

__all__ = ["TieringError", "TierConfigError"]


class TieringError(RmqError):
    """Base of the tiering job's own errors."""


class TierConfigError(TieringError, JobConfigError):
    """An argument or a topic/archive/checkpoint combination the job cannot use."""
