"""Statistical tests of the recursive NUTS kernel (`nuts/`).

Every test uses fixed seeds, so its outcome is deterministic; the comment on
each states the false-failure rate its thresholds would have over seeds.
Small dimensions and many short chains keep them cheap; the local backend
runs eagerly (its per-block overhead dominates, not the batch size).
"""
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import nuts
import tfp_autobatch as tab

tfb = tfp.bijectors
tfd = tfp.distributions

EAGER = "local:eager"
MU = np.array([1., -1., 0.5])
SD = np.array([1., 2., 0.5])
CORR = np.array([[1., 0.8, 0.3], [0.8, 1., 0.5], [0.3, 0.5, 1.]])
COV = CORR * SD[:, None] * SD[None, :]
CORRELATED = tfd.MultivariateNormalTriL(MU, np.linalg.cholesky(COV))
INDEPENDENT = tfd.MultivariateNormalDiag(MU, SD)


@pytest.fixture(scope="module")
def correlated_kernel():
  return nuts.NoUTurnSampler(CORRELATED.log_prob, 0.3, max_tree_depth=6,
                             num_trajectories_per_step=3, backend=EAGER)


def _check_moments(draws, mean, cov, num_sigma):
  """Means and variances of iid draws ([n, d]) within num_sigma std errors."""
  n = draws.shape[0]
  var = np.diag(cov)
  np.testing.assert_array_less(np.abs(draws.mean(0) - mean),
                               num_sigma * np.sqrt(var / n))
  np.testing.assert_array_less(np.abs(draws.var(0) - var),
                               num_sigma * var * np.sqrt(2. / n))


@pytest.mark.slow
def test_invariance_from_exact_draws(correlated_kernel):
  # Chains started at exact draws stay exactly distributed after a (fused,
  # 3-trajectory) step, and chains are independent, so each coordinate's mean
  # and variance are within 4.5 standard errors except with probability
  # ~7e-6 each (12 checks over both tests: ~1e-4 false failures).
  n = 512
  init = CORRELATED.sample(n, seed=(11, 12))
  _check_moments(init.numpy(), MU, COV, 4.5)
  results = correlated_kernel.bootstrap_results(init)
  state, results = correlated_kernel.one_step(init, results, seed=(13, 14))
  assert np.mean(results.leapfrogs_taken) > 3 * 3   # it really moved
  assert not np.any(results.has_divergence)
  _check_moments(state.numpy(), MU, COV, 4.5)
  # And the state moved away from the start (chains are not stuck).
  assert np.mean(np.any(state.numpy() != init.numpy(), -1)) > 0.9


@pytest.mark.slow
def test_every_coordinate_stays_exact_over_many_steps():
  """1,000 independent chains from exact draws of a 2-d standard normal,
  90 kept steps each: every coordinate's mean and second moment stay
  exact. The per-chain averages are independent, so each check is within
  4.5 standard errors except with probability ~7e-6 (4 checks: ~3e-5).
  With the random keys of the draws' kinds overlapping (the direction
  and top-level acceptance draws of doubling 1 were momentum coordinate
  1's uniforms), coordinate 1's mean sat 0.05 below 0, 9 standard errors
  here, while coordinate 0 and TFP's kernel were exact."""
  def log_prob(x):
    return -0.5 * tf.reduce_sum(x * x, -1)
  kernel = nuts.NoUTurnSampler(log_prob, 0.5, max_tree_depth=2,
                               backend="pc:graph")
  init = tf.random.stateless_normal([1000, 2], seed=[3, 4], dtype=tf.float64)
  draws = tf.function(lambda: tfp.mcmc.sample_chain(
      90, init, kernel=kernel, num_burnin_steps=10, trace_fn=None,
      seed=(11, 12)))().numpy()
  for moment, exact in ((draws.mean(0), 0.), ((draws ** 2).mean(0), 1.)):
    error = np.abs(moment.mean(0) - exact)   # over chains, per coordinate
    standard_error = moment.std(0) / np.sqrt(moment.shape[0])
    np.testing.assert_array_less(error, 4.5 * standard_error)


@pytest.mark.nightly   # minutes each: `make test-nightly`
@pytest.mark.slow
@pytest.mark.parametrize("target,cov", [(INDEPENDENT, np.diag(SD ** 2)),
                                        (CORRELATED, COV)],
                         ids=["iid", "correlated"])
