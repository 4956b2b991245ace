"""``pip install rmq-spark`` is the client, the ``rmq`` CLI and the Spark connector; the
storage service's own packages come with ``rmq-spark[server]`` (issue 42). A Spark
executor then installs no Raft, HTTP server, metrics or JWT library it never runs."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import requires

import pytest

from storage_service.launch import SERVER_PACKAGES

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# distribution names of the server's packages (import names in SERVER_PACKAGES)
SERVER_DISTS = {"pysyncobj", "aiohttp", "prometheus-client", "pyjwt", "cryptography"}

# Run with every server-only package made unimportable: what a client-only install has.
BLOCKED = """
import importlib, importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Blocked())
"""


def _name(req: str) -> str:
    return req.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower().replace("_", "-")


def test_a_plain_install_requires_no_server_package():
    reqs = requires("rmq-spark") or []
    plain = {_name(r) for r in reqs if "extra ==" not in r}
    server = {_name(r) for r in reqs if 'extra == "server"' in r}
    assert plain and not plain & SERVER_DISTS, plain
    assert server == SERVER_DISTS, server


def test_the_client_cli_and_connector_import_and_run_without_the_server_packages():
    code = BLOCKED.format(blocked=set(SERVER_PACKAGES)) + """
for m in ("rmq_spark.client", "rmq_spark.cli.main", "rmq_spark.datasource", "rmq_spark.realtime",
          "rmq_spark.spark", "rmq_spark.tiering", "rmq_spark.compaction", "pyspark_rocketmq"):
    importlib.import_module(m)
from rmq_spark.cli.main import main
try:
    main(["--help"])
except SystemExit as e:
    assert e.code == 0, e.code
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage: rmq" in out.stdout


def test_rmq_storage_without_the_server_packages_says_what_to_install():
    code = BLOCKED.format(blocked=set(SERVER_PACKAGES)) + """
from storage_service.launch import main
sys.exit(main(["local"]))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "pip install 'rmq-spark[server]'" in out.stderr and "is not installed" in out.stderr
