"""If-conversion (`passes/if_to_select`): small integer `if`s become selects,
and on `pc:xla`, which no gradient goes through, small floating-point ones."""
import numpy as np
import pytest
import tensorflow as tf

import example_programs
import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.passes import if_to_select
from tfp_autobatch.runtime import reference

INT = [types_lib.TensorType(tf.int32, ())]
BACKENDS = ("local:eager", "local:eager_xla", "pc:eager", "pc:graph",
            "pc:xla")
collatz = example_programs.PROGRAMS_BY_NAME["collatz_steps"].fn   # a while around an if


def _branches(fn, arg_types=INT, backend=None):
  program = pipeline.typed_program(fn, arg_types, backend)
  return sum(isinstance(b.terminator, ir1.Branch)
             for f in program.functions for b in f.blocks)


def _count_selects(program):
  return sum(isinstance(op, ir1.Primitive) and "both run" in op.code.source
             for f in program.functions for b in f.blocks for op in b.ops)


def _selects(fn, arg_types=INT, backend=None):
  return _count_selects(pipeline.typed_program(fn, arg_types, backend))


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
  # and the exit, which runs once for every member at the end (a halting
  # block: `schedule.halting_blocks`; before: a step per arm taken, 146
  # here).
  collatz(x, backend="pc:eager")
  assert collatz.last_stats.steps == 120


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


F32 = [types_lib.TensorType(tf.float32, ())]
DIFFERENTIATED = ("local:eager", "local:eager_xla", "pc:eager", "pc:graph")


@pytest.mark.parametrize("backend", DIFFERENTIATED)
def test_floating_point_arms_stay_branches_and_keep_finite_gradients(
    backend):
  assert _selects(_float_arm, F32) == 0
  assert _selects(_float_arm, F32, backend) == 0
  x = tf.constant([-4., 0., 2., 9.])
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = _float_arm(x, backend=backend)
  np.testing.assert_allclose(y, [4., 0., np.sqrt(2.), 3.], rtol=1e-6)
  grad = tf.convert_to_tensor(tape.gradient(y, x))
  assert np.isfinite(grad.numpy()).all(), grad


@pytest.mark.slow
def test_pc_xla_gradient_runs_the_program_with_branches():
  # pc:xla's own program makes the floating-point arm a select, whose
  # gradient is NaN; its gradient reruns pc:graph's program instead.
  assert _selects(_float_arm, F32, "pc:xla") > 0
  x = tf.constant([-4., 0., 2., 9.])
  grads = {}
  for backend in ("pc:graph", "pc:xla"):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = _float_arm(x, backend=backend)
    grads[backend] = tf.convert_to_tensor(tape.gradient(y, x)).numpy()
  assert np.isfinite(grads["pc:xla"]).all(), grads
  np.testing.assert_allclose(grads["pc:xla"], grads["pc:graph"], rtol=1e-6)


@tab.batch
def _float_collatz(x):   # collatz on whole floats: a float `if` in a loop
  steps = tf.zeros_like(x, tf.int32)
  while x > 1.0:
    if x % 2.0 == 0.0:
      x = x * 0.5
    else:
      x = 3.0 * x + 1.0
    steps += 1
  return steps


def test_floating_point_ifs_are_selects_on_pc_xla_only():
  assert _selects(_float_collatz, F32, "pc:xla") == 1
  assert _branches(_float_collatz, F32, "pc:xla") == 2   # the loop's
  for backend in (None,) + DIFFERENTIATED:
    assert _selects(_float_collatz, F32, backend) == 0, backend
  # (Whole floats below 2**24, so every backend computes them exactly.)
  x = np.array([1, 7, 27, 97, 6, 3, 12, 40], np.float32)
  expected = [_float_collatz.run_unbatched(tf.constant(a)).numpy()
              for a in x]
  steps = {}
  for backend in BACKENDS:
    np.testing.assert_array_equal(_float_collatz(x, backend=backend),
                                  expected, err_msg=backend)
    steps[backend] = _float_collatz.last_stats.steps
  # Members on different arms share each step, as in collatz's integer
  # `if` on every backend: the entry, an iteration each and the exit,
  # once at the end (120 steps; 148 with the `if` a branch, on pc:graph).
  collatz(x.astype(np.int32), backend="pc:xla")
  assert steps["pc:xla"] == collatz.last_stats.steps == 120, steps
  assert steps["pc:graph"] >= steps["pc:xla"] + 20, steps
  # pc:xla's program runs as it should one example at a time too.
  program = pipeline.typed_program(_float_collatz, F32, "pc:xla")
  np.testing.assert_array_equal(
      [reference.run_example(program, [tf.constant(a)], 8) for a in x],
      expected)


@tab.batch
def _log_or_root(x):   # NaN for the members each arm is not for
  if x > 0.0:
    y = tf.math.log(x)
  else:
    y = tf.sqrt(-x) / x
  return y


