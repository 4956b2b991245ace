"""The tiering job's lease on its topic (``rmq_spark.jobs.lease``): kind ``tier``."""
from __future__ import annotations

from rmq_spark.jobs.lease import TTL_S, JobLease, LeaseLost

from .errors import TierConfigError

__all__ = ["LeaseLost", "TierLease", "TTL_S"]


class TierLease(JobLease):
    KIND = "tier"
    JOB = "tiering"
    VERB = "tiered"
    CONFIG_ERROR = TierConfigError
