"""The notebooks run top to bottom against a fresh local cluster (nbclient).

Each notebook starts its own 3-node cluster and SparkSession (``history.Sandbox``)
and asserts what it shows; a failing cell fails the test with the cell's error.
``compacted_state.ipynb`` runs in ``tests/test_readme.py`` instead, against the
README tour's cluster (``RMQ_ENDPOINTS`` set, as a reader who followed the tour
would run it), with the same checks (``check_outputs``): running it here too
cost the suite ~50 s for the same cells. Its sandbox start is the one
``retained_history.ipynb`` uses (``history.Sandbox``), which runs here.
"""
from __future__ import annotations

import os
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.integration]

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")


RUN_BY_THE_README_TOUR = {"compacted_state.ipynb"}


def check_outputs(nb) -> None:
    """No cell failed and the notebook shows at least one plot."""
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
               for o in outputs), "the notebook shows no plot"


def test_every_notebook_is_run_here_or_by_the_readme_tour():
    names = {n for n in os.listdir(NOTEBOOKS) if n.endswith(".ipynb")}
    assert RUN_BY_THE_README_TOUR <= names and names - RUN_BY_THE_README_TOUR


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(NOTEBOOKS)
                                        if n.endswith(".ipynb") and n not in RUN_BY_THE_README_TOUR))
def test_notebook_runs(name, monkeypatch, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.delenv("RMQ_ENDPOINTS", raising=False)
    nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    check_outputs(nb)
