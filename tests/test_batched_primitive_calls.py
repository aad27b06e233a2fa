"""Tests of `@batched_primitive` calls in the pc VM: run on their members
gathered (`runtime/batched_primitive_calls.py`)."""
import numpy as np
import pytest
import tensorflow as tf

import tfp_autobatch as tab
import pc_testing
from pc_testing import INT, cheap_double_all, model_first, repeated
from tfp_autobatch import pipeline
from tfp_autobatch.runtime import batched_primitive_calls


def test_the_model_runs_on_its_members_gathered():
  # model_first(n) calls the model once per level of recursion: with n =
  # 0..15 the k-th call has 16 - k members. pc:graph and pc:eager compute
  # exactly the members' rows (they used to compute all 16 rows each
  # time); pc:xla gathers the members into the smallest of 16, 8, 4, 1
  # rows that holds them (the last call, one member, used to take 2 rows;
  # no bucket of 2 or 3 rows, which would cost about what 4 do); the
  # results do not change.
  n = np.arange(16, dtype=np.int32)
  want = n * (n + 1)
  members = 16 - np.arange(16)
  for backend in ("pc:graph", "pc:eager"):
    np.testing.assert_array_equal(model_first(n, backend=backend), want)
    assert model_first.last_stats.batched_primitive_rows == sum(members)
  np.testing.assert_array_equal(model_first(n, backend="pc:xla"), want)
  buckets = [min(b for b in (16, 8, 4, 1) if b >= m) for m in members]
  assert buckets[:9] == [16] * 8 + [8] and buckets[-3:] == [4, 4, 1]
  assert model_first.last_stats.batched_primitive_rows == sum(buckets)
  # The members each call was made for, whatever rows it computed.
  assert model_first.last_stats.batched_primitive_members == {
      int(m): 1 for m in members}
  assert model_first.last_stats.batched_primitive_calls == 16


def test_members_per_model_call_are_counted_inside_tf_function():
  # Traced in the user's tf.function, the histogram is a tensor indexed by
  # members (16 + 1 entries): one call for each of 16, 15, ..., 1.
  n = np.arange(16, dtype=np.int32)
  for backend in ("pc:graph", "pc:xla"):
    @tf.function(autograph=False)
    def run(n):
      model_first(n, backend=backend)
      return model_first.last_stats_tensors["batched_primitive_members"]
    np.testing.assert_array_equal(run(tf.constant(n)), [0] + [1] * 16)


def test_model_outputs_stop_xla_constant_inference_at_no_cost():
  # pc:xla passes a model call's outputs through this barrier, so that
  # TF's lowering to XLA does not evaluate the model on the host while it
  # tries to prove later branch inputs constant (76 s -> 33 s for the
  # first call of a 64-chain logistic-regression NUTS step in
  # benchmarks.nuts).
  # A reshape needs its shape proved constant. Here the shape comes out
  # of a conditional whose branches agree, which the proof sees through;
  # through the barrier it fails.
  x = tf.range(6)

  def reshape(barrier):
    def run(x):
      shape = tf.switch_case(x[0] % 2, [lambda: tf.constant([2, 3])] * 2)
      if barrier:
        shape, = batched_primitive_calls.opaque_to_constant_inference([shape])
      return tf.reshape(x, shape)
    return tf.function(run, jit_compile=True, autograph=False)

  np.testing.assert_array_equal(reshape(False)(x), [[0, 1, 2], [3, 4, 5]])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="compile-time constant"):
    reshape(True)(x)
  # XLA deletes the loop that never runs: nothing of it is left to execute.
  barrier = tf.function(
      lambda x: batched_primitive_calls.opaque_to_constant_inference([x]),
      jit_compile=True, autograph=False)
  np.testing.assert_array_equal(barrier(x)[0], x)
  before = barrier.experimental_get_compiler_ir(x)(stage="hlo")
  after = barrier.experimental_get_compiler_ir(x)(stage="optimized_hlo")
  assert " while(" in before
  assert " while(" not in after
  assert batched_primitive_calls.opaque_to_constant_inference([]) == []


