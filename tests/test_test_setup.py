"""The test suite's own set-up (`conftest.py`)."""
import datetime
import os
import subprocess
import sys

import pytest

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _run(args, cache_home, cwd):
  env = dict(os.environ, XDG_CACHE_HOME=str(cache_home),
             PYTHONPATH=os.pathsep.join(
                 [_TESTS_DIR, os.environ.get("PYTHONPATH", "")]))
  return subprocess.run([sys.executable, *args], env=env, cwd=cwd,
                        capture_output=True, text=True, timeout=300,
                        check=False)


def test_arviz_writes_its_daily_stamp_before_any_worker_starts(tmp_path):
  """ArviZ 0.23 writes a once-a-day stamp on import through a temporary
  file of a fixed name; two pytest-xdist workers importing it at once on
  a new day failed a CI run's collection. The controller's
  `pytest_configure` now imports it first, so the stamp is there before
  collection, even of tests that never import ArviZ."""
  probe = tmp_path / "probe"
  done = _run(["-c", "import arviz"], probe, tmp_path)
  assert done.returncode == 0, done.stderr
  if not (probe / "arviz" / "daily_warning").exists():
    pytest.skip("this ArviZ writes no daily stamp: nothing can race")
  (tmp_path / "test_plain.py").write_text("def test_plain():\n  pass\n")
  cache = tmp_path / "cache"
  done = _run(["-m", "pytest", "-p", "conftest", "--collect-only", "-q",
               "-p", "no:cacheprovider", "test_plain.py"], cache, tmp_path)
  assert done.returncode == 0, done.stdout + done.stderr
  stamp = cache / "arviz" / "daily_warning"
  assert stamp.read_text().strip() == datetime.date.today().isoformat()
