"""Errors of the compaction job, rooted in the client's ``RmqError`` (via ``JobConfigError``).

``CompactionConfigError`` is raised before anything starts or changes: a bad
argument, a topic that does not exist or is not a compact topic, or a topic
already compacted into another table. The CLI turns it into exit code 2.
"""
from __future__ import annotations

from rmq_spark.jobs.errors import JobConfigError

__all__ = ["CompactionConfigError"]


class CompactionConfigError(JobConfigError):
    """An argument or a topic/table combination the compaction job cannot use."""
