"""Compaction: a compact topic's latest value per key, kept in a Delta table.

``compact_topic(spark, endpoints, topic, ...)`` runs the Structured Streaming
job (``rmq compact`` from the shell); ``KeyLookup`` answers a key's latest
value (hot tail first, then the table, read without Spark).
"""
from ._job import CompactSettings, compact_topic
from .errors import CompactionConfigError
from .lookup import KeyLookup
from .table import DEFAULT_BUCKETS, CompactedTable, TableRow, bucket_of

__all__ = ["KeyLookup", "compact_topic", "CompactSettings", "CompactionConfigError", "CompactedTable",
           "TableRow", "bucket_of", "DEFAULT_BUCKETS"]
