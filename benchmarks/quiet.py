"""Quiet output for the benchmarks: they print their own results only.

TensorFlow's C++ start-up lines ("oneDNN custom operations are on", "Could
not find cuda drivers", "Ignoring Assert operator" under XLA) and its Python
warnings (TFP's effective-sample-size estimator casts its FFT's complex128
result; deprecation notices from TensorFlow, TFP and Keras) say nothing
about a benchmark's results. `benchmarks/__init__.py` imports this module
before any benchmark imports TensorFlow, so:

- `TF_CPP_MIN_LOG_LEVEL` is 3 unless the caller set it, and TensorFlow is
  imported with stderr pointed at /dev/null, since the lines it writes
  before absl's logging starts ignore that variable (an error raised by
  the import itself still propagates, with its traceback);
- `silence_peers()`, which each benchmark's `main` calls, quietens
  TensorFlow's and absl's Python loggers and the warnings of the peers'
  modules (never `tfp_autobatch`'s or `nuts`' own).
"""
import contextlib
import logging
import os
import warnings

from absl import logging as absl_logging

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# The peers whose warnings a benchmark's reader has no use for.
PEER_MODULES = r"(tensorflow|tensorflow_probability|tf_keras|keras|absl|arviz)"


@contextlib.contextmanager
def _stderr_to_devnull():
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


with _stderr_to_devnull():
  import tensorflow as tf  # pylint: disable=wrong-import-position


def silence_peers():
  """Quieten TensorFlow's Python logging and the peers' warnings."""
  tf.get_logger().setLevel(logging.ERROR)
  absl_logging.set_verbosity(absl_logging.ERROR)
  for category in (DeprecationWarning, PendingDeprecationWarning,
                   FutureWarning, UserWarning):
    warnings.filterwarnings("ignore", category=category, module=PEER_MODULES)
