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
