"""Local static runtime: masking and gathering give the reference's answers."""
import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

import tfp_autobatch as tab
from tfp_autobatch import api
from tfp_autobatch import pipeline
from tfp_autobatch.runtime import local_static
from tfp_autobatch.runtime import vectorize

TABLE = np.array([10, 20, 30], np.int32)


@tab.batch
def lookup_or_count(i):
  """Indexes TABLE only when i is in range: junk rows must never index."""
  if i < 3:
    y = tf.gather(TABLE, i, validate_indices=True)
  else:
    y = 0
    while i > 3:
      i = i - 1
      y += 1
  return y


_KERNELS = {}   # one kernel cache per execution mode, shared by the tests


def _runtime(fn, args, strategy, jit_compile=False):
  converted, arg_types, batch_size = api._prepare(fn, args)  # pylint: disable=protected-access
  program = pipeline.typed_program(fn, arg_types)
  kernels = _KERNELS.setdefault(jit_compile, vectorize.KernelCache(jit_compile))
  runtime = local_static.LocalStaticRuntime(
      program, kernels, 64, strategy=strategy, bucket=jit_compile)
  return runtime, converted, batch_size


def _expected(i):
  return np.where(i < 3, TABLE[np.clip(i, 0, 2)], np.maximum(i - 3, 0))


@pytest.mark.parametrize("strategy", ["gather", "mask"])
def test_junk_in_inactive_members_never_raises(strategy):
  i = np.array([0, 1000, 2, 7], np.int32)   # 1000, 7 are out of range
  runtime, args, n = _runtime(lookup_or_count, (i,), strategy)
  np.testing.assert_array_equal(runtime.run(args, n), _expected(i))


@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(st.lists(st.integers(0, 40), min_size=1, max_size=9),
                  st.sampled_from(["gather", "mask"]))
def test_masking_and_gathering_agree_with_the_reference(values, strategy):
  i = np.array(values, np.int32)
  runtime, args, n = _runtime(lookup_or_count, (i,), strategy)
  result = runtime.run(args, n)
  np.testing.assert_array_equal(result, lookup_or_count.reference(i))
  np.testing.assert_array_equal(result, _expected(i))
  assert 0 < runtime.stats.utilization <= 1


def test_unknown_strategy_is_rejected():
  with pytest.raises(ValueError, match="gather"):
    local_static.LocalStaticRuntime(None, None, 1, strategy="scatter")


def test_xla_buckets_subsets_to_powers_of_two(monkeypatch):
  assert [local_static._next_power_of_two(n) for n in (0, 1, 2, 3, 5, 8, 9)] \
      == [1, 1, 2, 4, 8, 8, 16]   # pylint: disable=protected-access
  seen = []
  rows = local_static._Frame.rows   # pylint: disable=protected-access

  def recording_rows(frame):
    result = rows(frame)
    seen.append(result.size)
    return result
  monkeypatch.setattr(local_static._Frame, "rows", recording_rows)  # pylint: disable=protected-access
  i = np.array([0, 5, 9, 1, 2], np.int32)
  runtime, args, n = _runtime(lookup_or_count, (i,), "gather",
                              jit_compile=True)
  np.testing.assert_array_equal(runtime.run(args, n), _expected(i))
  assert seen and all(s & (s - 1) == 0 for s in seen), seen
