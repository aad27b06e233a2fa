"""The test suite's own set-up (`conftest.py`)."""
import datetime
import os

import pytest

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _stamp_after(cache_home, code):
  """A script that runs `code` with ArviZ's cache under `cache_home`, then
  prints (as JSON) its daily stamp's text, or None where it wrote none."""
  return f"""
import json, os, sys
os.environ["XDG_CACHE_HOME"] = {str(cache_home)!r}
{code}
stamp = os.path.join({str(cache_home)!r}, "arviz", "daily_warning")
print(json.dumps(open(stamp).read().strip() if os.path.exists(stamp)
                 else None))
"""


def test_arviz_writes_its_daily_stamp_before_any_worker_starts(
    tmp_path, fresh_python):
  """ArviZ 0.23 writes a once-a-day stamp on import through a temporary
  file of a fixed name; two pytest-xdist workers importing it at once on
  a new day failed a CI run's collection. The controller's
  `pytest_configure` now imports it first, so the stamp is there before
  collection, even of tests that never import ArviZ."""
  if fresh_python(_stamp_after(tmp_path / "probe", "import arviz")) is None:
    pytest.skip("this ArviZ writes no daily stamp: nothing can race")
  (tmp_path / "test_plain.py").write_text("def test_plain():\n  pass\n")
  stamp = fresh_python(_stamp_after(tmp_path / "cache", f"""
import pytest
sys.path.insert(0, {_TESTS_DIR!r})
assert pytest.main(["-p", "conftest", "-p", "no:cacheprovider",
                    "--collect-only", "-q", "test_plain.py"]) == 0
"""))
  assert stamp == datetime.date.today().isoformat()