@pytest.mark.parametrize("fn", [_log_or_root, _float_arm],
                         ids=lambda f: f.python_function.__name__)
def test_a_select_on_pc_xla_discards_the_untaken_arms_nan(fn):
  assert _selects(fn, F32, "pc:xla") == 1
  x = np.array([-4., -0.5, 0., 2., 9., np.e], np.float32)
  with np.errstate(divide="ignore", invalid="ignore"):
    expected = [fn.run_unbatched(tf.constant(a)).numpy() for a in x]
  got = fn(x, backend="pc:xla")
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  np.testing.assert_allclose(got, fn(x, backend="pc:graph"), rtol=1e-6)


@tab.batch
def _float_vector_and_tuple(v):   # v: float32 [3] per example
  pair = (v[0], v[2])
  if tf.reduce_sum(v) > 1.0:
    v = v * 0.5
    pair = (pair[1], pair[0])
  else:
    t = v - 1.0   # assigned in this arm only
    v = t * t
  return v, pair[0] - pair[1]


def test_floating_point_vectors_and_tuples_are_selected_whole_on_pc_xla():
  vec = [types_lib.TensorType(tf.float32, (3,))]
  assert _selects(_float_vector_and_tuple, vec, "pc:xla") == 1
  assert _branches(_float_vector_and_tuple, vec, "pc:xla") == 0
  assert _selects(_float_vector_and_tuple, vec, "pc:graph") == 0
  v = np.array([[1., 2., 3.], [0., .5, .25], [5., -9., 4.], [-1., -1., 8.]],
               np.float32)
  expected = [_float_vector_and_tuple.run_unbatched(tf.constant(row))
              for row in v]
  for backend in BACKENDS:
    got_v, got_d = _float_vector_and_tuple(v, backend=backend)
    np.testing.assert_allclose(got_v, [e[0] for e in expected],
                               err_msg=backend)
    np.testing.assert_allclose(got_d, [e[1] for e in expected],
                               err_msg=backend)


@tab.batch
def _checks_or_halves(x):
  if x > 0.0:   # may raise: a branch everywhere
    x = tf.debugging.check_numerics(tf.math.log(x), "log")
  else:
    x = -x
  if x > 1.0:   # raises on nothing: a select on pc:xla
    x = x * 0.5
  return x


@tab.batch
def _big_float_arms(x):   # 14 ops in the first arm
  if x > 0.0:
    x = x * 3. + 1.
    x = x * 3. + 1.
    x = x * 3. + 1.
    x = x * 3. + 1.
    x = x * 3. + 1.
    x = x * 3. + 1.
    x = x * 3. + 1.
  else:
    x = x - 1.
  if x > 1.0:   # a select on pc:xla
    x = x * 0.5
  return x


@pytest.mark.parametrize("fn", [_checks_or_halves, _big_float_arms],
                         ids=lambda f: f.python_function.__name__)
def test_float_arms_that_may_raise_or_cost_much_stay_branches_on_pc_xla(fn):
  # The first `if` a branch, the second a select (copied into both arms).
  assert _branches(fn, F32, "pc:xla") == 1
  program = pipeline.typed_program(fn, F32, "pc:xla")
  assert _count_selects(program) == 2
  assert all("x = x * 0.5" in op.code.source
             for f in program.functions for b in f.blocks for op in b.ops
             if "both run" in op.code.source)
  x = np.array([-3., -0.5, 0.5, 2., 40.], np.float32)
  expected = [fn.run_unbatched(tf.constant(a)).numpy() for a in x]
  np.testing.assert_allclose(fn(x, backend="pc:graph"), expected, rtol=1e-6)
  if fn is _big_float_arms:   # (XLA has no CheckNumerics to compile)
    np.testing.assert_allclose(fn(x, backend="pc:xla"), expected, rtol=1e-6)


def test_ir_shows_the_program_of_the_last_calls_backend():
  x = np.array([-1., 4.], np.float32)
  _float_arm(x, backend="pc:xla")
  assert "both run" in str(_float_arm.ir())
  assert "both run" in str(_float_arm.ir(level=2))
  assert "both run" not in str(_float_arm.ir(backend="pc:graph"))
  assert "both run" not in str(_float_arm.ir(level=2, backend="pc:graph"))
  # pc:graph inside a function XLA compiles keeps its branches.
  tf.function(lambda x: _float_arm(x, backend="pc:graph"),
              jit_compile=True)(tf.constant(x))
  assert "both run" not in str(_float_arm.ir())
  assert "both run" in str(_float_arm.ir(backend="pc:xla"))
  with pytest.raises(tab.UnknownBackendError):
    _float_arm.ir(backend="pc:nope")
  # Where pc:xla has no floating-point `if` to select, it shares the
  # program (and its lowering) with the other backends.
  assert (pipeline.typed_program(collatz, INT, "pc:xla")
          is pipeline.typed_program(collatz, INT))


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
