"""The Colab tutorials run top to bottom (at small sizes) without errors."""
import os
import pathlib

import nbclient
import nbformat
import pytest

COLAB = pathlib.Path(__file__).resolve().parent.parent / "colab"
NOTEBOOKS = sorted(COLAB.glob("*.ipynb"))


def test_there_are_notebooks():
  assert [p.name for p in NOTEBOOKS if "autobatching" in p.name]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch):
  monkeypatch.setenv("TAB_NOTEBOOK_SMALL", "1")
  notebook = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(notebook, timeout=900,
                                   kernel_name="python3",
                                   resources={"metadata": {"path": str(COLAB)}})
  client.execute()   # raises CellExecutionError on any error
  outputs = [o for cell in notebook.cells if cell.cell_type == "code"
             for o in cell.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
