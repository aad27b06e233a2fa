"""Trajectory fusion keeps every draw: `NUTSKernelResults.trajectory_states`.

The identity tests are deterministic (fixed seeds, float64): false-failure
rate 0. The moment test is statistical with a fixed seed; its false-failure
rate (over seeds) is stated there.
"""
import arviz
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

import nuts
from nuts import trajectory_draws

PRECISION = np.array([[2., 0.5, 0.], [0.5, 1., 0.2], [0., 0.2, 0.5]])
MEAN = np.array([1., -1., 0.5])


def gaussian_log_prob(x):
  centered = x - tf.constant(MEAN, x.dtype)
  return -0.5 * tf.einsum("...i,ij,...j->...", centered,
                          tf.constant(PRECISION, x.dtype), centered)


INIT = np.random.RandomState(1).randn(5, 3)


def _step(k, backend="local:eager", init=INIT):
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, 0.4, max_tree_depth=5,
                               num_trajectories_per_step=k, backend=backend)
  state = tf.constant(init)
  return kernel.one_step(state, kernel.bootstrap_results(state), seed=[3, 4])


def test_a_fused_step_returns_the_draw_of_every_trajectory_of_every_chain():
  # Trajectory i of a step is keyed by (step seed, chain, i) and starts at
  # trajectory i - 1's draw, so a step of k trajectories runs the first k
  # of a step of k + 1: its draws are their first k rows.
  draws = {}
  for k in (1, 2, 3):
    state, results = _step(k)
    draws[k] = results.trajectory_states.numpy()
    assert draws[k].shape == (k, 5, 3)
    np.testing.assert_array_equal(draws[k][-1], state.numpy())
  np.testing.assert_array_equal(draws[2], draws[3][:2])
  np.testing.assert_array_equal(draws[1], draws[2][:1])
  # Every chain moved in every trajectory (a draw is not a copy).
  assert np.all(np.any(np.diff(draws[3], axis=0) != 0, axis=-1))


def test_trajectory_states_keep_the_state_structure_and_start_as_the_state():
  kernel = nuts.NoUTurnSampler(
      lambda a, b: gaussian_log_prob(tf.concat([a, b], -1)), 0.4,
      max_tree_depth=4, num_trajectories_per_step=2, backend="local:eager")
  state = [tf.constant(INIT[:, :1]), tf.constant(INIT[:, 1:])]
  results = kernel.bootstrap_results(state)
  assert [t.shape for t in results.trajectory_states] == [(2, 5, 1),
                                                           (2, 5, 2)]
  np.testing.assert_array_equal(results.trajectory_states[1][1], INIT[:, 1:])
  new_state, results = kernel.one_step(state, results, seed=[5, 6])
  for part, draws in zip(new_state, results.trajectory_states):
    assert draws.shape[0] == 2
    np.testing.assert_array_equal(draws[-1], part)


def test_flatten_draws_gives_arviz_chains_of_n_times_k_draws_in_order():
  draws = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)  # [n, k, chains, d]
  flat = trajectory_draws.flatten_draws(draws)
  assert flat.shape == (4, 6, 5)
  np.testing.assert_array_equal(flat[1, 4], draws[1, 1, 1])


def test_fused_draws_from_sample_chain_have_the_targets_moments():
  """All k draws of every fused step, traced as the module docstring of
  `nuts/trajectory_draws.py` says, against exact draws of the Gaussian:
  means and second moments of the three coordinates, each compared by a z
  score with both Monte Carlo errors (ArviZ's MCSE of the chains' draws,
  the exact draws' standard error). Six |z| < 4.5: false-failure rate about
  6 * 7e-6 < 1e-4 (normal approximation, MCSE estimated)."""
  k, num_chains, num_steps = 4, 16, 150
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, 0.5, max_tree_depth=6,
                               num_trajectories_per_step=k, backend="pc:xla")
  init = np.random.RandomState(2).uniform(-2, 2, (num_chains, 3))

  @tf.function
  def run(init):
    return tfp.mcmc.sample_chain(
        num_steps, init, kernel=kernel, num_burnin_steps=20, seed=[7, 8],
        trace_fn=lambda _, r: r.trajectory_states)

  states, draws = run(tf.constant(init, tf.float32))
  assert draws.shape == (num_steps, k, num_chains, 3)
  np.testing.assert_array_equal(draws[:, -1], states)
  samples = trajectory_draws.flatten_draws(draws).astype(np.float64)
  assert samples.shape == (num_chains, num_steps * k, 3)

  cov = np.linalg.inv(PRECISION)
  exact = np.random.RandomState(3).multivariate_normal(MEAN, cov, 100000)
  for statistic in (lambda x: x, lambda x: x**2):
    ours, theirs = statistic(samples), statistic(exact)
    mcse = arviz.mcse(arviz.convert_to_dataset(ours), method="mean")["x"]
    exact_se = theirs.std(0) / np.sqrt(len(theirs))
    z = (ours.mean((0, 1)) - theirs.mean(0)) / np.hypot(mcse.values,
                                                        exact_se)
    assert np.all(np.abs(z) < 4.5), z
