"""Tiering: archive a topic into Delta/Parquet with a Structured Streaming job.

``tier_topic(spark, endpoints, topic, ...)`` runs it (``rmq tier`` is the
same from the shell); ``sync_watermark`` moves the ``archive`` watermark to
what a checkpoint has committed. The archive's layout is
``rmq_spark.archive.layout``.
"""
from rmq_spark.jobs import AVAILABLE_NOW

from ._config import TierSettings, default_checkpoint, parse_trigger, resolve_tier
from ._job import start_tiering, tier_topic
from ._retention import ArchiveRetention, RetentionResult
from ._watermark import sync_watermark
from .errors import TierConfigError, TieringError

__all__ = ["tier_topic", "start_tiering", "sync_watermark", "resolve_tier", "parse_trigger", "default_checkpoint",
           "TierSettings", "ArchiveRetention", "RetentionResult", "AVAILABLE_NOW",
           "TieringError", "TierConfigError"]
