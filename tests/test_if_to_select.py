"""If-conversion (`passes/if_to_select`): small integer `if`s become selects."""
import numpy as np
import pytest
import tensorflow as tf

import programs
import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.passes import if_to_select

INT = [types_lib.TensorType(tf.int32, ())]
BACKENDS = ("local:eager", "local:eager_xla", "pc:eager", "pc:graph",
            "pc:xla")
collatz = programs.PROGRAMS_BY_NAME["collatz_steps"].fn   # a while around an if


def _branches(fn, arg_types=INT):
  program = pipeline.typed_program(fn, arg_types)
  return sum(isinstance(b.terminator, ir1.Branch)
             for f in program.functions for b in f.blocks)


def _selects(fn, arg_types=INT):
  program = pipeline.typed_program(fn, arg_types)
  return sum(isinstance(op, ir1.Primitive) and "both run" in op.code.source
             for f in program.functions for b in f.blocks for op in b.ops)


def test_collatz_loop_body_is_one_block_one_step_per_iteration():
  program = pipeline.typed_program(collatz, INT)
  assert _selects(collatz) == 1
  # The entry, the loop body (its `if` a select), the exit.
  assert len(program.entry.blocks) == 3, program
  x = np.array([1, 7, 27, 97], np.int32)   # 0, 16, 111 and 118 iterations
  for backend in BACKENDS:
    np.testing.assert_array_equal(collatz(x, backend=backend),
                                  [0, 16, 111, 118])
  # Members on different arms share each step: the entry, 118 iterations
  # and the exit, which the member done at once takes first (before: a step
  # per arm taken, 146 here).
  collatz(x, backend="pc:eager")
  assert collatz.last_stats.steps == 121


@tab.batch
def _subtract_while_big(n):   # an `if` with no else, in a loop
  k = n * 0
  while k < 6:
    if n > 10:
      n = n - 7
    k += 1
  return n


@tab.batch
def _temporary_in_one_arm(n):   # `t` is assigned in one arm only
  if n % 3 == 0:
    t = n // 3
    n = t + 1
  else:
    n = n + 2
  return n


@tab.batch
def _elif_chain(n):
  if n < 0:
    y = -n
  elif n == 0:
    y = 100
  else:
    y = n * 2
  return y + 1


@tab.batch
def _literals(n):   # weakly typed literal arms
  if n > 3:
    k = 1
  else:
    k = 2
  return n + k


@tab.batch
def _arm_rewrites_its_condition(n):
  c = n > 0
  if c:
    c = n > 5
    n = n - 1
  else:
    n = n + 1
  return n * 10 + tf.cast(c, tf.int32)


@tab.batch
def _vector_and_tuple(v):   # v: int32 [3] per example
  pair = (v[0], v[2])
  if tf.reduce_sum(v) > 5:
    v = v - 1
    pair = (pair[1], pair[0])
  else:
    v = v * 2
  return v, pair[0] - pair[1]


INTS = np.array([-4, 0, 1, 3, 6, 9, 12, 25, 40], np.int32)
CONVERTED = [
    (_subtract_while_big, 1),
    (_temporary_in_one_arm, 1),
    (_elif_chain, 1),   # the inner select inside the outer one
    (_literals, 1),
    (_arm_rewrites_its_condition, 1),
]


@pytest.mark.parametrize("fn,selects", CONVERTED,
                         ids=[f.python_function.__name__ for f, _ in CONVERTED])
def test_small_integer_ifs_become_selects_with_the_same_results(fn, selects):
  assert _selects(fn) == selects
  expected = [fn.run_unbatched(n) for n in INTS]
  for backend in BACKENDS:
    np.testing.assert_array_equal(fn(INTS, backend=backend), expected,
                                  err_msg=backend)


def test_vector_and_tuple_values_are_selected_whole():
  vec = [types_lib.TensorType(tf.int32, (3,))]
  assert _selects(_vector_and_tuple, vec) == 1
  assert _branches(_vector_and_tuple, vec) == 0
  v = np.array([[1, 2, 3], [0, 1, 2], [5, -9, 4], [-1, -1, 8]], np.int32)
  expected = [_vector_and_tuple.run_unbatched(row) for row in v]
  for backend in BACKENDS:
    got_v, got_d = _vector_and_tuple(v, backend=backend)
    np.testing.assert_array_equal(got_v, [e[0] for e in expected])
    np.testing.assert_array_equal(got_d, [e[1] for e in expected])


TABLE = tf.constant([10, 20, 30], tf.int32)


@tab.batch
def _float_arm(x):
  if x > 0:
    y = tf.sqrt(x)    # NaN for the members that did not take it
  else:
    y = -x
  return y


@tab.batch
def _divides_by_member(n):
  if n != 0:
    m = 100 // n      # raises (outside XLA) for the members with n == 0
  else:
    m = n
  return m


@tab.batch
def _gathers(n):
  if n >= 0 and n < 3:   # `and` short-circuits: a branch of its own
    y = TABLE[n]
  else:
    y = n
  return y


@tab.batch
def _big_arms(n):   # 14 ops in the first arm
  if n > 0:
    n = n * 3 + 1
    n = n * 3 + 1
    n = n * 3 + 1
    n = n * 3 + 1
    n = n * 3 + 1
    n = n * 3 + 1
    n = n * 3 + 1
  else:
    n = n - 1
  return n


@pytest.mark.parametrize("fn", [_divides_by_member, _gathers, _big_arms],
                         ids=lambda f: f.python_function.__name__)
def test_arms_that_may_raise_or_cost_much_stay_branches(fn):
  assert _selects(fn) == 0
  assert _branches(fn) >= 1
  expected = [fn.run_unbatched(n) for n in INTS]
  for backend in BACKENDS:
    np.testing.assert_array_equal(fn(INTS, backend=backend), expected,
                                  err_msg=backend)


def test_floating_point_arms_stay_branches_and_keep_finite_gradients():
  f32 = [types_lib.TensorType(tf.float32, ())]
  assert _selects(_float_arm, f32) == 0
  x = tf.constant([-4., 0., 2., 9.])
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = _float_arm(x, backend="pc:graph")
  np.testing.assert_allclose(y, [4., 0., np.sqrt(2.), 3.], rtol=1e-6)
  grad = tape.gradient(y, x)
  assert np.isfinite(grad.numpy()).all(), grad


def test_a_select_counts_what_its_arms_compute_toward_an_outer_arm():
  assert if_to_select.MAX_ARM_COMPUTATIONS == 12
  # Both `if`s of the `elif` chain: the inner select (2 arms of 1 op, the
  # select) and the `n == 0` test make the outer else arm.
  assert _branches(_elif_chain) == 0
  # Three levels of 4-op arms: the inner two become one select (15 ops),
  # which with the test before it is too much for an arm of the outer `if`.
  assert _selects(_nested_fours) == 1 and _branches(_nested_fours) == 1
  expected = [_nested_fours.run_unbatched(n) for n in INTS]
  np.testing.assert_array_equal(_nested_fours(INTS, backend="pc:xla"),
                                expected)


@tab.batch
def _nested_fours(n):
  if n > 20:
    n = (n * 3 + 1) * 5 + 2
  elif n > 5:
    n = (n * 7 + 3) * 2 + 1
  elif n > 0:
    n = (n * 2 + 9) * 3 + 4
  else:
    n = (n * 5 + 1) * 4 + 3
  return n
