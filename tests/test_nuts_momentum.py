"""`momentum_distribution` (the mass matrix), as
`tfp.experimental.mcmc.PreconditionedNoUTurnSampler` takes it, and
`tfp.experimental.mcmc.DiagonalMassMatrixAdaptation` around our kernel."""
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import nuts

tfd = tfp.distributions

SCALES = np.array([1e-2, 1e-1, 1., 1e1, 1e2])


def _scaled_target():
  return tfd.MultivariateNormalDiag(scale_diag=tf.constant(SCALES))


def test_diagonal_and_dense_metrics_of_one_matrix_give_the_same_draws():
  target = _scaled_target()
  init = tf.constant(np.random.RandomState(0).randn(6, 5) * SCALES)
  draws = []
  for metric in (tfd.MultivariateNormalDiag(scale_diag=1. / SCALES),
                 tfd.MultivariateNormalTriL(
                     scale_tril=tf.linalg.diag(1. / SCALES))):
    kernel = nuts.NoUTurnSampler(target.log_prob, 0.3,
                                 momentum_distribution=metric,
                                 backend="pc:graph")
    results = kernel.bootstrap_results(init)
    state, results = kernel.one_step(init, results, seed=[4, 2])
    draws.append((state.numpy(), results.leapfrogs_taken.numpy()))
  np.testing.assert_allclose(draws[0][0], draws[1][0], rtol=1e-9)
  np.testing.assert_array_equal(draws[0][1], draws[1][1])
  # A preconditioned chain moves every coordinate on its own scale.
  assert np.all(np.abs(draws[0][0] - init.numpy()).mean(0) > 0.1 * SCALES)


def test_a_precision_factor_that_is_a_full_matrix_runs_on_pc_xla():
  """TFP's PreconditionedNoUTurnSampler tests pass a precision factor that
  is a full, not triangular, matrix (the symmetric square root of the
  precision). Its log density's constant is a log-determinant, which XLA
  cannot compile (LogMatrixDeterminant): pc:xla, the default, failed on
  it. Any factor of one precision gives the same draws."""
  target = tfd.MultivariateNormalTriL(
      loc=tf.constant([0., 0.], tf.float64),
      scale_tril=tf.constant([[1., 0.], [0.5, 2.]], tf.float64))
  precision = np.linalg.inv(target.covariance().numpy())
  w, v = np.linalg.eigh(precision)
  factors = [tf.linalg.LinearOperatorFullMatrix(v @ np.diag(np.sqrt(w)) @ v.T),
             tf.linalg.LinearOperatorLowerTriangular(
                 np.linalg.cholesky(precision))]
  init = tf.constant(np.random.RandomState(3).randn(4, 2))
  draws = []
  for factor in factors:
    metric = (tfp.experimental.distributions
              .MultivariateNormalPrecisionFactorLinearOperator(
                  precision_factor=factor))
    kernel = nuts.NoUTurnSampler(target.log_prob, 0.8,
                                 momentum_distribution=metric)
    state, _ = kernel.one_step(init, kernel.bootstrap_results(init),
                               seed=[5, 6])
    draws.append(state.numpy())
  np.testing.assert_allclose(draws[0], draws[1], rtol=1e-6)
  assert np.all(draws[0] != init.numpy())


def _moments_from_exact_draws(metric, cov, seed):
  """Mean and covariance of 2 steps of 400 chains started at exact draws
  of N(0, cov): NUTS leaves the target invariant, so they are exact."""
  target = tfd.MultivariateNormalFullCovariance(
      np.zeros(len(cov)), cov)
  kernel = nuts.NoUTurnSampler(target.log_prob, 0.4, backend="pc:graph",
                               momentum_distribution=metric)
  init = target.sample(400, seed=[seed, 1])
  state, results = init, kernel.bootstrap_results(init)
  for i in range(2):
    state, results = kernel.one_step(state, results, seed=[seed, i + 7])
  return state.numpy()


