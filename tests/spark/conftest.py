"""Spark fixtures: one local SparkSession for the whole run (real Spark, real Delta, real cluster).

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
def spark(tmp_path_factory):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from rmq_spark.spark import session_builder

    session = (session_builder("rmq-spark-tests", master="local[2,4]")     # with Delta
               .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.streaming.stopTimeout", "30s")
               .config("spark.driver.memory", "1g")
               .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
               .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=error")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def endpoints(cluster) -> str:
    return cluster.endpoints
