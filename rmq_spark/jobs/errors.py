"""The error the Spark jobs share, rooted in the client's ``RmqError``.

``JobConfigError`` is raised before a job starts or changes anything. Each
job raises its own subclass (``TierConfigError``, ``CompactionConfigError``):
the shared helpers of ``rmq_spark.jobs`` take the class to raise, so a caller
of one job catches that job's error only.
"""
from __future__ import annotations

from rmq_spark.client.errors import RmqError

__all__ = ["JobConfigError"]


class JobConfigError(RmqError, ValueError):
    """An argument, path or topic a Spark job cannot use; names it and what is allowed."""