@pytest.mark.parametrize("dense", [False, True])
def test_a_metric_leaves_the_target_invariant(dense):
  """z-tests of the means and variances after steps from exact draws,
  with a badly matched metric (so that the preconditioning matters).
  Each of the 2 x 3 statistics fails with probability 1e-4 by chance
  (|z| > 3.9), the test with probability under 1e-3."""
  cov = np.array([[1., 1.5, 0.], [1.5, 4., 0.3], [0., 0.3, 0.25]])
  if dense:
    metric = tfd.MultivariateNormalTriL(
        scale_tril=np.linalg.cholesky(np.linalg.inv(cov) * 2.))
  else:
    metric = tfd.Independent(tfd.Normal(np.zeros(3), [0.5, 2., 3.]), 1)
  x = _moments_from_exact_draws(metric, cov, seed=11 if dense else 12)
  sd = np.sqrt(np.diag(cov))
  n = len(x)
  z_mean = x.mean(0) / (sd / np.sqrt(n))
  z_var = (x.var(0) - np.diag(cov)) / (np.diag(cov) * np.sqrt(2. / n))
  assert np.all(np.abs(z_mean) < 3.9), z_mean
  assert np.all(np.abs(z_var) < 3.9), z_var


def test_a_momentum_distribution_that_is_not_gaussian_is_refused():
  target = _scaled_target()
  kernel = nuts.NoUTurnSampler(
      target.log_prob, 0.1,
      momentum_distribution=tfd.Independent(tfd.StudentT(3., 0., SCALES), 1))
  with pytest.raises(ValueError, match="zero-mean Gaussian"):
    kernel.bootstrap_results(tf.zeros([2, 5], tf.float64))
  with pytest.raises(TypeError, match="by keyword"):
    nuts.NoUTurnSampler(target.log_prob, 0.1, tfd.Normal(0., 1.))


def test_a_new_mass_matrix_does_not_rebuild_the_program():
  """The metric is an input of the batched program and the compiled step:
  stepping with new mass matrices traces the target no more."""
  traces = []

  def target(x):
    traces.append(1)
    return -0.5 * tf.reduce_sum((x / SCALES) ** 2, -1)

  init = tf.zeros([4, 5], tf.float64)
  kernel = nuts.NoUTurnSampler(target, 0.5, momentum_distribution=(
      tfd.MultivariateNormalDiag(scale_diag=np.ones(5))))
  results = kernel.bootstrap_results(init)
  state, results = kernel.one_step(init, results, seed=[1, 1])
  traced = len(traces)
  for i, scale in enumerate([0.5, 2., 1. / SCALES]):
    metric = tfd.JointDistributionSequential([tfd.BatchBroadcast(
        tfd.MultivariateNormalDiag(scale_diag=scale * np.ones(5)), [4])])
    results = results._replace(momentum_distribution=metric)
    state, results = kernel.one_step(state, results, seed=[2, i])
  assert len(traces) == traced


def test_diagonal_mass_matrix_adaptation_learns_the_scales():
  """DiagonalMassMatrixAdaptation around step-size adaptation around our
  kernel, unchanged: the adapted momentum precision (the inverse mass)
  approaches the target's variances, 1e-4 to 1e4, and the sampler then
  moves every coordinate on its scale."""
  target = _scaled_target()
  chains = 16
  init = tf.zeros([chains, 5], tf.float64)
  kernel = nuts.NoUTurnSampler(target.log_prob, 1e-2, max_tree_depth=8)
  kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
      kernel, num_adaptation_steps=150)
  kernel = tfp.experimental.mcmc.DiagonalMassMatrixAdaptation(
      kernel, initial_running_variance=(
          tfp.experimental.stats.RunningVariance.from_stats(
              num_samples=tf.constant(1., tf.float64),
              mean=tf.zeros(5, tf.float64), variance=tf.ones(5, tf.float64))))

  @tf.function(autograph=False)
  def run():
    return tfp.mcmc.sample_chain(
        100, init, kernel=kernel, num_burnin_steps=200, seed=[3, 5],
        trace_fn=lambda _, r: (r.inner_results.inner_results  # pylint: disable=g-long-lambda
                               .momentum_distribution.model[0].distribution
                               .distribution.precision.diag_part()))

  draws, precision = run()
  ratio = precision.numpy()[-1].mean(0) / SCALES ** 2
  # The initial running variance (1, with the weight of one draw) stays in
  # the estimate: about 1 / 3200 in it, a few times the smallest variance.
  assert np.all((ratio > 0.3) & (ratio < 5.)), ratio
  sd = draws.numpy().reshape(-1, 5).std(0) / SCALES
  assert np.all((sd > 0.7) & (sd < 1.3)), sd