def test_a_few_members_need_no_member_buckets():
  # Up to ALL_ROWS_UP_TO rows a model call runs on all of them or not at
  # all: the compiled VM gathers no members (the ops that find them are
  # there at batch size 8) and traces the model for one size only.
  def gathers_members(n):
    runtime = pipeline.runtime(model_first, INT, "pc:xla")
    args = [tf.constant(n, tf.int32)]
    hlo = runtime.compiled_for(args).experimental_get_compiler_ir(*args)(
        stage="hlo")
    return batched_primitive_calls.MEMBERS_FIRST in hlo
  assert batched_primitive_calls.ALL_ROWS_UP_TO == 4
  assert gathers_members(np.arange(8))
  assert not gathers_members(np.arange(4))
  assert not gathers_members(np.array([3]))
  np.testing.assert_array_equal(model_first(np.array([3], np.int32),
                                            backend="pc:xla"), [12])
  # model_first(n) on n = 0..3 calls the model with 4, 3, 2, 1 members:
  # every call computes all 4 rows, and the results are the members' own.
  n = np.arange(4, dtype=np.int32)
  np.testing.assert_array_equal(model_first(n, backend="pc:xla"),
                                n * (n + 1))
  assert model_first.last_stats.batched_primitive_rows == 4 * 4
  assert model_first.last_stats.batched_primitive_members == {
      4: 1, 3: 1, 2: 1, 1: 1}


cheap_model_first = pc_testing.calls_model_first(cheap_double_all)


def test_a_cheap_model_runs_on_every_row_a_costly_one_in_buckets():
  # model_first's primitive costs about 51,000 float operations a row by
  # TensorFlow's estimate, cheap_model_first's one: under pc:xla the first
  # is computed on its members gathered into buckets, the second on all 16
  # rows whenever it has members (gathering them would cost more than the
  # rows it leaves out).
  def hlo(fn, n):
    runtime = pipeline.runtime(fn, INT, "pc:xla")
    args = [tf.constant(n, tf.int32)]
    return runtime.compiled_for(args).experimental_get_compiler_ir(*args)(
        stage="hlo")
  n = np.arange(16, dtype=np.int32)
  assert batched_primitive_calls.MEMBERS_FIRST in hlo(model_first, n)
  assert batched_primitive_calls.MEMBERS_FIRST not in hlo(cheap_model_first, n)
  np.testing.assert_array_equal(cheap_model_first(n, backend="pc:xla"),
                                n * (n + 1))
  stats = cheap_model_first.last_stats
  assert stats.batched_primitive_calls == 16
  assert stats.batched_primitive_rows == 16 * 16
  assert stats.batched_primitive_members == {int(m): 1 for m in 16 - n}
  # The decision, from the kernel traced for all rows.
  kernel = tf.function(lambda rows, x: tf.matmul(x, tf.ones([200, 200])),
                       autograph=False, input_signature=[
                           tf.TensorSpec([], tf.int32),
                           tf.TensorSpec([16, 200], tf.float32)])
  assert batched_primitive_calls.buckets_pay(kernel, 16)
  assert not batched_primitive_calls.buckets_pay(
      tf.function(lambda rows, x: x * 2., autograph=False, input_signature=[
          tf.TensorSpec([], tf.int32), tf.TensorSpec([16, 200], tf.float32)]),
      16)
  # A batch size known only when it runs: buckets, as before.
  assert batched_primitive_calls.buckets_pay(kernel, tf.constant(16))


