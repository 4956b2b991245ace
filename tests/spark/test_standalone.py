"""A Spark standalone cluster (master + worker from the pyspark install): the
connector runs in executor processes separate from the driver, and a driver
started outside the checkout finds ``format("rocketmq")`` with no register call."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pyspark
import pytest

from tests.conftest import wait_until

from ._helpers import produce

pytestmark = [pytest.mark.spark, pytest.mark.integration]
SPARK_HOME = os.path.dirname(pyspark.__file__)
DRIVER = os.path.join(os.path.dirname(__file__), "_standalone_driver.py")


def _free_ports(n: int) -> list[int]:
    """n distinct free ports: all sockets are held until every port is picked
    (one at a time, the OS may hand the same port out twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
            return json.load(r).get("aliveworkers", 0)
    except (OSError, ValueError):      # not up yet, or not answering JSON yet
        return 0


@pytest.fixture
def standalone(tmp_path):
    env = {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "SPARK_WORKER_DIR": str(tmp_path / "work"),
           "SPARK_LOG_DIR": str(tmp_path / "logs")}
    port, ui, worker_ui = _free_ports(3)
    cls = os.path.join(SPARK_HOME, "bin", "spark-class")
    procs = []
    with open(tmp_path / "master.log", "w") as mlog, open(tmp_path / "worker.log", "w") as wlog:
        procs.append(subprocess.Popen(
            [cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
             str(port), "--webui-port", str(ui)], env=env, stdout=mlog, stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(
            [cls, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
             "--host", "127.0.0.1", "--cores", "2", "--memory", "1g", "--webui-port",
             str(worker_ui)], env=env, stdout=wlog, stderr=subprocess.STDOUT))
    try:
        wait_until(lambda: _alive_workers(ui) == 1, timeout=90, interval=0.5,
                   what=f"a standalone worker (logs in {tmp_path})")
        yield f"spark://127.0.0.1:{port}", env
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_query_on_a_standalone_cluster(standalone, client, endpoints, topic, tmp_path):
    master, env = standalone
    client.create_topic(f"{topic}-copy", queues=2)
    produce(client, topic, 300)
    # From another directory: format("rocketmq") must resolve through the installed
    # package (Spark's static lookup of pyspark_rocketmq), not the checkout.
    out = subprocess.run([sys.executable, DRIVER, master, endpoints, topic, f"{topic}-copy",
                          str(tmp_path / "ck")], env=env, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["executors"] == 1
    assert len(res["executor_pids"]) == 1 and res["executor_pids"][0] is not None
    assert res["executor_pids"][0] != os.getpid()         # tasks ran under the executor JVM
    assert res["batch_count"] == 300
    assert sum(o.latest for o in client.offsets(f"{topic}-copy")) == 300
    assert res["stream_batches"] == [150, 150]
