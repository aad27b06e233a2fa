"""Differential tests: every backend against two independent answers.

For each program of `example_programs.PROGRAMS`, each backend of `tab.BACKENDS`
and each batch size, a batched call must equal

  * `fn.reference(*inputs)`, the reference interpreter run example by example
    (the source of truth), and
  * a plain Python loop that runs the original function eagerly on each
    example (`fn.run_unbatched`) and stacks the results.

Both answers are backend independent, so they are computed once per
(program, batch size). The loop itself is checked against each program's
NumPy oracle, so a broken `run_unbatched` cannot make the suite vacuous.
Integers and booleans must match exactly, floats to a tight tolerance, and
dtypes, shapes and (named)tuple structure must be as declared.
"""
import functools
import zlib

import numpy as np
import pytest
import tensorflow as tf

import example_programs
import tfp_autobatch as tab

# (program, backend) pairs that take more than ~10 s on a 2-core CPU: the
# longest loops and deepest call trees, run op by op by the debugging VM.
SLOW = frozenset([
    ("count_loop", "pc:eager"),
    ("collatz_steps", "pc:eager"),
    ("sum_fibs", "pc:eager"),
    ("call_two", "pc:eager"),
    ("fib", "pc:eager"),
    ("tree_depth_sum", "pc:eager"),
])

# The empty batch is tested on programs with every kind of output: scalars of
# each dtype, bool, tuples, namedtuples, per-example vectors.
EMPTY_BATCH_PROGRAMS = ("fib", "factorial", "power", "is_even", "fib_pair", "count_loop",
                        "divmod_loop", "rotate_point", "stats_above", "vec_stats",
                        "halve_until_small", "finish_at_once")

# Backend results against the reference and the per-example loop.
TOLERANCE = {tf.float32: dict(rtol=1e-5, atol=1e-6),
             tf.float64: dict(rtol=1e-12, atol=1e-12)}
# The per-example loop against a NumPy/Python oracle (different arithmetic).
ORACLE_TOLERANCE = {tf.float32: dict(rtol=1e-5, atol=1e-5),
                    tf.float64: dict(rtol=1e-9, atol=1e-12)}


def _backend_id(backend):
  return backend.replace(":", "-")  # `-k` cannot parse a colon


PROGRAM_CASES = [pytest.param(p.name, b, id=f"{p.name}-B{b}")
                 for p in example_programs.PROGRAMS for b in p.batch_sizes]
BACKEND_CASES = [
    pytest.param(p.name, b, backend, id=f"{p.name}-B{b}-{_backend_id(backend)}",
                 marks=[pytest.mark.slow] if (p.name, backend) in SLOW else [])
    for p in example_programs.PROGRAMS for b in p.batch_sizes for backend in tab.BACKENDS]
assert set(EMPTY_BATCH_PROGRAMS) <= set(example_programs.PROGRAMS_BY_NAME)
EMPTY_CASES = [pytest.param(name, backend, id=f"{name}-{_backend_id(backend)}")
               for name in EMPTY_BATCH_PROGRAMS for backend in tab.BACKENDS]


# ---------------------------------------------------------------------------
# Backend-independent answers, computed once per (program, batch size).


@functools.lru_cache(maxsize=None)
def batch_inputs(name, batch_size):
  rng = np.random.default_rng(zlib.crc32(f"{name}/{batch_size}".encode()))
  return example_programs.PROGRAMS_BY_NAME[name].make_inputs(batch_size, rng)


def member(inputs, i):
  """The positional arguments of example `i`, as tensors without a batch dim."""
  return tuple(tf.nest.map_structure(lambda a: tf.constant(a[i]), x) for x in inputs)


def to_numpy(result):
  return tf.nest.map_structure(np.asarray, result)


def stack(results):
  return tf.nest.map_structure(lambda *leaves: np.stack([np.asarray(l) for l in leaves]),
                               *results)


@functools.lru_cache(maxsize=None)
def python_loop(name, batch_size):
  """The original function run eagerly on each example, results stacked."""
  fn = example_programs.PROGRAMS_BY_NAME[name].fn
  inputs = batch_inputs(name, batch_size)
  return stack([fn.run_unbatched(*member(inputs, i)) for i in range(batch_size)])


@functools.lru_cache(maxsize=None)
def reference(name, batch_size):
  fn = example_programs.PROGRAMS_BY_NAME[name].fn
  return to_numpy(fn.reference(*batch_inputs(name, batch_size)))


# ---------------------------------------------------------------------------
# Comparison with messages that name the members that differ.


def _describe_members(inputs, rows, limit=5):
  lines = []
  for i in rows[:limit]:
    args = tf.nest.map_structure(lambda a: a[i].tolist(), inputs)
    lines.append(f"  member {i}: inputs {args}")
  if len(rows) > limit:
    lines.append(f"  ... and {len(rows) - limit} more")
  return "\n".join(lines)


def leaf_paths(structure, prefix=""):
  """Names of the leaves of a (named)tuple, in `tf.nest.flatten` order."""
  if not isinstance(structure, tuple):
    return [prefix or "<single>"]
  names = getattr(structure, "_fields", range(len(structure)))
  return [path for name, sub in zip(names, structure)
          for path in leaf_paths(sub, f"{prefix}.{name}" if prefix else str(name))]


def assert_results_match(got, want, prog, inputs, what, tolerance=TOLERANCE):
  """`got` has the declared structure, dtypes and shapes and equals `want`."""
  tf.nest.assert_same_structure(prog.out_dtypes, got, check_types=True)
  tf.nest.assert_same_structure(got, want, check_types=True)
  paths = leaf_paths(prog.out_dtypes)
  for path, dtype, g, w in zip(paths, tf.nest.flatten(prog.out_dtypes),
                               tf.nest.flatten(got), tf.nest.flatten(want)):
    where = f"{prog.name}: {what}, output {path}"
    g, w = np.asarray(g), np.asarray(w)
    assert g.dtype == dtype.as_numpy_dtype, (
        f"{where}: dtype {g.dtype}, expected {dtype.name}")
    assert g.shape == w.shape, f"{where}: shape {g.shape}, expected {w.shape}"
    if dtype.is_floating:
      close = np.isclose(g, w, equal_nan=True, **tolerance[dtype])
    else:
      close = g == w
    rows = np.flatnonzero(~np.all(close, axis=tuple(range(1, close.ndim))))
    assert rows.size == 0, (
        f"{where}: {rows.size} of {g.shape[0]} members differ\n"
        f"  got  {g[rows[:5]].tolist()}\n  want {w[rows[:5]].tolist()}\n"
        + _describe_members(inputs, rows))


# ---------------------------------------------------------------------------
# Tests.


@pytest.mark.parametrize("name, batch_size", PROGRAM_CASES)
def test_python_loop_matches_oracle(name, batch_size):
  """Checks the programs (and `run_unbatched`) against plain NumPy/Python."""
  prog = example_programs.PROGRAMS_BY_NAME[name]
  inputs = batch_inputs(name, batch_size)
  answers = [prog.oracle(*tf.nest.map_structure(lambda a: a[i], inputs))
             for i in range(batch_size)]
  dtypes = tf.nest.flatten(prog.out_dtypes)
  want = tf.nest.pack_sequence_as(prog.out_dtypes, [
      np.array([tf.nest.flatten(a)[k] for a in answers], d.as_numpy_dtype)
      for k, d in enumerate(dtypes)])
  assert_results_match(python_loop(name, batch_size), want, prog, inputs,
                       "run_unbatched loop vs oracle", tolerance=ORACLE_TOLERANCE)


@pytest.mark.parametrize("name, batch_size", PROGRAM_CASES)
def test_reference_matches_python_loop(name, batch_size):
  prog = example_programs.PROGRAMS_BY_NAME[name]
  inputs = batch_inputs(name, batch_size)
  assert_results_match(reference(name, batch_size), python_loop(name, batch_size),
                       prog, inputs, "reference vs run_unbatched loop")


@pytest.mark.parametrize("name, batch_size, backend", BACKEND_CASES)
def test_backend_matches_reference_and_python_loop(name, batch_size, backend):
  prog = example_programs.PROGRAMS_BY_NAME[name]
  inputs = batch_inputs(name, batch_size)
  got = prog.fn(*inputs, backend=backend)
  for leaf in tf.nest.flatten(got):
    assert tf.is_tensor(leaf), f"{name} on {backend}: output leaf is {type(leaf)}, not a tensor"
  got = to_numpy(got)
  assert_results_match(got, reference(name, batch_size), prog, inputs,
                       f"backend {backend} vs reference")
  assert_results_match(got, python_loop(name, batch_size), prog, inputs,
                       f"backend {backend} vs run_unbatched loop")


@pytest.mark.parametrize("name, backend", EMPTY_CASES)
def test_empty_batch(name, backend):
  """A batch of zero members gives empty outputs of the declared dtypes."""
  prog = example_programs.PROGRAMS_BY_NAME[name]
  inputs = batch_inputs(name, 0)
  got = to_numpy(prog.fn(*inputs, backend=backend))
  # Expected per-member shapes come from a two-member batch run example by example.
  want = tf.nest.map_structure(lambda w: w[:0], python_loop(name, 2))
  assert_results_match(got, want, prog, inputs, f"backend {backend}, empty batch")
