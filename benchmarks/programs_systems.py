"""The programs and systems the programs benchmark (`benchmarks/programs.py`)
times: `fib` and `collatz` decorated as a user would, their inputs
(`make_inputs`), and each system as `call(xs: np.ndarray) -> np.ndarray`
(`make_callable`), except `python_loop`, timed one example at a time by
`time_python_loop`.  If tfp_autobatch cannot be imported or cannot convert
the programs, `TAB_ERROR` says why and its systems are skipped.
"""
import time

import numpy as np
import tensorflow as tf

from benchmarks import tfp_reference_programs as tfp_ref

# ---------------------------------------------------------------------------
# Our programs.  Defined at module level with the decorator, as a user would.
# If the package is missing or cannot convert them, its systems are skipped.
# ---------------------------------------------------------------------------

TAB_ERROR = None
OUR_PROGRAMS = {}
try:
  import tfp_autobatch as tab
except Exception as e:  # pylint: disable=broad-except
  tab = None
  TAB_ERROR = "cannot import tfp_autobatch: {!r}".format(e)

if tab is not None:
  try:

    @tab.batch(max_stack_depth=tfp_ref.DEFAULT_MAX_STACK_DEPTH["fib"])
    def fib(n):
      if n <= 1:
        return n
      return fib(n - 1) + fib(n - 2)

    @tab.batch(max_stack_depth=tfp_ref.DEFAULT_MAX_STACK_DEPTH["collatz"])
    def collatz(n):
      steps = tf.zeros_like(n)
      while n != 1:
        if n % 2 == 0:
          n = n // 2
        else:
          n = 3 * n + 1
        steps += 1
      return steps

    OUR_PROGRAMS = {"fib": fib, "collatz": collatz}
  except Exception as e:  # pylint: disable=broad-except
    TAB_ERROR = "tfp_autobatch cannot decorate the programs: {!r}".format(e)

# Inputs: name -> (low, high) for n uniform in [low, high).
DEFAULT_RANGES = {"fib": (5, 15), "collatz": (1, 1000)}
INPUT_DTYPE = np.int32
PROGRAMS = tuple(DEFAULT_RANGES)
DEFAULT_SYSTEMS = ("local:eager", "local:eager_xla", "pc:xla",
                   "tfp_reference:graph", "tfp_reference:xla", "python_loop")


class SkipSystem(Exception):
  """A system cannot run this program (unknown, failed, too slow)."""


def make_inputs(program, size, seed=0, ranges=None):
  """`size` inputs for `program`, the same for all systems given the seed."""
  low, high = (ranges or DEFAULT_RANGES)[program]
  rng = np.random.default_rng([seed, PROGRAMS.index(program)])
  return rng.integers(low, high, size=size).astype(INPUT_DTYPE)


def available_backends():
  """Our backend names, or () when the package is unavailable."""
  if tab is None:
    return ()
  return tuple(getattr(tab, "BACKENDS", ()))


# ---------------------------------------------------------------------------
# Systems: each becomes `call(xs: np.ndarray) -> np.ndarray`.
# ---------------------------------------------------------------------------

def _to_numpy(value):
  if hasattr(value, "numpy"):
    return value.numpy()
  return np.asarray(value)


def _our_callable(program, backend):
  if TAB_ERROR is not None:
    raise SkipSystem(TAB_ERROR)
  if backend not in available_backends():
    raise SkipSystem(
        "backend {!r} is not in tfp_autobatch.BACKENDS {}".format(
            backend, list(available_backends())))
  fn = OUR_PROGRAMS[program]

  def call(xs):
    return _to_numpy(fn(xs, backend=backend))
  return call


def stats_summary(stats):
  """A JSON-able summary of `fn.last_stats` (whatever its form)."""
  if stats is None:
    return None
  out = {}
  for key in ("batch_size", "steps", "active_members", "max_stack_depth",
              "mean_active", "utilization"):
    try:
      value = getattr(stats, key)
    except Exception:  # pylint: disable=broad-except
      continue
    try:
      value = _to_numpy(value).item()
    except Exception:  # pylint: disable=broad-except
      value = str(value)
    out[key] = value
  if not out:
    out["repr"] = str(stats)
  return out


def system_kind(system):
  if system == "python_loop":
    return "python_loop"
  if system.startswith("tfp_reference:"):
    return "tfp_reference"
  return "ours"


def make_callable(program, system):
  kind = system_kind(system)
  if kind == "tfp_reference":
    mode = system.split(":", 1)[1]
    if mode not in tfp_ref.MODES:
      raise SkipSystem("unknown tfp_reference mode {!r}; modes: {}".format(
          mode, list(tfp_ref.MODES)))
    return tfp_ref.make_tfp_reference(program, mode)
  return _our_callable(program, system)


def time_python_loop(program, xs, repeats, slow_call_sec=float("inf")):
  """Per-example loop over `xs` with `fn.run_unbatched` (eager TF).

  Returns `(outputs, first pass seconds, [seconds per timed pass])`; when the
  first pass takes longer than `slow_call_sec` only one pass is timed.
  """
  if TAB_ERROR is not None:
    raise SkipSystem(TAB_ERROR)
  fn = OUR_PROGRAMS[program]
  if not hasattr(fn, "run_unbatched"):
    raise SkipSystem("tfp_autobatch functions have no run_unbatched")
  examples = [tf.constant(x) for x in xs]

  def one_pass():
    return np.array([_to_numpy(fn.run_unbatched(e)) for e in examples],
                    dtype=xs.dtype)

  start = time.perf_counter()
  first_out = one_pass()
  first_pass_sec = time.perf_counter() - start
  times = []
  for _ in range(1 if first_pass_sec > slow_call_sec else repeats):
    start = time.perf_counter()
    one_pass()
    times.append(time.perf_counter() - start)
  return first_out, first_pass_sec, times
