"""A batched primitive's work on fixed matrices moves before the VM's loop
under XLA (`tfp_autobatch/runtime/constant_work.py`): computed once a
call, where XLA would redo it at every call inside the VM's conditionals."""
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

import nuts
import tfp_autobatch as tab
from pc_testing import repeated
from tfp_autobatch import pipeline
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.runtime import constant_work

tfd = tfp.distributions

_COVARIANCE = tf.constant([[4., 1., 0.5], [1., 3., 0.2], [0.5, 0.2, 2.]])


@tab.batched_primitive
def _whitened(x):           # [n, 3]: against a fixed covariance's factor
  factor = tf.linalg.cholesky(_COVARIANCE)
  return tf.linalg.triangular_solve(factor, x[..., None])[..., 0]


_whitened_repeatedly = repeated(_whitened)
_ARG_TYPES = [types_lib.TensorType(tf.float32, (3,)),
              types_lib.TensorType(tf.int32, ())]


def _vm_graph(fn, args):
  """The graph of `fn`'s compiled VM on `args` (pc:xla): the loop and what
  is computed before it."""
  runtime = pipeline.runtime(fn, _ARG_TYPES, "pc:xla")
  return runtime.compiled_for(args).get_concrete_function(*args).graph


def test_a_fixed_factor_and_its_inverse_are_computed_before_the_loop():
  x = tf.constant(np.random.default_rng(0).normal(size=(6, 3)), tf.float32)
  n = tf.constant([1, 2, 3, 0, 2, 4])
  got = _whitened_repeatedly(x, n, backend="pc:xla")
  want = _whitened_repeatedly(x, n, backend="pc:graph")
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  before_loop = {op.type for op in _vm_graph(_whitened_repeatedly, [x, n])
                 .get_operations() if "fixed_matrix_work" in op.name}
  # The factorisation, and the solve of the identity that inverts it.
  assert {"Cholesky", "MatrixTriangularSolve"} <= before_loop


def test_nothing_moves_in_eager_and_graph_modes():
  # Only where XLA compiles the VM: TensorFlow's own kernels solve
  # without inverting, as in TFP's kernel run without XLA.
  assert constant_work.target() is None
  x = tf.ones([2, 3])
  n = tf.constant([1, 2])
  runtime = pipeline.runtime(_whitened_repeatedly, _ARG_TYPES, "pc:graph")
  graph = runtime.compiled_for([x, n]).get_concrete_function(x, n).graph
  assert not [op for op in graph.get_operations()
              if "fixed_matrix_work" in op.name]


def test_a_large_fixed_factor_keeps_its_solve_and_is_named(caplog):
  # Past `MAX_INVERTED` rows a solve is not turned into a product with
  # the factor's inverse (XLA's blocked substitution is more accurate):
  # that work stays in the loop, and a warning names it.
  rows = constant_work.MAX_INVERTED + 2
  factor = tf.linalg.cholesky(
      tf.eye(rows) * 2. + tf.fill([rows, rows], 0.01))

  @tab.batched_primitive
  def solve(x):
    return tf.linalg.triangular_solve(factor, x[..., None])[..., 0]

  @tab.batch
  def twice(x):
    return solve(solve(x))

  x = tf.ones([3, rows])
  np.testing.assert_allclose(twice(x, backend="pc:xla"),
                             twice(x, backend="pc:graph"), rtol=1e-5)
  assert "MatrixTriangularSolve (made at" in caplog.text


def test_nuts_on_a_fixed_covariance_gaussian_reads_the_density_at_its_draws():
  # TFP's Gaussian with a fixed scale solves against it in the density and
  # in its gradient: both move, and the kernel's log density and gradient
  # are the distribution's at the states it returns.
  dist = tfd.MultivariateNormalTriL(
      loc=[1., -1., 0.5], scale_tril=tf.linalg.cholesky(_COVARIANCE))
  kernel = nuts.NoUTurnSampler(dist.log_prob, 0.4, backend="pc:xla")
  state = tf.zeros([4, 3])
  results = kernel.bootstrap_results(state)
  for step in range(3):
    state, results = kernel.one_step(state, results, seed=[step, 7])
  np.testing.assert_allclose(results.target_log_prob, dist.log_prob(state),
                             rtol=1e-5)
  with tf.GradientTape() as tape:
    tape.watch(state)
    logp = dist.log_prob(state)
  np.testing.assert_allclose(results.grads_target_log_prob[0],
                             tape.gradient(logp, state), rtol=1e-4, atol=1e-5)


def test_pc_xla_gradients_through_a_moved_solve_match_pc_graph():
  # pc:xla's gradient (the reverse VM) differentiates each block with
  # kernels traced in place, which keep their solves.
  x = tf.constant(np.random.default_rng(1).normal(size=(5, 3)), tf.float32)
  n = tf.constant([1, 2, 0, 3, 1])

  def gradient(backend):
    with tf.GradientTape() as tape:
      tape.watch(x)
      total = tf.reduce_sum(_whitened_repeatedly(x, n, backend=backend) ** 2)
    return tape.gradient(total, x)

  np.testing.assert_allclose(gradient("pc:xla"), gradient("pc:graph"),
                             rtol=1e-4, atol=1e-5)


def test_a_factor_made_in_the_callers_xla_function_moves_too(caplog):
  # The factor is a tensor of the caller's function, captured by the
  # primitive: it is computed outside the VM, so the solve against it
  # moves (nothing is named), on pc:graph inside the caller's jit_compile.
  x = tf.constant(np.random.default_rng(2).normal(size=(4, 3)), tf.float32)
  n = tf.constant([2, 0, 1, 3])

  def whiten(backend, covariance):
    factor = tf.linalg.cholesky(covariance)

    @tab.batched_primitive
    def solve(v):
      return tf.linalg.triangular_solve(factor, v[..., None])[..., 0]

    return repeated(solve)(x, n, backend=backend)

  want = whiten("pc:graph", _COVARIANCE)
  got = tf.function(lambda c: whiten("pc:graph", c), jit_compile=True,
                    autograph=False)(_COVARIANCE)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert "does not depend on its inputs" not in caplog.text


def test_a_general_solve_against_a_fixed_matrix_moves(caplog):
  # `tf.linalg.solve` (an LU factorisation under XLA, at every call)
  # becomes a product with the matrix's inverse, computed before the loop.
  matrix = tf.constant([[3., 1., 0.], [0.5, 2., 0.3], [0., 0.4, 1.5]])

  @tab.batched_primitive
  def solve(v):
    return tf.transpose(tf.linalg.solve(matrix, tf.transpose(v),
                                        adjoint=True))

  solve_repeatedly = repeated(solve)
  x = tf.constant(np.random.default_rng(3).normal(size=(4, 3)), tf.float32)
  n = tf.constant([2, 0, 1, 3])
  np.testing.assert_allclose(solve_repeatedly(x, n, backend="pc:xla"),
                             solve_repeatedly(x, n, backend="pc:graph"),
                             rtol=1e-5, atol=1e-6)
  assert "does not depend on its inputs" not in caplog.text
  before_loop = {op.type for op in _vm_graph(solve_repeatedly, [x, n])
                 .get_operations() if "fixed_matrix_work" in op.name}
  assert "MatrixInverse" in before_loop
