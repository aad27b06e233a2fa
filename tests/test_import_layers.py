"""The package's import structure (`.importlinter` at the repository root):
tfp_autobatch's layers import only downwards, nuts uses only the public API,
and no module imports one of ours inside a function to dodge a cycle."""
import ast
import os
import pathlib
import subprocess
import sys

import tfp_autobatch

_REPO = pathlib.Path(tfp_autobatch.__file__).resolve().parent.parent

# Optional dependencies a function may import where it needs them (ArviZ
# 1.x's parts and its xarray included).
_LAZY_ALLOWED = ("arviz", "arviz_base", "arviz_stats", "xarray", "tqdm",
                 "dynet", "matplotlib")


def test_the_import_linter_contracts_are_kept():
  lint_imports = pathlib.Path(sys.executable).parent / "lint-imports"
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
      [str(_REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                      if p])
  result = subprocess.run(
      [str(lint_imports), "--no-cache", "--config",
       str(_REPO / ".importlinter")],
      cwd=_REPO, env=env, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "0 broken" in result.stdout


def _function_level_imports(path, root=_REPO):
  tree = ast.parse(path.read_text(), filename=str(path))
  found = []
  for fn in ast.walk(tree):
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    for node in ast.walk(fn):
      if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom):
        names = [node.module or "."] if node.level == 0 else ["."]
      else:
        continue
      if not all(n.split(".")[0] in _LAZY_ALLOWED for n in names):
        found.append(f"{path.relative_to(root)}:{node.lineno}: "
                     f"{ast.unparse(node)}")
  return found


def test_no_module_imports_inside_a_function():
  found = []
  for package in ("tfp_autobatch", "nuts"):
    for path in sorted((_REPO / package).rglob("*.py")):
      found += _function_level_imports(path)
  assert not found, "imports inside functions:\n" + "\n".join(found)


def test_the_function_level_import_check_finds_one(tmp_path):
  path = tmp_path / "probe.py"
  path.write_text("from tfp_autobatch import errors\n"
                  "def f():\n  from tfp_autobatch import api\n"
                  "def g():\n  import tqdm\n")
  found = _function_level_imports(path, root=tmp_path)
  assert len(found) == 1 and "tfp_autobatch import api" in found[0]
