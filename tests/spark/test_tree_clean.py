"""A Spark job started from the command line leaves no spark-warehouse/ in its directory."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_cli_spark_job_leaves_no_spark_warehouse_behind(endpoints, client, tmp_path):
    client.create_topic("tree-clean", queues=1)
    client.produce("tree-clean", [b"a", b"b"], queue=0)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    p = subprocess.run([sys.executable, "-m", "rmq_spark.cli.main", "--endpoints", endpoints, "tier",
                        "tree-clean", "--archive", str(tmp_path / "archive")], cwd=work, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "archived tree-clean to q0=2" in p.stdout
    client.create_topic("tree-clean-kv", queues=1, cleanup_policy="compact")
    client.produce("tree-clean-kv", [{"key": b"k", "value": b"v"}], queue=0)
    p = subprocess.run([sys.executable, "-m", "rmq_spark.cli.main", "--endpoints", endpoints, "compact",
                        "tree-clean-kv", "--table", str(tmp_path / "table")], cwd=work, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert os.listdir(work) == []                  # no spark-warehouse/, no metastore, nothing
