"""TFP's reference autobatching, used as a peer to benchmark against.

TensorFlow Probability 0.25 still ships the original program-counter
autobatching system (Radul et al. 2020) under
`tensorflow_probability.python.experimental.auto_batching`.  This module uses
it *only through its own public API* (`Context`, `@ctx.batch(type_inference=...)`,
`TensorFlowBackend`, `NumpyBackend`), exactly as one of its users would, to give
`benchmarks.programs` an independent baseline.  Nothing here is derived from
its implementation.

Programs (one example each; the batch dimension is added by TFP):

- ``fib(n)``: naive doubly recursive Fibonacci, ``fib(0)=0, fib(1)=1``.
- ``collatz(n)``: number of Collatz steps until ``n == 1`` (``0`` for ``n=1``).
  TFP's frontend understands ``if``/``return``/assignments and calls between
  decorated functions, but not ``while`` loops, so the loop is written the way
  a TFP user has to write it: as a tail-recursive function carrying the step
  counter.  After TFP's stack optimisation this tail call needs only a
  constant stack depth (3 suffices, measured; 2 overflows).

TFP's frontend requires a type signature for every batched function: a
``type_inference`` callable that receives the list of argument types
(`instructions.Type`) and returns the type of the (single) return value.

Modes of execution:

- ``"graph"``: the batched call is staged in one ``tf.function`` (TFP's VM
  becomes a ``tf.while_loop`` over basic blocks).
- ``"xla"``: the same ``tf.function`` with ``jit_compile=True``.  Note: XLA drops
  TF ``Assert`` ops, so a stack overflow gives silently wrong answers there;
  the benchmark checks every result against plain Python.
- ``"eager"``: TFP's VM stepping eagerly from Python (slow; for debugging).
- ``"numpy"``: TFP's `NumpyBackend` (pure NumPy, no TensorFlow).

Run ``python -m benchmarks.tfp_reference_programs`` to check all programs and
modes against plain Python on a few inputs.
"""

import sys

import numpy as np
import tensorflow as tf
from tensorflow_probability.python.experimental import auto_batching as tfp_ab

PROGRAMS = ("fib", "collatz")
MODES = ("graph", "xla", "eager", "numpy")

# TFP's VM keeps dense stacks of shape [max_stack_depth, batch, ...]; their
# cost grows with the depth (fib at batch 1024 under XLA ran ~3x slower with
# depth 24 than with 16, on a shared machine), so the defaults are tight for the benchmark's input
# ranges, with a little margin: fib(n) for n < 15 recurses about n deep (depth
# 10 overflows at n = 12; 16 is enough for n = 14); the collatz tail call needs
# depth 3 whatever n is.  Overflow raises an InvalidArgumentError in "graph"
# mode but returns wrong numbers silently under "xla"; with depth 1 a collatz
# call did not terminate at all (observed with TFP 0.25).
DEFAULT_MAX_STACK_DEPTH = {"fib": 16, "collatz": 8}


# ---------------------------------------------------------------------------
# Plain-Python ground truth (exact integer arithmetic).
# ---------------------------------------------------------------------------

def _fib_int(n):
  """`fib` as defined recursively below: `n` if `n <= 1`, else the sum."""
  n = int(n)
  if n <= 1:
    return n
  a, b = 0, 1
  for _ in range(n):
    a, b = b, a + b
  return a


def _collatz_int(n):
  n = int(n)
  steps = 0
  while n != 1:
    n = n // 2 if n % 2 == 0 else 3 * n + 1
    steps += 1
  return steps


_PLAIN = {"fib": _fib_int, "collatz": _collatz_int}


def plain_python(program_name, xs):
  """Ground truth: `program_name` applied to each element of `xs` in Python.

  For ``fib`` with ``n <= 1`` the result is ``n`` (as in the recursive
  definition ``if n <= 1: return n``).
  """
  fn = _PLAIN[program_name]
  xs = np.asarray(xs)
  return np.asarray([fn(x) for x in xs.reshape(-1)],
                    dtype=xs.dtype).reshape(xs.shape)


# ---------------------------------------------------------------------------
# The programs, written for TFP's frontend.  Each builder makes a fresh
# `Context`, so every `make_tfp_reference` call pays TFP's conversion again.
# ---------------------------------------------------------------------------

def _same_type_as_arg(index):
  """A TFP `type_inference`: the result has the type of argument `index`."""
  def type_inference(arg_types):
    return arg_types[index]
  return type_inference


