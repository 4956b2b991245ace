"""Compaction: a compact topic's latest value per key, kept in a Delta table.

``compact_topic(spark, endpoints, topic, ...)`` runs the Structured Streaming
job (``rmq compact`` from the shell); ``CompactedTable`` reads the table
without Spark for point lookups and prefix scans.
"""
from ._job import CompactSettings, compact_topic
from .errors import CompactionConfigError
from .table import DEFAULT_BUCKETS, CompactedTable, TableRow, bucket_of

__all__ = ["compact_topic", "CompactSettings", "CompactionConfigError", "CompactedTable",
           "TableRow", "bucket_of", "DEFAULT_BUCKETS"]
