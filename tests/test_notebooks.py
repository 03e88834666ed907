"""Every report notebook in ``analyses/`` runs top to bottom on a fresh kernel, in fast mode.

The kernel is this interpreter (``sys.executable``), through a kernelspec written to a temporary
``JUPYTER_PATH`` entry, so a fresh virtual environment needs nothing installed with
``ipykernel install``. The notebooks run with ``HEADSCOPE_FAST=1`` (tiny probes) and
``HF_HUB_OFFLINE=1``, from the ``analyses/`` folder; a cell that raises fails the test and the
error names the cell.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real

ANALYSES = Path(__file__).resolve().parent.parent / "analyses"
NOTEBOOKS = sorted(ANALYSES.glob("*.ipynb"))
KERNEL = "headscope-test-python3"
CELL_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def jupyter_path(tmp_path_factory) -> str:
    """A Jupyter data folder whose kernelspec starts ``ipykernel`` with this very interpreter."""
    pytest.importorskip("ipykernel")
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "headscope tests",
                "language": "python",
            }
        )
    )
    return str(root)


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks in {ANALYSES}"


def _execute(path: Path, jupyter_path: str, monkeypatch) -> None:
    """Run the notebook at ``path`` on a fresh kernel in fast mode; fail the test on any cell
    error."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("JUPYTER_PATH", jupyter_path)  # our kernelspec is found there
    monkeypatch.setenv("HEADSCOPE_FAST", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:  # start from a clean notebook: saved outputs play no part
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = nbclient.NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:
        client.execute()
    except CellExecutionError as exc:
        pytest.fail(f"{path.name}: a cell failed:\n{exc}", pytrace=False)
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type == "error"
    ]
    assert not errors, f"{path.name}: {errors[0].ename}: {errors[0].evalue}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_in_fast_mode(path: Path, jupyter_path: str, monkeypatch):
    _execute(path, jupyter_path, monkeypatch)


def test_a_failing_cell_fails_the_test(tmp_path, jupyter_path: str, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import os\nassert os.environ['HEADSCOPE_FAST'] == '1'"),
        nbformat.v4.new_code_cell("raise ValueError('broken on purpose')"),
    ]
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(pytest.fail.Exception, match="broken on purpose"):
        _execute(path, jupyter_path, monkeypatch)