def _adapting_kernel_in_a_transform(target_log_prob, num_adaptation_steps):
  """TransformedTransitionKernel(DiagonalMassMatrixAdaptation(
  DualAveragingStepSizeAdaptation(ours))), all TFP's kernels unchanged:
  the bijector (exp) maps the unconstrained state the adaptation sees to
  the positive one the target takes."""
  kernel = nuts.NoUTurnSampler(target_log_prob, 1e-2, max_tree_depth=8)
  kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
      kernel, num_adaptation_steps=num_adaptation_steps)
  kernel = tfp.experimental.mcmc.DiagonalMassMatrixAdaptation(
      kernel, initial_running_variance=(
          tfp.experimental.stats.RunningVariance.from_stats(
              num_samples=tf.constant(1., tf.float64),
              mean=tf.zeros(5, tf.float64), variance=tf.ones(5, tf.float64))))
  return tfp.mcmc.TransformedTransitionKernel(kernel, tfp.bijectors.Exp())


def _momentum_variance(results):
  """The innermost (our kernel's) momentum variance, `[chains, 5]`."""
  while hasattr(results, "inner_results"):
    results = results.inner_results
  return tf.nest.flatten(results.momentum_distribution.variance())[0]


@pytest.mark.slow
def test_mass_matrix_adaptation_inside_a_transformed_kernel():
  """The target is positive, log-normal with log-scales 1e-2 to 1e2: on
  the unconstrained (log) scale the kernels see, a Gaussian with those
  scales. The adapted metric's momentum variance approaches the inverse
  of the unconstrained variances, and the draws have the right scales."""
  target = tfd.TransformedDistribution(_scaled_target(), tfp.bijectors.Exp())
  kernel = _adapting_kernel_in_a_transform(target.log_prob, 150)
  init = tf.ones([16, 5], tf.float64)   # the unconstrained origin

  @tf.function(autograph=False)
  def run():
    return tfp.mcmc.sample_chain(
        100, init, kernel=kernel, num_burnin_steps=200, seed=[6, 1],
        trace_fn=lambda _, r: _momentum_variance(r))

  draws, momentum_variance = run()
  ratio = 1. / (momentum_variance.numpy()[-1].mean(0) * SCALES ** 2)
  assert np.all((ratio > 0.3) & (ratio < 5.)), ratio
  sd = np.log(draws.numpy()).reshape(-1, 5).std(0) / SCALES
  assert np.all((sd > 0.7) & (sd < 1.3)), sd


def test_mass_matrix_updates_do_not_retrace_the_step():
  """Eagerly, each step of the adaptation stack gives our kernel a new
  mass matrix (new values, the same structure): the batched program and
  its compiled step take it as an input, so the target is traced for the
  first steps only, never again as the metric changes."""
  traces = []
  scaled = tfd.TransformedDistribution(_scaled_target(), tfp.bijectors.Exp())

  def target(x):
    traces.append(1)
    return scaled.log_prob(x)

  kernel = _adapting_kernel_in_a_transform(target, 10)
  state = tf.ones([4, 5], tf.float64)
  results = kernel.bootstrap_results(state)
  variances = []
  for i in range(6):
    state, results = kernel.one_step(state, results, seed=[7, i])
    variances.append(_momentum_variance(results).numpy())
    if i == 1:
      traced = len(traces)
  assert len(traces) == traced
  # The metric did change at every step.
  assert all(np.any(a != b) for a, b in zip(variances, variances[1:]))