def test_member_buckets_halve_the_batch_down_to_one_row():
  sizes = batched_primitive_calls.member_bucket_sizes
  # Less the sizes between one row and ALL_ROWS_UP_TO, each a trace and a
  # compilation of the model that would compute about as fast as four rows.
  assert sizes(None, 256) == [128, 64, 32, 16, 8, 4, 1]
  assert sizes(None, 13) == [7, 4, 1]
  assert sizes(None, 5) == [1]
  # Up to ALL_ROWS_UP_TO rows, none: every call runs on all of them.
  assert sizes(None, 4) == sizes(None, 2) == sizes(None, 1) == []
  # A batch size unknown at trace time: a fixed number of sizes.
  z = tf.constant(13)
  assert [int(s) for s in sizes(z, None)] == [7, 4, 2]


def test_members_first_orders_rows_as_a_stable_sort_by_membership_would():
  """A bucket takes the members' rows in row order, then the others',
  without a sort (XLA's CPU sort calls a comparator per comparison): the
  order a stable argsort of the non-members would give, eagerly and
  compiled."""
  rng = np.random.default_rng(0)
  compiled = tf.function(batched_primitive_calls._members_first,  # pylint: disable=protected-access
                         jit_compile=True, autograph=False)
  for z in (1, 2, 7, 64):
    for members in [np.zeros(z, bool), np.ones(z, bool)] + [
        rng.random(z) < p for p in (0.1, 0.5, 0.9)]:
      want = np.argsort(~members, kind="stable")
      before = batched_primitive_calls._members_before(members)  # pylint: disable=protected-access
      args = (tf.constant(members), before,
              tf.constant(int(members.sum())))
      np.testing.assert_array_equal(
          batched_primitive_calls._members_first(*args), want)  # pylint: disable=protected-access
      np.testing.assert_array_equal(compiled(*args), want)
  runtime = pipeline.runtime(model_first, INT, "pc:xla")
  args = [tf.constant(np.arange(8), tf.int32)]
  hlo = runtime.compiled_for(args).experimental_get_compiler_ir(*args)(
      stage="hlo")
  assert batched_primitive_calls.MEMBERS_FIRST in hlo
  assert " sort(" not in hlo


_FIXED_FACTOR = tf.linalg.cholesky(tf.constant([[4., 1.], [1., 3.]]))
# A factor read from a variable: its value may change between calls, so
# the work on it is not moved out of the VM's loop (`constant_work`).
_VARIABLE_FACTOR = tf.Variable(_FIXED_FACTOR)


@tab.batched_primitive
def _solve_fixed(x):        # [n, 2]: against a fixed factor
  return tf.linalg.triangular_solve(_FIXED_FACTOR, x[..., None])[..., 0]


@tab.batched_primitive
def _solve_variable(x):     # [n, 2]: against a variable's factor
  return tf.linalg.triangular_solve(_VARIABLE_FACTOR, x[..., None])[..., 0]


@tab.batched_primitive
def _solve_own(x):          # [n, 2]: against a factor of each row's own
  factor = tf.linalg.cholesky(
      _FIXED_FACTOR + tf.reduce_sum(x ** 2, -1)[:, None, None])
  return tf.linalg.triangular_solve(factor, x[..., None])[..., 0]


_solve_fixed_repeatedly = repeated(_solve_fixed)
_solve_variable_repeatedly = repeated(_solve_variable)
_solve_own_repeatedly = repeated(_solve_own)


def test_work_on_a_fixed_matrix_that_stays_in_the_loop_is_named_under_xla(
    caplog):
  # XLA moves work on constants alone (a fixed factor's triangular
  # inverse) out of a plain loop but not out of the conditionals the VM
  # runs a batched primitive in. The VM moves it before its loop
  # (`constant_work`), except where the matrix is a variable's value;
  # that work is redone at every call, and a warning names the op and the
  # line that made it, once.
  x = tf.ones([5, 2])
  n = tf.constant([1, 2, 3, 0, 2])
  want = _solve_variable_repeatedly(x, n, backend="pc:graph")
  assert "does not depend on its inputs" not in caplog.text
  for size in (5, 3):   # two traces, one warning
    got = _solve_variable_repeatedly(x[:size], n[:size], backend="pc:xla")
    np.testing.assert_allclose(got, want[:size], rtol=1e-6)
  assert caplog.text.count("does not depend on its inputs") == 1
  assert "MatrixTriangularSolve (made at" in caplog.text
  assert "test_batched_primitive_calls.py:" in caplog.text
  # Moved out of the loop, the fixed factor's solve is not named.
  caplog.clear()
  np.testing.assert_allclose(
      _solve_fixed_repeatedly(x, n, backend="pc:xla"),
      _solve_fixed_repeatedly(x, n, backend="pc:graph"), rtol=1e-6)
  assert "does not depend on its inputs" not in caplog.text
  # A factor computed from the primitive's inputs is not such work.
  _solve_own_repeatedly(x, n, backend="pc:xla")
  assert "does not depend on its inputs" not in caplog.text


