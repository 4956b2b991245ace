"""What the Spark benchmarks share (``spark_read.py``, ``spark_write.py``): the checkout
on the import path, logging, byte-compiled sources, and one local SparkSession.

Importing this module puts the checkout first on ``sys.path``: the programs
measure the tree they sit in, installed or not.
"""
from __future__ import annotations

import logging
import os
import sys

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
if REPO_ROOT not in sys.path:
    sys.path.insert(1, REPO_ROOT)

__all__ = ["BENCH_DIR", "REPO_ROOT", "compile_sources", "local_session", "setup"]


def setup() -> None:
    """Progress to stderr with times; Spark's py4j chatter off; Spark's Python workers
    run this interpreter."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def compile_sources() -> None:
    """Byte-compile the checkout, as an install would: with PYTHONDONTWRITEBYTECODE
    set, every Spark Python worker would otherwise compile each changed module on
    import, a per-query cost a user's install does not pay."""
    import compileall

    for name in ("rmq_spark", "storage_service", "pyspark_rocketmq.py"):
        path = os.path.join(REPO_ROOT, name)
        (compileall.compile_dir(path, quiet=1) if os.path.isdir(path)
         else compileall.compile_file(path, quiet=1))


def local_session(app_name: str, jars: list[str] = ()):
    """Spark ``local[2]`` on loopback, no UI, 4 GB driver, quiet logs."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only
    spark = (SparkSession.builder.master("local[2]").appName(app_name)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "4g")
             .config("spark.jars", ",".join(jars))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark
