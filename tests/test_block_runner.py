"""Tests of running one block of IR-2 for its members
(`runtime/block_runner.py`)."""
import collections

import numpy as np
import pytest

import tfp_autobatch as tab
from tfp_autobatch.ir import ir2
from tfp_autobatch.runtime import vectorize


# -- the VM through the public API.


@tab.batch
def _halve_and_bump(x):
  return x * 0.5 + 1.0


@tab.batch
def bumped_repeatedly(x, n):
  total = _halve_and_bump(x)
  while n > 0:
    total = total + _halve_and_bump(total)
    n = n - 1
  return total


def _bumped_repeatedly_by_hand(x, n):
  expected = []
  for xi, ni in zip(x, n):
    total = xi * 0.5 + 1.0
    for _ in range(ni):
      total += total * 0.5 + 1.0
    expected.append(total)
  return expected


def _run_recording_vectorised(fn, backend, monkeypatch):
  """The code `vectorize.vectorized_map` vectorises, in order, while `fn`
  (a `bumped_repeatedly`) runs on `backend`, checking its results."""
  vectorised = []
  original = vectorize.vectorized_map
  def counting(per_example, batched_args, code):
    vectorised.append(code)
    return original(per_example, batched_args, code)
  monkeypatch.setattr(vectorize, "vectorized_map", counting)
  x, n = np.array([1., 4., 2.], np.float32), np.array([0, 3, 1], np.int32)
  got = fn(x, n, backend=backend)
  np.testing.assert_allclose(got, _bumped_repeatedly_by_hand(x, n),
                             rtol=1e-6)
  return vectorised


@pytest.mark.parametrize("backend", ["pc:eager", "pc:graph", "pc:xla"])
def test_code_run_by_several_blocks_is_vectorised_once(backend, monkeypatch):
  """Inlined at two call sites, the helper's code runs in two blocks; pfor
  traces it once (each vectorisation costs the first call time)."""
  vectorised = _run_recording_vectorised(bumped_repeatedly, backend,
                                         monkeypatch)
  blocks_per_code = collections.Counter(
      ir2.unguarded(op).code for b in bumped_repeatedly.ir(level=2).blocks
      for op in set(b.ops) if isinstance(ir2.unguarded(op), ir2.Primitive))
  assert max(blocks_per_code.values()) >= 2   # shared code, else no test
  assert len(vectorised) == len(set(vectorised)) > 0


@tab.batch
def bumped_and_moved(x, n):
  """`bumped_repeatedly` again: a function of its own, whose kernels no
  other test has traced."""
  total = _halve_and_bump(x)
  while n > 0:
    total = total + _halve_and_bump(total)
    n = n - 1
  return total


@pytest.mark.parametrize("backend", ["pc:eager", "pc:graph", "pc:xla"])
def test_code_that_only_moves_values_is_not_vectorised(backend,
                                                        monkeypatch):
  """Inlining's copies and code that only renames (`total = _t0`,
  `_result = total`) pass their batched inputs on: no kernel is traced
  for them, and the results are those of the code that computes."""
  vectorised = {code.source for code in _run_recording_vectorised(
      bumped_and_moved, backend, monkeypatch)}
  sources = {ir2.unguarded(op).code.source
             for b in bumped_and_moved.ir(level=2).blocks for op in b.ops
             if isinstance(ir2.unguarded(op), ir2.Primitive)}
  moving = {"copy", "total = _t0", "_result = total"}
  assert moving <= sources   # else no test
  assert vectorised and not moving & vectorised
