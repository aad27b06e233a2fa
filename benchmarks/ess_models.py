"""Models of the ESS benchmark (`python -m benchmarks.ess`), with ground truth.

Each model is a flat, unconstrained float32 target `target_log_prob(z)`,
z of shape [..., d], and the map `to_truth(z)` from unconstrained draws to
the quantities whose posterior mean and standard deviation are known
(`truth_mean`, `truth_sd`); ESS, R-hat and errors are measured on those.

- Inference Gym models (TFP's benchmark suite; their data ship with the
  `inference-gym` package, nothing is downloaded): the model's default
  event-space bijector makes the unconstrained target (the log density of
  the constrained value plus the bijector's log-Jacobian), and the ground
  truth is that of its `identity` sample transformation, flattened
  (`VectorModel`). The gym's real-data models that need TensorFlow
  Datasets (radon, German credit: the data are downloaded) are left out.
- The paper's two targets (`benchmarks/nuts_problems.py`): the 100-d
  correlated Gaussian, whose mean (0) and standard deviations (the roots of
  its covariance's diagonal) are exact; and the logistic regression, whose
  ground truth is a long run of `tfp.mcmc.NoUTurnSampler` stored in
  `benchmarks/results/ess_ground_truth_logistic_regression.json`
  (`python -m benchmarks.ess_ground_truth` remakes it and says how).
"""
import collections
import json
import os

import numpy as np
import tensorflow as tf

from benchmarks import nuts_problems

Model = collections.namedtuple("Model", [
    "name",
    "num_dims",          # d, the unconstrained dimension
    "target_log_prob",   # [..., d] float32 -> [...]
    "to_truth",          # [..., d] unconstrained -> [..., m] quantities
    "truth_mean",        # [m] posterior means of the quantities
    "truth_sd",          # [m] their posterior standard deviations
    "truth_mcse",        # [m] the standard errors of `truth_mean` (0 if
                         # exact)
    "step_size",         # the kernels' initial step size (adaptation
                         # moves it)
    "description",       # one line, for reports
])

# name -> (Inference Gym target class, what it is).
GYM_MODELS = {
    "eight_schools": (
        "EightSchools", "hierarchical, 10-d, funnel (non-centred scale)"),
    "brownian_motion": (
        "BrownianMotionUnknownScalesMissingMiddleObservations",
        "time series, 32-d, unknown scales, missing observations"),
    "lorenz_bridge": (
        "ConvectionLorenzBridgeUnknownScales",
        "time series (Lorenz ODE bridge), 92-d, unknown scales"),
    "stochastic_volatility": (
        "VectorizedStochasticVolatilitySP500Small",
        "time series, 103-d, S&P 500 returns, hierarchical scale"),
    "log_gaussian_cox": (
        "SyntheticLogGaussianCoxProcess",
        "latent Gaussian process, 102-d, Poisson counts"),
    "item_response": (
        "SyntheticItemResponseTheory",
        "hierarchical item-response model, 501-d"),
}
PAPER_MODELS = ("correlated_gaussian", "logistic_regression")
MODELS = tuple(GYM_MODELS) + PAPER_MODELS

GROUND_TRUTH_DIR = os.path.join(os.path.dirname(__file__), "results")


def ground_truth_path(name):
  return os.path.join(GROUND_TRUTH_DIR, f"ess_ground_truth_{name}.json")


def make_model(name):
  """The model `name` (see `MODELS`)."""
  if name in GYM_MODELS:
    return _gym_model(name)
  if name == "correlated_gaussian":
    return _correlated_gaussian()
  if name == "logistic_regression":
    return _logistic_regression()
  raise ValueError(f"unknown model {name!r}; models: {', '.join(MODELS)}")


