"""A job built with session_builder() finds the rocketmq source from any shell (issue 17 item 10).

Spark starts its Python workers with ``python3`` from PATH unless told
otherwise; from a shell without the venv on PATH that Python lacks this
package and the read fails with DATA_SOURCE_NOT_FOUND.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.integration]

JOB = """
import sys
from rmq_spark.spark import session_builder
spark = session_builder("worker-python").getOrCreate()
n = spark.read.format("rocketmq").option("endpoints", sys.argv[1]).option("topic", sys.argv[2]).load().count()
print("rows", n)
spark.stop()
"""


def test_session_builder_runs_workers_with_the_drivers_python(endpoints, client, tmp_path):
    client.create_topic("worker-python", queues=2)
    client.produce("worker-python", [b"a", b"b", b"c"], queue=1)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PATH"] = "/usr/bin:/bin"                 # a shell without the venv: python3 lacks rmq_spark
    p = subprocess.run([sys.executable, "-c", JOB, endpoints, "worker-python"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "DATA_SOURCE_NOT_FOUND" not in p.stderr, p.stderr[-2000:]
    assert "rows 3" in p.stdout