def test_moments_and_rhat(correlated_kernel, target, cov):
  # 64 chains from overdispersed starts, 8 burn-in + 10 kept steps of 3 fused
  # trajectories. Means within 5 Monte Carlo standard errors (ESS from
  # tfp.mcmc.effective_sample_size over chains): false-failure rate ~1e-6 per
  # coordinate if the ESS estimate is right. R-hat over chains of only 10
  # draws is inflated by the within-chain autocorrelation even at
  # stationarity (lag-1 autocorrelation 0.5 gives R-hat ~1.2), so the bound
  # is loose (1.3) here; convergence from the 3-sd overdispersed starts is
  # what it checks (a stuck or biased chain gives R-hat >> 1.3).
  kernel = correlated_kernel if target is CORRELATED else (
      correlated_kernel.copy(target_log_prob_fn=target.log_prob))
  init = tf.constant(MU + 3. * SD * np.random.RandomState(5).randn(64, 3))
  draws = tfp.mcmc.sample_chain(10, init, kernel=kernel, num_burnin_steps=8,
                                trace_fn=None, seed=(21, 22)).numpy()
  flat = draws.reshape(-1, 3)
  ess = tfp.mcmc.effective_sample_size(draws, cross_chain_dims=1).numpy()
  assert np.all(ess > 100)
  mcse = np.sqrt(np.diag(cov) / ess)
  np.testing.assert_array_less(np.abs(flat.mean(0) - MU), 5 * mcse)
  np.testing.assert_allclose(np.cov(flat.T), cov, atol=0.25 * np.max(cov))
  rhat = tfp.mcmc.potential_scale_reduction(draws).numpy()
  np.testing.assert_array_less(rhat, 1.3)


@pytest.mark.slow
def test_drop_in_with_adaptation_and_bijector():
  # A positive parameter x ~ Gamma(3, 2) sampled on log scale through
  # TransformedTransitionKernel(tfb.Exp()), the step size adapted by
  # DualAveragingStepSizeAdaptation, inside sample_chain with burn-in,
  # thinning and trace_fn. Mean within 5 MCSE (rate ~1e-6).
  target = tfd.Gamma(np.float64(3.), np.float64(2.))
  kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
      tfp.mcmc.TransformedTransitionKernel(
          nuts.NoUTurnSampler(target.log_prob, 1.0, max_tree_depth=5,
                              backend=EAGER),
          tfb.Exp()),
      num_adaptation_steps=12)
  init = tf.constant(np.full([32], 3.0))
  draws, (step_size, accept) = tfp.mcmc.sample_chain(
      8, init, kernel=kernel, num_burnin_steps=14, num_steps_between_results=1,
      trace_fn=lambda _, r: (r.inner_results.inner_results.step_size,
                             r.inner_results.inner_results.log_accept_ratio),
      seed=(31, 32))
  draws = draws.numpy()
  assert np.all(draws > 0)
  assert 0.1 < float(step_size[-1]) < 3.0
  assert np.mean(np.exp(np.minimum(accept.numpy(), 0.))) > 0.5
  ess = tfp.mcmc.effective_sample_size(draws, cross_chain_dims=1).numpy()
  mcse = np.sqrt(target.variance().numpy() / ess)
  assert abs(draws.mean() - 1.5) < 5 * mcse


def _compiled_backend():
  for b in ("pc:xla", "pc:graph"):
    if b in tab.BACKENDS:
      return b
  return None


