"""Shared pytest setup: quiet TensorFlow, make `tests/` importable, register
marks, a fixture that runs a script in a fresh Python process, and one
that counts a class's constructions."""
import inspect
import json
import os
import subprocess
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# A primitive that pfor cannot vectorise is an error in tests, not a silent
# sequential loop over the batch (pfor's fallback, e.g. for `xs[i]` with a
# per-example `i` or a stateless random op with per-example seeds).
os.environ.setdefault("TFP_AUTOBATCH_STRICT_PFOR", "1")
# `verify` runs after every compiler pass (pipeline.py).
os.environ.setdefault("TFP_AUTOBATCH_DEBUG", "1")

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
  # So that `import example_programs` works in any import mode.
  sys.path.insert(0, _TESTS_DIR)


def _write_arviz_daily_stamp():
  """Imports ArviZ once, here, so that it writes its once-a-day stamp file
  before pytest-xdist's workers start: ArviZ 0.23 writes the stamp on
  import through a temporary file of a fixed name, and two workers
  importing it at once on a new day could both write and rename that
  file, failing one worker's collection with FileNotFoundError."""
  import warnings  # pylint: disable=import-outside-toplevel
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import arviz  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import


def pytest_configure(config):
  if not hasattr(config, "workerinput"):   # the controller, or no xdist
    _write_arviz_daily_stamp()
  config.addinivalue_line(
      "markers", "slow: takes more than ~10 s; deselect with -m 'not slow'")
  config.addinivalue_line(
      "markers", "nightly: takes minutes; `make test` leaves it out, "
      "`make test-nightly` runs it")


@pytest.fixture
def fresh_python(tmp_path):
  """`run(script)`: runs `script` in a new Python process (in `tmp_path`),
  which imports only what the script does, and returns the JSON value its
  last printed line holds."""
  def run(script):
    done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, check=True, cwd=str(tmp_path),
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    return json.loads(done.stdout.strip().splitlines()[-1])
  return run


@pytest.fixture
def constructions(monkeypatch):
  """`count(cls)`: a list that gets an entry at each `cls(...)` from now
  on (TFP's composite tensors run their constructors when rebuilt)."""
  def count(cls):
    built = []
    init = cls.__init__
    def counting_init(self, *args, **kwargs):
      built.append(1)
      init(self, *args, **kwargs)
    # TFP's composite tensors read their parameters off __init__'s
    # signature.
    counting_init.__signature__ = inspect.signature(init)
    monkeypatch.setattr(cls, "__init__", counting_init)
    return built
  return count
