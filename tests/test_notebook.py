"""examples/model_selection.ipynb, executed as an analyst runs it (nbclient, a Jupyter
kernel of this Python) against the server: it connects, packs a table, trains a grid,
reads the leaderboard, plots, deploys the best model and predicts by its name.  The file
is kept without outputs."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "model_selection.ipynb"


def test_the_notebook_is_stored_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert len(code) >= 8
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)


def _text(cell) -> str:
    return "".join(output.get("text", "") + "".join(str(v) for v in output.get("data", {}).values())
                   for output in cell.outputs)


def test_the_notebook_runs_against_the_server(extension_dsn, monkeypatch, tmp_path):
    monkeypatch.setenv("MADLIB_MOP_DSN", extension_dsn)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, kernel_name="python3", timeout=900,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert not [o for cell in code for o in cell.outputs if o.output_type == "error"]
    by_source = {cell.source.split("\n")[0]: cell for cell in code}
    board = next(cell for first, cell in by_source.items() if first.startswith("board = "))
    html = board.outputs[0]["data"]["text/html"]
    assert html.split("<tbody>")[1].count("<tr>") == 8  # eight configurations
    figures = [cell for cell in code if any("image/png" in o.get("data", {}) for o in cell.outputs)]
    assert len(figures) == 3  # learning curves, importance, Pareto front
    last = _text(code[-1])
    found = re.search(r"nb_best version 1: accuracy ([0-9.]+) on 120 rows", last)
    assert found, last
    assert float(found.group(1)) > 0.8
    # The same notebook runs again from the top (it drops what it made).
    again = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(again, kernel_name="python3", timeout=900,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert "nb_best version 2" in _text([c for c in again.cells if c.cell_type == "code"][-1])
