"""Cells and metadata shared by the builders of the Colab notebooks.

Every tutorial starts with the same first cell: on Colab it installs
tfp_autobatch from its repository (the one the README's badges point to,
or $TFP_AUTOBATCH_REPO) (plus the notebook's own extra packages),
elsewhere it does nothing; and it reads the size flag TAB_NOTEBOOK_SMALL=1
that keeps test runs short. The builders (`build_*.py` beside this file) are
run as scripts, so they import this module by its bare name.
"""
import os

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

SIZE_FLAG = "TAB_NOTEBOOK_SMALL"
REPOSITORY_VARIABLE = "TFP_AUTOBATCH_REPO"
# Where the README's Colab badges point; TFP_AUTOBATCH_REPO overrides it.
DEFAULT_REPOSITORY = "https://github.com/tfp-autobatch/tfp_autobatch"


def install_cell(extra_requirements=()):
  """The first code cell: install on Colab, set `SMALL` everywhere.

  Args:
    extra_requirements: pip requirement strings the notebook needs beyond
      tfp_autobatch's own dependencies (e.g. "arviz>=0.21").
  """
  packages = " ".join(['"git+$REPOSITORY"']
                      + [f'"{r}"' for r in extra_requirements])
  return new_code_cell(f"""\
# On Colab, install tfp_autobatch from its repository; elsewhere do nothing.
import os, sys
if "google.colab" in sys.modules:
    # Another copy of the repository: %env {REPOSITORY_VARIABLE}=<its git URL>
    REPOSITORY = os.environ.get("{REPOSITORY_VARIABLE}", "{DEFAULT_REPOSITORY}")
    !pip install -q {packages}
# A size flag keeps test runs short: {SIZE_FLAG}=1.
SMALL = os.environ.get("{SIZE_FLAG}", "0") == "1\"""")


def write_notebook(cells, filename):
  """Writes `cells` as colab/<filename> (unexecuted) and returns its path."""
  notebook = new_notebook(cells=cells, metadata={
      "kernelspec": {"name": "python3", "display_name": "Python 3",
                     "language": "python"},
      "colab": {"provenance": []}})
  path = os.path.normpath(os.path.join(os.path.dirname(__file__), "..",
                                       filename))
  nbformat.write(notebook, path)
  return path
