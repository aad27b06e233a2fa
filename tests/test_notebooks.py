"""The Colab tutorials: committed with their outputs, and they run top to
bottom (at small sizes) without errors."""
import pathlib
import sys

import nbclient
import nbformat
import pytest

COLAB = pathlib.Path(__file__).resolve().parent.parent / "colab"
NOTEBOOKS = sorted(COLAB.glob("*.ipynb"))
sys.path.insert(0, str(COLAB / "tools"))
import notebook_cells  # pylint: disable=wrong-import-position


def _code_cells(notebook):
  return [cell for cell in notebook.cells if cell.cell_type == "code"]


def test_there_are_notebooks():
  assert sorted(p.name for p in NOTEBOOKS) == [
      "autobatching_tutorial.ipynb", "dynamic_networks.ipynb",
      "nuts_tutorial.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_first_cell_installs_on_colab_and_reads_the_size_flag(path):
  first = _code_cells(nbformat.read(path, as_version=4))[0].source
  assert '"google.colab" in sys.modules' in first
  assert "!pip install" in first
  assert notebook_cells.SIZE_FLAG in first
  # With no setting, it installs from the repository the badges open.
  assert notebook_cells.DEFAULT_REPOSITORY in first


def test_badges_open_the_repository_the_notebooks_install():
  readme = (COLAB.parent / "README.md").read_text()
  repository = notebook_cells.DEFAULT_REPOSITORY.removeprefix(
      "https://github.com/")
  for path in NOTEBOOKS:
    badge = ("https://colab.research.google.com/github/"
             f"{repository}/blob/main/colab/{path.name}")
    assert badge in readme, f"README has no Colab badge {badge}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_holds_its_outputs(path):
  # GitHub shows the committed outputs: every code cell ran, in order, once,
  # none failed, and the plots are there. Re-run
  # `python colab/tools/execute_notebook.py <notebook>` after rebuilding.
  cells = _code_cells(nbformat.read(path, as_version=4))
  counts = [cell.get("execution_count") for cell in cells]
  assert counts == list(range(1, len(cells) + 1)), (
      f"{path.name} is not executed top to bottom: execution counts {counts}")
  outputs = [o for cell in cells for o in cell.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  assert any("image/png" in o.get("data", {}) for o in outputs), (
      f"{path.name} has no saved plot")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch):
  monkeypatch.setenv(notebook_cells.SIZE_FLAG, "1")
  notebook = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(notebook, timeout=900,
                                   kernel_name="python3",
                                   resources={"metadata": {"path": str(COLAB)}})
  client.execute()   # raises CellExecutionError on any error
  outputs = [o for cell in _code_cells(notebook)
             for o in cell.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
