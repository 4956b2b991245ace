"""What the Structured Streaming jobs (``tiering``, ``compaction``) share.

``checkpoint`` reads the facts a job needs from a Spark checkpoint;
``query`` parses triggers, builds the hot-log source both jobs read and the
SQL confs they run with;
``errors`` holds ``JobConfigError``, the base of each job's config error.
"""
from . import checkpoint
from .errors import JobConfigError
from .query import (AVAILABLE_NOW, UTC_CONF, check_max_offsets, delta_conf, hot_stream,
                    is_available_now, parse_trigger)

__all__ = ["checkpoint", "JobConfigError", "AVAILABLE_NOW", "UTC_CONF", "delta_conf",
           "parse_trigger", "is_available_now", "check_max_offsets", "hot_stream"]