def as_problem(model, step_size=None):
  """`model` as a `nuts_problems.Problem` (what `benchmarks.nuts_vm_steps`
  and `benchmarks.nuts_profile` take apart): its target, the ESS
  benchmark's starts for seed 0, and `step_size` (default the model's
  initial one); no Stan program."""
  return nuts_problems.Problem(
      model.name, model.num_dims, model.target_log_prob,
      lambda num_chains: initial_state(model, num_chains, 0),
      model.step_size if step_size is None else step_size, None, None, None,
      model.description)


def initial_state(model, num_chains, seed):
  """Stan's starts: uniform(-2, 2) in the unconstrained space, float32,
  the same for every system given (model, chains, seed)."""
  rng = np.random.default_rng([seed, MODELS.index(model.name), num_chains])
  return rng.uniform(-2., 2., (num_chains, model.num_dims)).astype(np.float32)


def _gym_model(name):
  class_name, what = GYM_MODELS[name]
  return gym_model(class_name, name, what)


def gym_model(class_name, name, what):
  """Inference Gym's target `class_name`, built with its defaults, as a
  `Model` named `name`: a flat unconstrained target (the model's default
  event-space bijector, with its log-Jacobian) and the ground truth of its
  identity transformation (NaN where the model has none). `what`: the
  description's end."""
  # inference_gym imports TensorFlow Probability's substrate lazily; it
  # is an optional benchmark dependency (setup.py's `bench` extra).
  from inference_gym import using_tensorflow as gym   # pylint: disable=g-import-not-at-top
  model = gym.targets.VectorModel(getattr(gym.targets, class_name)(),
                                  flatten_sample_transformations=True)
  bijector = model.default_event_space_bijector
  num_dims = int(bijector.inverse_event_shape(model.event_shape)[0])
  identity = model.sample_transformations["identity"]

  # A model in float64 (the synthetic Cox process) computes in float64
  # for float32 chains, the same for every kernel.
  dtype = tf.nest.flatten(model.dtype)[0]

  def target_log_prob(z):
    x = bijector.forward(tf.cast(z, dtype))
    log_prob = (model.unnormalized_log_prob(x)
                + bijector.forward_log_det_jacobian(tf.cast(z, dtype),
                                                    event_ndims=1))
    return tf.cast(log_prob, z.dtype)

  def to_truth(z):
    return identity(bijector.forward(tf.cast(z, dtype)))

  return Model(name, num_dims, target_log_prob, to_truth,
               np.asarray(identity.ground_truth_mean, np.float64),
               np.asarray(identity.ground_truth_standard_deviation,
                          np.float64),
               np.asarray(identity.ground_truth_mean_standard_error,
                          np.float64),
               0.1, f"Inference Gym {class_name}" + (f": {what}" if what
                                                     else ""))


def _correlated_gaussian():
  problem = nuts_problems.make_problem("correlated_gaussian")
  # The problem's covariance, rebuilt as `nuts_problems` builds it.
  rng = np.random.default_rng([0, nuts_problems.PROBLEMS.index(
      "correlated_gaussian"), 0])
  rotation, _ = np.linalg.qr(rng.standard_normal((100, 100)))
  scales = np.geomspace(0.1, 1.0, 100)
  cov = (rotation * scales**2) @ rotation.T
  return Model("correlated_gaussian", 100, problem.target_log_prob,
               tf.identity, np.zeros(100), np.sqrt(np.diag(cov)),
               np.zeros(100),
               problem.step_size, problem.description + " (exact truth)")


def _logistic_regression():
  problem = nuts_problems.make_problem("logistic_regression")
  path = ground_truth_path("logistic_regression")
  if os.path.exists(path):
    with open(path) as f:
      truth = json.load(f)
    mean, sd = np.array(truth["mean"]), np.array(truth["sd"])
    mcse = np.array(truth["mcse_mean"])
  else:   # while the long run that makes it runs
    mean = sd = mcse = None
  return Model("logistic_regression", 100, problem.target_log_prob,
               tf.identity, mean, sd, mcse, problem.step_size,
               problem.description + " (truth: a long run)")