def _build_fib():
  """Returns TFP-batched `fib(n)` in its own `Context`."""
  ctx = tfp_ab.Context()

  @ctx.batch(type_inference=_same_type_as_arg(0))
  def fib(n):
    if n <= 1:
      return n
    else:
      return fib(n - 1) + fib(n - 2)

  return fib


def _build_collatz():
  """Returns TFP-batched `collatz_loop(n, steps)` in its own `Context`."""
  ctx = tfp_ab.Context()

  # `while n != 1: ...` written as a tail call, since TFP's frontend has no
  # loops.
  @ctx.batch(type_inference=_same_type_as_arg(1))
  def collatz_loop(n, steps):
    if n == 1:
      return steps
    else:
      if n % 2 == 0:
        return collatz_loop(n // 2, steps + 1)
      else:
        return collatz_loop(3 * n + 1, steps + 1)

  return collatz_loop


def _entry_point(program_name, max_stack_depth, backend):
  """Returns `f(n_batch_tensor) -> result tensor` calling TFP's batched code."""
  if program_name == "fib":
    fib = _build_fib()

    def run_fib(n):
      return fib(n, max_stack_depth=max_stack_depth, backend=backend)
    return run_fib
  if program_name == "collatz":
    collatz_loop = _build_collatz()

    def run_collatz(n):
      if isinstance(backend, tfp_ab.NumpyBackend):
        steps = np.zeros_like(n)
      else:
        steps = tf.zeros_like(n)
      return collatz_loop(n, steps, max_stack_depth=max_stack_depth,
                          backend=backend)
    return run_collatz
  raise ValueError("Unknown program {!r}; expected one of {}".format(
      program_name, PROGRAMS))


def make_tfp_reference(program_name, mode="xla", max_stack_depth=None):
  """TFP-reference-batched `program_name` as `f(np_array) -> np.ndarray`.

  Args:
    program_name: one of `PROGRAMS`.
    mode: one of `MODES` ("graph", "xla", "eager", "numpy").
    max_stack_depth: TFP VM stack depth; default
      `DEFAULT_MAX_STACK_DEPTH[program_name]`.

  Returns:
    A callable taking a 1-D integer NumPy array (the batch) and returning a
    NumPy array of the same shape and dtype.  Each call with a new batch size
    retraces (and, for "xla", recompiles) the staged function.
  """
  if mode not in MODES:
    raise ValueError("Unknown mode {!r}; expected one of {}".format(
        mode, MODES))
  if max_stack_depth is None:
    max_stack_depth = DEFAULT_MAX_STACK_DEPTH[program_name]
  if mode == "numpy":
    run = _entry_point(program_name, max_stack_depth, tfp_ab.NumpyBackend())

    def f_numpy(xs):
      return np.asarray(run(np.asarray(xs)))
    return f_numpy

  run = _entry_point(program_name, max_stack_depth, tfp_ab.TensorFlowBackend())
  if mode == "graph":
    run = tf.function(run, autograph=False)
  elif mode == "xla":
    run = tf.function(run, autograph=False, jit_compile=True)

  def f(xs):
    return run(tf.convert_to_tensor(np.asarray(xs))).numpy()
  return f


def verify(programs=PROGRAMS, modes=("graph", "xla"), verbose=True):
  """Checks the TFP reference against plain Python on a few inputs.

  Returns:
    A list of `(program, mode, ok)` tuples.
  """
  inputs = {
      "fib": np.array([0, 1, 2, 3, 7, 4, 5, 10, 14], dtype=np.int32),
      "collatz": np.array([1, 2, 3, 6, 7, 27, 97, 871, 999], dtype=np.int32),
  }
  results = []
  for program_name in programs:
    expected = plain_python(program_name, inputs[program_name])
    for mode in modes:
      got = make_tfp_reference(program_name, mode)(inputs[program_name])
      ok = got.shape == expected.shape and np.array_equal(got, expected)
      results.append((program_name, mode, ok))
      if verbose:
        print("tfp_reference:{:<6} {:<8} {}  got={} expected={}".format(
            mode, program_name, "OK " if ok else "BAD", got.tolist(),
            expected.tolist()))
  return results


if __name__ == "__main__":
  _results = verify(modes=MODES)
  sys.exit(0 if all(ok for _, _, ok in _results) else 1)
