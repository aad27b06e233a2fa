"""Stan's windowed warm-up schedule and its step-size and metric updates.

Stan's reference manual ("HMC algorithm parameters", "Automatic parameter
tuning") splits warm-up into a fast window that only adapts the step size
while the chains find the typical set (75 steps), slow windows that also
estimate the posterior variances for a diagonal metric (25 steps, doubling,
the last one stretched to the end), and a fast final window that adapts
the step size to the last metric (50 steps). Dual averaging restarts in
each window, from a step size found again for the new metric.
"""
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

tfd = tfp.distributions

__all__ = ["Window", "adaptation_windows", "regularized_variance",
           "momentum_distribution", "reasonable_step_size"]

INIT_BUFFER, TERM_BUFFER, BASE_WINDOW = 75, 50, 25


class Window(tuple):
  """`(length, estimates_metric)`: one stage of warm-up."""
  __slots__ = ()

  def __new__(cls, length, estimates_metric):
    return super().__new__(cls, (int(length), bool(estimates_metric)))

  @property
  def length(self):
    return self[0]

  @property
  def estimates_metric(self):
    return self[1]


def adaptation_windows(num_steps):
  """Stan's warm-up windows for `num_steps` steps, as `Window`s.

  Fewer than 20 steps only adapt the step size (too few draws to estimate
  variances); where the default buffers (75 + 25 + 50) do not fit, they
  become 15%, 75% and 10% of the steps, as in Stan.
  """
  num_steps = int(num_steps)
  if num_steps < 0:
    raise ValueError(f"num_adaptation_steps must be >= 0, got {num_steps}")
  if num_steps == 0:
    return []
  if num_steps < 20:
    return [Window(num_steps, False)]
  init, term, base = INIT_BUFFER, TERM_BUFFER, BASE_WINDOW
  if init + base + term > num_steps:
    init, term = int(0.15 * num_steps), int(0.1 * num_steps)
    base = num_steps - init - term
  windows = [Window(init, False)] if init else []
  start, size, slow_end = init, base, num_steps - term
  while start < slow_end:
    # A window whose successor (twice as long) would not fit is stretched
    # to the end of the slow stage.
    if start + 3 * size > slow_end:
      size = slow_end - start
    windows.append(Window(size, True))
    start += size
    size *= 2
  if term:
    windows.append(Window(term, False))
  return windows


def regularized_variance(draws, chain_ndims):
  """Per-coordinate variance of a window's draws `[draws, chains..., k]`.

  Within-chain variances averaged over the chains: chains still apart
  after a short window do not inflate it, and every chain's draws count.
  Shrunk as Stan's is, with weight 5 / (n + 5) for n draws per chain, so
  that a short window cannot give a degenerate metric; but towards 1e-3
  times the part's geometric-mean variance, not towards Stan's absolute
  1e-3, which would dwarf the variance of a parameter of scale 1e-3 (a
  regression coefficient on covariates of scale 100) and leave its metric
  several times too wide.
  """
  n = tf.cast(tf.shape(draws)[0], draws.dtype)
  variance = tf.reduce_mean(tf.math.reduce_variance(draws, axis=0),
                            axis=list(range(chain_ndims)))
  tiny = tf.constant(np.finfo(draws.dtype.as_numpy_dtype).tiny, draws.dtype)
  scale = tf.exp(tf.reduce_mean(tf.math.log(variance + tiny), -1,
                                keepdims=True))
  return (n / (n + 5.)) * variance + 1e-3 * scale * (5. / (n + 5.))


def momentum_distribution(precisions, state_parts):
  """Momenta for a diagonal metric: one independent Normal per flat part,
  with variance `precision` (the metric is the inverse of the posterior
  variance), batched like the chains."""
  return tfd.JointDistributionSequential([
      tfd.Independent(
          tfd.Normal(tf.zeros_like(x), tf.sqrt(precision)
                     * tf.ones_like(x)), reinterpreted_batch_ndims=1)
      for precision, x in zip(precisions, state_parts)])


def reasonable_step_size(target_log_prob_fn, state_parts, precisions,
                         step_size, seed, max_doublings=40):
  """Stan's heuristic for a first step size under a metric.

  From `step_size`, double it while one leapfrog step from the current
  states (momenta drawn from the metric) is accepted with probability above
  0.8 averaged over chains, or halve it while below; stop where it crosses.
  `step_size` is a structure of positive tensors (a scalar or one per
  part); all of it is scaled by the same factor.
  """
  dtype = state_parts[0].dtype
  seeds = tfp.random.split_seed(seed, len(state_parts))
  momenta = [tf.sqrt(m) * tf.random.stateless_normal(tf.shape(x), s, dtype=dtype)
             for m, x, s in zip(precisions, state_parts, seeds)]
  steps = tf.nest.flatten(step_size)
  if len(steps) == 1:
    steps = steps * len(state_parts)
  steps = [tf.cast(s, dtype) for s in steps]

  def value_and_grads(parts):
    # Fresh tensors: bijectors cache their outputs, and the log density of
    # a tensor a bijector returned would not depend on it for the tape.
    parts = [tf.identity(x) for x in parts]
    with tf.GradientTape() as tape:
      tape.watch(parts)
      logp = target_log_prob_fn(*parts)
    return logp, tape.gradient(logp, parts)

  def neg_energy(logp, ps):
    return logp - 0.5 * tf.add_n([tf.reduce_sum(p * p / m, -1)
                                  for p, m in zip(ps, precisions)])

  logp0, grads0 = value_and_grads(state_parts)
  h0 = neg_energy(logp0, momenta)
  log_target = tf.math.log(tf.constant(0.8, dtype))

  def log_accept(factor):
    half = [p + 0.5 * factor * e * g
            for p, e, g in zip(momenta, steps, grads0)]
    moved = [x + factor * e * p / m
             for x, e, p, m in zip(state_parts, steps, half, precisions)]
    logp1, grads1 = value_and_grads(moved)
    new_p = [p + 0.5 * factor * e * g for p, e, g in zip(half, steps, grads1)]
    diff = neg_energy(logp1, new_p) - h0
    diff = tf.where(tf.math.is_finite(diff), tf.minimum(diff, 0.),
                    tf.constant(-float("inf"), dtype))
    return tf.reduce_logsumexp(diff) - tf.math.log(
        tf.cast(tf.size(diff), dtype))

  one = tf.constant(1., dtype)
  first = log_accept(one)
  direction = tf.where(first > log_target, one, -one)

  def keep_going(i, factor, accept):
    return (i < max_doublings) & (direction * (accept - log_target) > 0.)

  def body(i, factor, accept):
    factor = factor * tf.pow(tf.constant(2., dtype), direction)
    return i + 1, factor, log_accept(factor)

  _, factor, _ = tf.while_loop(keep_going, body, (0, one, first))
  return tf.nest.map_structure(lambda s: tf.cast(s, dtype) * factor,
                               step_size)
