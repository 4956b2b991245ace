"""Spark fixtures: one local SparkSession for the whole run (real Spark, real Delta, real cluster).

The AWS environment points at a real S3-compatible server (``s3``) before the
session starts, as a user's would at their store (tests/spark/test_s3_archive.py).

``local[2,4]``: two task threads and up to 4 attempts per task, so a test can
inject a task failure and watch Spark retry it. Python workers run this
interpreter (the venv), which has the package installed: ``format("rocketmq")``
resolves through Spark's static lookup of ``pyspark_rocketmq``, with no
register call.
"""
from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A real S3-compatible server (moto's) for the run; the AWS environment points at
    it before Spark starts, so the JVM, its Python workers and the CLI reach it."""
    from tests.s3server import S3Server

    server = S3Server.start(str(tmp_path_factory.mktemp("s3")))
    server.export()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark(s3, tmp_path_factory):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from rmq_spark.spark import SHORT_LIVED_JVM, session_builder

    # This JVM lives for the whole run: the default JIT and GC, not the short-lived
    # drivers' options (tests/conftest.py), which pyspark would pass on from the environment.
    short = os.environ.get("SPARK_SUBMIT_OPTS")
    if short == SHORT_LIVED_JVM:
        del os.environ["SPARK_SUBMIT_OPTS"]
    try:
        session = _session(session_builder, tmp_path_factory)
    finally:
        if short is not None:
            os.environ["SPARK_SUBMIT_OPTS"] = short
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _session(session_builder, tmp_path_factory):
    return (session_builder("rmq-spark-tests", master="local[2,4]")     # with Delta
            .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.databricks.delta.snapshotPartitions", "2")
            .config("spark.default.parallelism", "2")
            .config("spark.sql.streaming.stopTimeout", "30s")
            .config("spark.driver.memory", "1g")
            .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
            .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=error")
            # an event log, so tests can check what it holds (no secrets: test_tls_spark.py)
            .config("spark.eventLog.enabled", "true")
            .config("spark.eventLog.dir", str(tmp_path_factory.mktemp("event-log")))
            .config("spark.eventLog.compress", "false")
            .getOrCreate())


@pytest.fixture(scope="module")
def endpoints(cluster) -> str:
    return cluster.endpoints