@tab.batched_primitive(fine_buckets=True)
def _double_all_in_fine_buckets(x):
  return pc_testing.double_all.fn(x)


_fine_model_first = pc_testing.calls_model_first(_double_all_in_fine_buckets)


def test_fine_buckets_pad_the_members_by_a_third_at_most():
  # model_first's calls for 16, 15, ..., 1 members: with fine_buckets the
  # primitive runs on the smallest of 16, 12, 8, 6, 4, 1 rows that holds
  # them, fewer rows in all than the halvings' 16, 8, 4, 1.
  n = np.arange(16, dtype=np.int32)
  np.testing.assert_array_equal(_fine_model_first(n, backend="pc:xla"),
                                n * (n + 1))
  members = 16 - np.arange(16)
  fine = [min(b for b in (16, 12, 8, 6, 4, 1) if b >= m) for m in members]
  halvings = [min(b for b in (16, 8, 4, 1) if b >= m) for m in members]
  assert _fine_model_first.last_stats.batched_primitive_rows == sum(fine)
  assert sum(fine) < sum(halvings)
  model_first(n, backend="pc:xla")
  assert model_first.last_stats.batched_primitive_rows == sum(halvings)
  # The other backends compute exactly the members' rows either way.
  np.testing.assert_array_equal(_fine_model_first(n, backend="pc:graph"),
                                n * (n + 1))
  assert _fine_model_first.last_stats.batched_primitive_rows == sum(members)


def test_fine_buckets_keep_halvings_in_a_gradient_and_get_it_right():
  # The reverse VM's buckets are the halvings (each size compiles the
  # gradient too); the gradient is the same as without fine buckets.
  n = tf.constant(np.arange(16, dtype=np.int32))
  x = tf.constant(np.linspace(-1., 1., 16, dtype=np.float32))

  def grad(fn):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = tf.reduce_sum(fn(x, n, backend="pc:xla") ** 2)
    return tape.gradient(y, x), fn.last_stats

  coarse, _ = grad(repeated(pc_testing.double_all))
  fine, stats = grad(repeated(_double_all_in_fine_buckets))
  np.testing.assert_allclose(fine, coarse, rtol=1e-6)
  np.testing.assert_allclose(fine, 2 * x * 4. ** n.numpy(), rtol=1e-5)
  members = [16 - k for k in range(1, 16)]
  assert stats.batched_primitive_rows == sum(
      min(b for b in (16, 8, 4, 1) if b >= m) for m in members)


def test_fine_bucket_sizes_step_by_three_quarters_from_four_rows():
  fine = batched_primitive_calls.fine_bucket_sizes
  sizes = batched_primitive_calls.member_bucket_sizes
  assert fine(sizes(None, 64), 64) == [48, 32, 24, 16, 12, 8, 6, 4, 1]
  assert fine(sizes(None, 13), 13) == [10, 7, 6, 4, 1]
  assert fine(sizes(None, 5), 5) == [4, 1]
  assert fine(sizes(None, 4), 4) == []


def test_fine_buckets_must_be_a_bool():
  with pytest.raises(TypeError, match="fine_buckets must be True or False"):
    tab.batched_primitive(lambda x: x, fine_buckets="yes")
