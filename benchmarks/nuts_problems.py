"""Targets of the NUTS benchmark (`benchmarks/nuts.py`): the paper's two.

Radul et al. (2020), section 4, sample two targets with NUTS:

- ``logistic_regression``: Bayesian logistic regression with 100 regressors
  and 10,000 synthetic data points, a standard normal prior on the weights
  (Fig. 6).  We draw the design matrix X with i.i.d. N(0, 1) entries, true
  weights w* ~ N(0, I) and labels y ~ Bernoulli(sigmoid(X w*)); no
  intercept.  The model is w ~ N(0, I), y_i ~ Bernoulli(sigmoid(x_i . w)).
  Chains start at w* + 0.01 N(0, I), near the posterior (whose standard
  deviations are about 0.06).  The default step size 0.012 (our fixed
  reference setting) gives a mean acceptance statistic of about 0.97 and
  trajectories of 15 leapfrog steps (tree depth 4), occasionally 63.
- ``correlated_gaussian``: a 100-dimensional zero-mean Gaussian (Fig. 7).
  The paper gives no covariance, so we fix one: Sigma = Q diag(s^2) Q^T with
  Q a random rotation (QR of a seeded Gaussian matrix) and standard
  deviations s log-spaced from 0.1 to 1 (condition number 100).  Chains
  start at exact draws from the target.  The default step size 0.06 gives a
  mean acceptance statistic of about 0.9 and trajectories of 31 or 63
  leapfrog steps, chosen differently by different chains and trajectories:
  what makes utilisation fall below 1 when chains synchronise (Fig. 7).

Every problem is deterministic given ``(seed, sizes)``: the data, the true
weights and the starting points are drawn with NumPy from fixed seeds, so
all systems (ours, TFP's, Stan) see the same target and start.  Sizes can be
shrunk (``num_dims``, ``num_data``) for tests.
"""
import collections

import numpy as np
import tensorflow as tf

PROBLEMS = ("logistic_regression", "correlated_gaussian")
DEFAULT_STEP_SIZES = {"logistic_regression": 0.012,
                      "correlated_gaussian": 0.06}
DEFAULT_SIZES = {"logistic_regression": {"num_dims": 100, "num_data": 10000},
                 "correlated_gaussian": {"num_dims": 100}}

Problem = collections.namedtuple("Problem", [
    "name",
    "num_dims",
    "target_log_prob",   # batched TF log density: [..., d] -> [...]
    "initial_state",     # initial_state(num_chains) -> float32 [chains, d]
    "step_size",         # the default step size (float)
    "stan_code",         # the same model in the Stan language
    "stan_data",         # its data, a dict of JSON-able values
    "stan_param",        # the name of the state vector in `stan_code`
    "description",       # one line, for reports
])


def make_problem(name, num_dims=None, num_data=None, seed=0):
  """The problem `name` (see `PROBLEMS`), at the paper's size by default.

  Args:
    name: "logistic_regression" or "correlated_gaussian".
    num_dims: dimension of the state (default 100).
    num_data: data points of the logistic regression (default 10,000);
      must be left out for the Gaussian.
    seed: seed of the data, the target and the starting points.
  """
  if name == "logistic_regression":
    return _logistic_regression(num_dims or 100, num_data or 10000, seed)
  if name == "correlated_gaussian":
    if num_data is not None:
      raise ValueError("correlated_gaussian has no data: leave num_data out")
    return _correlated_gaussian(num_dims or 100, seed)
  raise ValueError(f"unknown problem {name!r}; problems: {list(PROBLEMS)}")


def _rng(seed, name, stream):
  return np.random.default_rng([seed, PROBLEMS.index(name), stream])


def _starts(seed, name, center, scale, num_dims):
  """`initial_state(n)`: the first n rows of one seeded pool of starts."""

  def initial_state(num_chains):
    noise = _rng(seed, name, 99).standard_normal((num_chains, num_dims))
    return (center + scale * noise).astype(np.float32)
  return initial_state


def _logistic_regression(num_dims, num_data, seed):
  name = "logistic_regression"
  rng = _rng(seed, name, 0)
  x = rng.standard_normal((num_data, num_dims))
  w_true = rng.standard_normal(num_dims)
  labels = rng.random(num_data) < 1 / (1 + np.exp(-x @ w_true))
  x_tf = tf.constant(x, tf.float32)
  y_tf = tf.constant(labels, tf.float32)

  def target_log_prob(w):
    logits = tf.einsum("nd,...d->...n", x_tf, w)   # [..., N]
    likelihood = tf.reduce_sum(y_tf * logits - tf.nn.softplus(logits), -1)
    return likelihood - 0.5 * tf.reduce_sum(w * w, -1)

  stan_code = """
data {
  int<lower=0> N;
  int<lower=1> D;
  matrix[N, D] x;
  array[N] int<lower=0, upper=1> y;
}
parameters {
  vector[D] w;
}
model {
  w ~ std_normal();
  y ~ bernoulli_logit(x * w);
}
"""
  stan_data = {"N": num_data, "D": num_dims,
               "x": x.astype(np.float32).astype(float).tolist(),
               "y": labels.astype(int).tolist()}
  return Problem(
      name, num_dims, target_log_prob,
      _starts(seed, name, w_true, 0.01, num_dims),
      DEFAULT_STEP_SIZES[name], stan_code, stan_data, "w",
      f"Bayesian logistic regression, {num_dims} regressors, {num_data} "
      "synthetic data points, N(0, I) prior")


def _correlated_gaussian(num_dims, seed):
  name = "correlated_gaussian"
  rng = _rng(seed, name, 0)
  rotation, _ = np.linalg.qr(rng.standard_normal((num_dims, num_dims)))
  scales = np.geomspace(0.1, 1.0, num_dims)
  cov = (rotation * scales**2) @ rotation.T
  precision = (rotation / scales**2) @ rotation.T
  precision_tf = tf.constant(precision, tf.float32)
  chol = np.linalg.cholesky(cov)

  def target_log_prob(x):
    return -0.5 * tf.reduce_sum(x * tf.linalg.matvec(precision_tf, x), -1)

  def initial_state(num_chains):
    z = _rng(seed, name, 99).standard_normal((num_chains, num_dims))
    return (z @ chol.T).astype(np.float32)

  stan_code = """
data {
  int<lower=1> D;
  matrix[D, D] precision;
}
parameters {
  vector[D] x;
}
model {
  target += -0.5 * quad_form(precision, x);
}
"""
  stan_data = {"D": num_dims, "precision": precision.tolist()}
  return Problem(
      name, num_dims, target_log_prob, initial_state,
      DEFAULT_STEP_SIZES[name], stan_code, stan_data, "x",
      f"{num_dims}-d zero-mean Gaussian, random rotation, standard "
      "deviations log-spaced in [0.1, 1]")
