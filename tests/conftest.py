"""Shared pytest setup: quiet TensorFlow, make `tests/` importable, register marks."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# A primitive that pfor cannot vectorise is an error in tests, not a silent
# sequential loop over the batch (pfor's fallback, e.g. for `xs[i]` with a
# per-example `i` or a stateless random op with per-example seeds).
os.environ.setdefault("TFP_AUTOBATCH_STRICT_PFOR", "1")
# `verify` runs after every compiler pass (pipeline.py).
os.environ.setdefault("TFP_AUTOBATCH_DEBUG", "1")

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
  sys.path.insert(0, _TESTS_DIR)  # so that `import programs` works in any import mode


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "slow: takes more than ~10 s; deselect with -m 'not slow'")
  config.addinivalue_line(
      "markers", "nightly: takes minutes; `make test` leaves it out, "
      "`make test-nightly` runs it")