@pytest.mark.parametrize("graph", [False, True])
def test_a_dense_metric_in_a_v1_graph(graph):
  """TFP's `PreconditionedNoUTurnSampler` tests run in a `tf.compat.v1`
  graph: a dense metric steps there as eagerly (the program's trajectory
  output loses its static rank in such a graph)."""
  cov = np.array([[1., 0.9, 0.9], [0.9, 1., 0.9], [0.9, 0.9, 1.]])

  def build():
    target = tfd.MultivariateNormalTriL(
        loc=[1., 2., 3.], scale_tril=np.linalg.cholesky(cov))
    metric = tfd.MultivariateNormalTriL(
        scale_tril=np.linalg.cholesky(np.linalg.inv(cov)))
    kernel = nuts.NoUTurnSampler(target.log_prob, 0.5, max_tree_depth=3,
                                 momentum_distribution=metric)
    return tfp.mcmc.sample_chain(2, tf.zeros([3], tf.float64), kernel=kernel,
                                 trace_fn=None, seed=[3, 4])

  if not graph:
    draws = build().numpy()
  else:
    with tf.Graph().as_default():
      out = build()
      with tf.compat.v1.Session() as session:
        draws = session.run(out)
  assert draws.shape == (2, 3)
  assert np.all(np.isfinite(draws))


def test_the_default_metric_crosses_a_tf_function_without_tfps_constructors(
    constructions):
  # The default (identity) metric the results carry is a DiagonalMomentum:
  # it stands for TFP's distribution (the form DiagonalMassMatrixAdaptation
  # updates) and is rebuilt from its tensors at a tf.function's call
  # without running TFP's constructors (which cost a cheap model more than
  # its steps).
  kernel = nuts.NoUTurnSampler(
      lambda x: -0.5 * tf.reduce_sum((x / SCALES) ** 2, -1), 0.5,
      max_tree_depth=3)
  init = tf.zeros([3, 5], tf.float64)
  results = kernel.bootstrap_results(init)
  metric = results.momentum_distribution
  assert isinstance(metric, nuts.momentum.DiagonalMomentum)
  p = tf.random.stateless_normal([3, 5], [1, 2], dtype=tf.float64)
  standard = tfd.MultivariateNormalDiag(tf.zeros(5, tf.float64))
  np.testing.assert_allclose(metric.log_prob([p]), standard.log_prob(p),
                             rtol=1e-12)
  model = metric.model
  assert isinstance(model[0], tfd.BatchBroadcast)
  np.testing.assert_allclose(metric.variance()[0], np.ones([3, 5]))
  built = constructions(tfp.experimental.distributions
                        .MultivariateNormalPrecisionFactorLinearOperator)
  step = tf.function(lambda s, r: kernel.one_step(s, r, seed=[1, 2]))
  state, new_results = step(init, results)
  del built[:]
  state, new_results = step(state, new_results)
  assert not built
  assert isinstance(new_results.momentum_distribution,
                    nuts.momentum.DiagonalMomentum)


def test_mass_matrix_adaptation_with_estimation_steps_reads_the_default():
  # DiagonalMassMatrixAdaptation with num_estimation_steps keeps the inner
  # kernel's metric until its estimation ends, then rewrites it from the
  # default one (`copy(model=...)`), which stays a DiagonalMomentum so that
  # the results keep one type through sample_chain's loop.
  kernel = tfp.experimental.mcmc.DiagonalMassMatrixAdaptation(
      nuts.NoUTurnSampler(_scaled_target().log_prob, 1e-2, max_tree_depth=6),
      initial_running_variance=(
          tfp.experimental.stats.RunningVariance.from_stats(
              num_samples=tf.constant(1., tf.float64),
              mean=tf.zeros(5, tf.float64), variance=tf.ones(5, tf.float64))),
      num_estimation_steps=150)

  @tf.function(autograph=False)
  def run():
    return tfp.mcmc.sample_chain(
        200, tf.zeros([8, 5], tf.float64), kernel=kernel, seed=[3, 5],
        trace_fn=lambda _, r: r.inner_results.momentum_distribution
        .precision_factors[0])

  _, factors = run()
  factors = factors.numpy()
  np.testing.assert_array_equal(factors[:149], 1.)
  # From step 150 on: the square root of the variance estimated then.
  assert np.all(np.isfinite(factors[149:])) and np.all(factors[149:] > 0)
  assert not np.allclose(factors[149], 1.)
  np.testing.assert_array_equal(factors[149:], factors[149:150].repeat(51, 0))
