"""Executes a notebook in place, keeping its outputs: python execute_notebook.py NB."""
import os, sys, nbformat, nbclient
path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}}).execute()
nbformat.write(nb, path)
print("executed", path)
# Drop the C++ start-up log lines TensorFlow prints on stderr before absl logging starts,
# matplotlib's notes about fonts this machine lacks, and XLA's notes that it
# drops asserts (the VM's overflow check; see docs/backends.md, "Recursion
# depth").
nb = nbformat.read(path, as_version=4)
for cell in nb.cells:
    if cell.cell_type == "code":
        cell.outputs = [o for o in cell.outputs if not (o.get("name") == "stderr" and ("absl::InitializeLog" in o.text or "cuda" in o.text or o.text.startswith("findfont:") or "Ignoring Assert operator" in o.text))]
nbformat.write(nb, path)
