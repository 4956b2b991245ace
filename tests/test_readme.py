"""The README runs top to bottom: every ```bash and ```python block, in order, on one cluster.

Blocks fenced as ```console are shown, not run (``make demo``, starting the
cluster in the foreground, a job that runs until Ctrl-C). The README's sample
endpoints are replaced by this test's cluster's; everything else runs as
written, in a fresh directory that has the project's ``.venv`` (the README
says ``export PATH=$PWD/.venv/bin:$PATH``). Exported variables carry over
from one bash block to the next, as in one shell. Then the compacted-state
notebook runs against the same cluster with ``RMQ_ENDPOINTS`` exported, as a
reader who followed the tour would run it: it must not touch the tour's topics.
The tour's directory then holds what the tour writes and nothing else: no
``spark-warehouse/`` or metastore left by its Spark programs and jobs.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from rmq_spark.client import Client
from storage_service.protocol.placement import http_address

from .conftest import start_cluster
from .test_notebooks import RUN_BY_THE_README_TOUR, check_outputs

pytestmark = [pytest.mark.spark, pytest.mark.integration]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_ENDPOINTS = "127.0.0.1:7000,127.0.0.1:7005,127.0.0.1:7010"
SAMPLE_HTTP = "127.0.0.1:7004"       # node 0's HTTP port in the sample output
# What the tour writes in its directory: its two streaming queries' checkpoints, the
# archive of `rmq tier events` and the table of `rmq compact balances` (beside the
# .venv link this test makes).
TOUR_LEAVES = [".venv", "archive", "balances-table", "orders-live-checkpoint", "orders-upper-checkpoint"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


def readme_blocks() -> list[tuple[str, int, str]]:
    """(language, line number, code) of every ```bash and ```python block, in order."""
    text = open(os.path.join(ROOT, "README.md")).read()
    return [(m.group(1), text.count("\n", 0, m.start()) + 1, m.group(2)) for m in FENCE.finditer(text)
            if m.group(1) in ("bash", "python")]


def test_readme_names_the_sample_endpoints_it_starts():
    text = open(os.path.join(ROOT, "README.md")).read()
    assert f"endpoints: {SAMPLE_ENDPOINTS}" in text and "--port 7000" in text
    assert f"http: http://{SAMPLE_HTTP}," in text
    langs = [lang for lang, _, _ in readme_blocks()]
    assert langs.count("bash") >= 4 and langs.count("python") >= 2


def _run(lang: str, code: str, env: dict, cwd: str, envfile: str) -> subprocess.CompletedProcess:
    if lang == "bash":
        script = f"set -euo pipefail\n{code}\nenv -0 > {envfile}\n"
        return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=900)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


def test_readme_tour_runs_in_order_on_one_cluster(tmp_path):
    cluster = start_cluster(tmp_path / "cluster", groups=4)
    try:
        tour = tmp_path / "tour"
        tour.mkdir()
        os.symlink(os.path.join(ROOT, ".venv"), tour / ".venv")
        env = {k: v for k, v in os.environ.items() if k not in ("RMQ_ENDPOINTS", "PYSPARK_PYTHON")}
        envfile = str(tmp_path / "env")
        for lang, line, code in readme_blocks():
            code = code.replace(SAMPLE_ENDPOINTS, cluster.endpoints).replace(
                SAMPLE_HTTP, http_address(cluster.addresses[0]))
            p = _run(lang, code, env, str(tour), envfile)
            assert p.returncode == 0, (f"README.md line {line} ({lang}) exited {p.returncode}:\n"
                                       f"{p.stderr[-3000:]}")
            if lang == "bash":
                pairs = open(envfile, "rb").read().split(b"\0")
                env = dict(x.decode().split("=", 1) for x in pairs if b"=" in x)
        _check_what_the_tour_says(cluster.endpoints)
        # The tour's Spark programs and its `rmq tier` / `rmq compact` jobs ran in this
        # directory: it holds what the tour writes there and nothing a Spark job leaves on
        # its own (spark-warehouse/, metastore_db/, derby.log).
        assert sorted(os.listdir(tour)) == TOUR_LEAVES
        _run_notebook_on_the_same_cluster(cluster.endpoints, tmp_path)
    finally:
        cluster.stop()


def _check_what_the_tour_says(endpoints: str) -> None:
    with Client(endpoints) as c:
        latest = {o.queue: o.latest for o in c.offsets("orders")}
        assert sum(latest.values()) == 100_001
        assert sum(o.latest for o in c.offsets("orders-upper")) == 100_001        # exactly once
        assert c.committed_offsets("orders-upper", "orders") == latest            # "lag 0"
        assert c.describe_topic("balances")["compacted_table"].endswith("/tour/balances-table")
        assert c.describe_topic("events")["tier"].endswith("/tour/archive")
        web = c.fetch("web-events", 0, 0).records                                 # the curl tour
        assert [(r.key, r.value, r.tags) for r in web] == [(b"u1", b"clicked", ""),
                                                           (None, bytes.fromhex("deadbeef"), "binary")]
        assert c.committed_offsets("dashboard", "web-events") == {0: 1}


def _run_notebook_on_the_same_cluster(endpoints: str, tmp_path) -> None:
    import nbformat
    from nbclient import NotebookClient

    with Client(endpoints) as c:
        before = {t["name"]: sum(o.latest for o in c.offsets(t["name"])) for t in c.list_topics()}
    old = {k: os.environ.get(k) for k in ("RMQ_ENDPOINTS", "PYSPARK_PYTHON")}
    os.environ.update(RMQ_ENDPOINTS=endpoints, PYSPARK_PYTHON=sys.executable)
    try:
        [name] = RUN_BY_THE_README_TOUR
        nb = nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)
        NotebookClient(nb, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    with Client(endpoints) as c:
        after = {t["name"]: sum(o.latest for o in c.offsets(t["name"])) for t in c.list_topics()}
    check_outputs(nb)                                          # the notebook's own test is this one
    assert {t: after[t] for t in before} == before            # the tour's topics untouched
    assert any(t.startswith("nb-balances-") for t in after)