@pytest.mark.slow
@pytest.mark.skipif(_compiled_backend() is None, reason="no pc backend")
@pytest.mark.parametrize("jit_compile", [False, True])
def test_sample_chain_in_tf_function_float32_list_state(jit_compile):
  # Multi-part float32 state with per-part step sizes, SimpleStepSizeAdaptation,
  # whole sample_chain compiled in one tf.function on the pc backend, with
  # or without XLA for the whole function (XLA compilation of the program
  # dominates). Means within 5 MCSE (rate ~1e-6 per part).
  def target(x, y):
    return (tfd.Normal(np.float32(1.), np.float32(1.)).log_prob(x)
            + tfd.Normal(np.float32(-2.), np.float32(0.5)).log_prob(y))
  kernel = tfp.mcmc.SimpleStepSizeAdaptation(
      nuts.NoUTurnSampler(target, [np.float32(0.5), np.float32(0.3)],
                          max_tree_depth=5, backend=_compiled_backend()),
      num_adaptation_steps=20)
  init = [tf.zeros([16], tf.float32), tf.zeros([16], tf.float32)]

  @tf.function(jit_compile=jit_compile)
  def run():
    return tfp.mcmc.sample_chain(60, init, kernel=kernel, num_burnin_steps=30,
                                 trace_fn=lambda _, r: r.inner_results
                                 .leapfrogs_taken, seed=(41, 42))
  (x, y), leapfrogs = run()
  assert x.dtype == tf.float32
  assert np.all(leapfrogs.numpy() >= 1)
  for draws, mean, sd in ((x, 1., 1.), (y, -2., 0.5)):
    ess = tfp.mcmc.effective_sample_size(draws, cross_chain_dims=1).numpy()
    assert abs(draws.numpy().mean() - mean) < 5 * sd / np.sqrt(ess)


# The posteriordb tests (kidiq and three more) live in test_nuts_posteriordb.py.


def _gaussian_100d():
  """A 100-d Gaussian with dense correlations: a random rotation of
  variances log-spaced over [0.25, 4] (condition number 16), random mean."""
  rs = np.random.RandomState(17)
  d = 100
  q, _ = np.linalg.qr(rs.randn(d, d))
  cov = (q * np.geomspace(0.25, 4., d)) @ q.T
  cov = 0.5 * (cov + cov.T)
  return rs.randn(d), cov


@pytest.mark.nightly   # minutes: `make test-nightly`
@pytest.mark.slow
@pytest.mark.skipif(_compiled_backend() is None, reason="no pc backend")
def test_moments_and_rhat_100d_correlated_gaussian():
  # 16 chains from overdispersed starts (3 marginal sds), per-chain step
  # sizes adapted by dual averaging over 400 of 500 burn-in steps, 500 kept
  # draws, all in one tf.function on the pc backend. Means and marginal
  # variances within 5 Monte Carlo standard errors (ESS from
  # tfp.mcmc.effective_sample_size over chains, of x for the means and of
  # (x - mean)^2 for the variances): ~6e-7 false failures per check if the
  # ESS estimate is right, 200 checks: ~1e-4. R-hat (non-split, over chains)
  # below 1.01 for all 100 coordinates: at the ESS per chain reached here
  # (>= 150) R-hat - 1 is ~0.002 at stationarity, and crossing 0.01 needs
  # the between-chain variance of the chain means to come out 5x too large
  # (chi-square with 15 dof above 75: ~1e-9 per coordinate).
  mean, cov = _gaussian_100d()
  target = tfd.MultivariateNormalTriL(mean, np.linalg.cholesky(cov))
  chains, d = 16, mean.shape[0]
  sd = np.sqrt(np.diag(cov))
  rs = np.random.RandomState(18)
  init = tf.constant(mean + 3. * sd * rs.randn(chains, d))
  kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
      nuts.NoUTurnSampler(target.log_prob, np.full([chains, 1], 0.1),
                          max_tree_depth=8, backend=_compiled_backend()),
      num_adaptation_steps=400)

  @tf.function
  def run():
    return tfp.mcmc.sample_chain(
        500, init, kernel=kernel, num_burnin_steps=500,
        trace_fn=lambda _, r: r.inner_results.has_divergence, seed=(61, 62))
  draws, divergent = run()
  draws = draws.numpy()
  assert not np.any(divergent.numpy())
  flat = draws.reshape(-1, d)
  ess = tfp.mcmc.effective_sample_size(draws, cross_chain_dims=1).numpy()
  assert np.all(ess > 150 * chains / 16), np.min(ess)
  np.testing.assert_array_less(np.abs(flat.mean(0) - mean),
                               5. * np.sqrt(np.diag(cov) / ess))
  sq = (draws - mean) ** 2
  ess_sq = tfp.mcmc.effective_sample_size(sq, cross_chain_dims=1).numpy()
  var_mcse = sq.reshape(-1, d).std(0) / np.sqrt(ess_sq)
  np.testing.assert_array_less(np.abs(sq.reshape(-1, d).mean(0)
                                      - np.diag(cov)), 5. * var_mcse)
  rhat = tfp.mcmc.potential_scale_reduction(draws).numpy()
  np.testing.assert_array_less(rhat, 1.01)
