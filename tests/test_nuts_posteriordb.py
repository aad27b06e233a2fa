"""NUTS with Stan's warm-up against posteriordb reference posteriors,
from rough starts.

Four posteriors from /work/shared/posteriordb (see its README): each JSON file
holds the data, the model in words and the reference mean and sd of every
parameter (10 Stan chains x 1000 draws). Each model below is a
`tfd.JointDistributionNamed` written from that description, its data
pinned. One helper, `sample`, runs every posterior the same way, as a new
user would: `nuts.windowed_adaptive_nuts` with its defaults for the start
(uniform(-2, 2) on the unconstrained scale), step size and metric (Stan's
windowed adaptation of a diagonal mass matrix). No metric, step size or
rescaling is given by hand.

Checks (one parametrised test): posterior means within 5 standard errors
of the reference means (our Monte Carlo error, reference sd / sqrt(ESS) with
the ESS from `tfp.mcmc.effective_sample_size` over the chains, and the
reference's own), posterior sds within 20% of the reference sds, split
R-hat (`tfp.mcmc.potential_scale_reduction`) below 1.01, and no
divergent transitions after warm-up. A funnel (eight schools, non-centred)
must have under 1% divergent transitions and R-hat below 1.01.

They take minutes each (XLA compilation, then thousands of NUTS
trajectories on a CPU): marked nightly (`make test-nightly`).
"""
import collections
import json
import os
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import nuts
import tfp_autobatch as tab

tfb = tfp.bijectors
tfd = tfp.distributions

POSTERIORDB_DIR = os.environ.get("TFP_AUTOBATCH_POSTERIORDB",
                                 "/work/shared/posteriordb")
F64 = np.float64
REFERENCE_ESS = 10000   # posteriordb's 10 x 1000 reference draws


def _compiled_backend():
  for b in ("pc:xla", "pc:graph"):
    if b in tab.BACKENDS:
      return b
  return None


# -- models, written from the descriptions -----------------------------------
#
# Each builder takes the JSON `data` and returns `(model, pins)`: a joint
# distribution over the parameters and the observations, and the observed
# values to pin.

class _OrderedNormals(tfd.Sample):
  """iid Normals restricted to increasing order (mu[1] < mu[2]): on that
  region the density is the iid one up to a constant, and the event-space
  bijector is `Ascending`, as Stan's `ordered` type."""

  def _default_event_space_bijector(self):
    return tfb.Ascending(validate_args=self.validate_args)


def _kidiq_momiq(data):
  """kid_score ~ Normal(beta[1] + beta[2] * mom_iq, sigma); flat priors on
  beta (a Normal of sd 1e4 here: a joint distribution needs a proper
  prior, and against posterior sds of 6 and 0.06 it moves nothing);
  sigma ~ HalfCauchy(0, 2.5)."""
  iq = tf.constant(data["mom_iq"], tf.float64)
  model = tfd.JointDistributionNamed(dict(
      beta=tfd.Sample(tfd.Normal(F64(0.), F64(1e4)), 2),
      sigma=tfd.HalfCauchy(F64(0.), F64(2.5)),
      kid_score=lambda beta, sigma: tfd.Independent(tfd.Normal(
          beta[..., :1] + beta[..., 1:] * iq, sigma[..., None]), 1)))
  return model, {"kid_score": tf.constant(data["kid_score"], tf.float64)}


def _ark(data):
  """AR(K): y[t] ~ Normal(alpha + sum_k beta[k] * y[t-k], sigma) for t > K;
  alpha, beta ~ Normal(0, 10); sigma ~ HalfCauchy(0, 2.5)."""
  k, y = data["K"], np.asarray(data["y"], F64)
  # lags[t - K, k - 1] = y[t - k] (0-based t = K .. T-1).
  lags = tf.constant(np.stack([y[k - j:len(y) - j] for j in range(1, k + 1)],
                              -1))
  model = tfd.JointDistributionNamed(dict(
      alpha=tfd.Normal(F64(0.), F64(10.)),
      beta=tfd.Sample(tfd.Normal(F64(0.), F64(10.)), k),
      sigma=tfd.HalfCauchy(F64(0.), F64(2.5)),
      y=lambda alpha, beta, sigma: tfd.Independent(tfd.Normal(
          alpha[..., None] + tf.linalg.matvec(lags, beta),
          sigma[..., None]), 1)))
  return model, {"y": tf.constant(y[k:])}


def _low_dim_gauss_mix(data):
  """y[n] ~ theta * Normal(mu[1], sigma[1]) + (1 - theta) * Normal(mu[2],
  sigma[2]); mu ordered, mu ~ Normal(0, 2); sigma ~ HalfNormal(2);
  theta ~ Beta(5, 5)."""
  y = tf.constant(data["y"], tf.float64)

  def likelihood(mu, sigma, theta):
    weights = tfd.Categorical(probs=tf.stack([theta, 1. - theta], -1))
    return tfd.Sample(tfd.MixtureSameFamily(weights, tfd.Normal(mu, sigma)),
                      y.shape[0])
  model = tfd.JointDistributionNamed(dict(
      mu=_OrderedNormals(tfd.Normal(F64(0.), F64(2.)), 2),
      sigma=tfd.Sample(tfd.HalfNormal(F64(2.)), 2),
      theta=tfd.Beta(F64(5.), F64(5.)),
      y=likelihood))
  return model, {"y": y}


def _sblrc_blr(data):
  """y ~ Normal(X @ beta, sigma); beta ~ Normal(0, 10) (D = 5);
  sigma ~ HalfNormal(10)."""
  x = tf.constant(data["X"], tf.float64)
  model = tfd.JointDistributionNamed(dict(
      beta=tfd.Sample(tfd.Normal(F64(0.), F64(10.)), 5),
      sigma=tfd.HalfNormal(F64(10.)),
      y=lambda beta, sigma: tfd.Independent(tfd.Normal(
          tf.linalg.matvec(x, beta), sigma[..., None]), 1)))
  return model, {"y": tf.constant(data["y"], tf.float64)}


# -- the table ----------------------------------------------------------------

# parts: (name, event size) of each parameter; a part of size k > 1 holds
# the reference's "name[1]" .. "name[k]".
Posterior = collections.namedtuple("Posterior", ["name", "build", "parts"])

POSTERIORS = [
    Posterior("kidiq-kidscore_momiq", _kidiq_momiq,
              [("beta", 2), ("sigma", 0)]),
    Posterior("arK-arK", _ark, [("alpha", 0), ("beta", 5), ("sigma", 0)]),
    Posterior("low_dim_gauss_mix-low_dim_gauss_mix", _low_dim_gauss_mix,
              [("mu", 2), ("sigma", 2), ("theta", 0)]),
    Posterior("sblrc-blr", _sblrc_blr, [("beta", 5), ("sigma", 0)]),
]

# The same run for every posterior: Stan's default warm-up length.
NUM_CHAINS = 16
NUM_ADAPTATION_STEPS = 1000
NUM_RESULTS = 1000


def _load(name):
  path = os.path.join(POSTERIORDB_DIR, name + ".json")
  if not os.path.exists(path):
    pytest.skip(f"{path} not found: set TFP_AUTOBATCH_POSTERIORDB to the "
                "folder holding the posteriordb JSON files")
  with open(path) as f:
    return json.load(f)


Summary = collections.namedtuple("Summary", [
    "mean", "sd", "ess", "rhat", "divergences", "leapfrogs", "step_size",
    "seconds"])


def summarise(draws, trace, seconds, names_and_sizes):
  """{parameter: Summary} of `[draws, chains, ...]` draws."""
  out = {}
  for name, size in names_and_sizes:
    x = np.asarray(draws[name])
    names = [f"{name}[{i + 1}]" for i in range(size)] if size else [name]
    x = x.reshape(x.shape[:2] + (len(names),))   # [draws, chains, scalars]
    ess = tfp.mcmc.effective_sample_size(x, cross_chain_dims=1).numpy()
    rhat = tfp.mcmc.potential_scale_reduction(x, split_chains=True).numpy()
    flat = x.reshape(-1, len(names))
    for i, n in enumerate(names):
      out[n] = Summary(flat[:, i].mean(), flat[:, i].std(), ess[i], rhat[i],
                       int(np.sum(trace["diverging"])),
                       float(np.mean(trace["n_steps"])),
                       float(np.asarray(trace["step_size"])[-1]), seconds)
  return out


def sample(posterior, spec, seed=0, backend=None):
  """Runs the posterior's chains from rough starts; returns
  {parameter: Summary-per-scalar}."""
  backend = backend or _compiled_backend()
  model, pins = posterior.build(spec["data"])
  start = time.time()
  draws, trace = nuts.windowed_adaptive_nuts(
      NUM_RESULTS, model, n_chains=NUM_CHAINS,
      num_adaptation_steps=NUM_ADAPTATION_STEPS, seed=(seed, 1234),
      backend=backend, **pins)
  return summarise(draws, trace, time.time() - start, posterior.parts)


@pytest.mark.nightly   # minutes each: `make test-nightly`
@pytest.mark.slow
@pytest.mark.skipif(_compiled_backend() is None, reason="no pc backend")
@pytest.mark.parametrize("posterior", POSTERIORS, ids=[p.name for p in
                                                       POSTERIORS])
def test_posteriordb(posterior):
  # Fixed seeds, 16 chains x 1000 draws. Means: within 5 standard errors of
  # the difference from the reference mean, sd * sqrt(1 / ESS + 1 / 10000):
  # ours from tfp.mcmc.effective_sample_size over chains, the reference's
  # from its 10 x 1000 (thinned, near-independent) Stan draws. ~6e-7 false
  # failures per parameter if the ESS estimates are right; 21 parameters:
  # ~1e-5.
  # Sds: within 20% of the reference sds. The Monte Carlo error of an sd at
  # these ESS is 2-4% (1 / sqrt(2 ESS) for a Gaussian, more for skewed or
  # heavy-tailed marginals), so 20% never fails by chance, yet a missing
  # Jacobian, a wrong likelihood scale or a sampler that under-disperses
  # (e.g. a wrong acceptance or U-turn rule) moves sds by more.
  # Split R-hat (32 half-chains of 500 draws) - 1 is about (tau - 1) / (2 n)
  # + tau / (2 m n) at stationarity (tau = draws / ESS per chain): ~0.002
  # at an ESS of half the draws. Crossing 1.01 needs the between-chain
  # variance estimate (chi-square, 31 dof) several times too large: < 1e-6.
  # A chain left stuck by the warm-up fails it.
  spec = _load(posterior.name)
  summary = sample(posterior, spec, seed=7)
  reference = spec["reference"]
  assert set(summary) == set(reference)
  report = "\n".join(
      f"{n}: mean {s.mean:.6g} (ref {reference[n]['mean']:.6g}, mcse "
      f"{reference[n]['sd'] / np.sqrt(s.ess):.3g}), sd {s.sd:.4g} (ref "
      f"{reference[n]['sd']:.4g}), ess {s.ess:.0f}, rhat {s.rhat:.4f}"
      for n, s in summary.items())
  print(report)   # shown with `pytest -s`
  first = next(iter(summary.values()))
  assert first.divergences == 0, report
  for n, s in summary.items():
    ref = reference[n]
    se = ref["sd"] * np.sqrt(1. / s.ess + 1. / REFERENCE_ESS)
    assert abs(s.mean - ref["mean"]) < 5 * se, f"{n} mean\n{report}"
    assert abs(s.sd / ref["sd"] - 1.) < 0.2, f"{n} sd\n{report}"
    assert s.rhat < 1.01, f"{n} rhat\n{report}"


def _eight_schools_non_centred():
  """Eight schools (Rubin 1981), non-centred: the school effects are
  avg_effect + avg_stddev * z with z ~ Normal(0, 1), which turns the
  centred model's funnel between avg_stddev and the effects into an
  isotropic prior."""
  effects = tf.constant([28., 8, -3, 7, -1, 1, 18, 12], tf.float64)
  stddevs = tf.constant([15., 10, 16, 11, 9, 11, 10, 18], tf.float64)
  model = tfd.JointDistributionNamed(dict(
      avg_effect=tfd.Normal(F64(0.), F64(5.)),
      avg_stddev=tfd.HalfCauchy(F64(0.), F64(5.)),
      z=tfd.Sample(tfd.Normal(F64(0.), F64(1.)), 8),
      y=lambda avg_effect, avg_stddev, z: tfd.Independent(tfd.Normal(
          avg_effect[..., None] + avg_stddev[..., None] * z, stddevs), 1)))
  return model, {"y": effects}


@pytest.mark.nightly
@pytest.mark.slow
@pytest.mark.skipif(_compiled_backend() is None, reason="no pc backend")
def test_funnel_non_centred_eight_schools():
  # Under 1% divergent transitions after warm-up (the centred funnel gives
  # several percent at Stan's default adaptation) and R-hat < 1.01 for
  # every parameter, avg_stddev's heavy tail included.
  model, pins = _eight_schools_non_centred()
  start = time.time()
  draws, trace = nuts.windowed_adaptive_nuts(
      NUM_RESULTS, model, n_chains=NUM_CHAINS,
      num_adaptation_steps=NUM_ADAPTATION_STEPS, seed=(11, 12),
      backend=_compiled_backend(), **pins)
  summary = summarise(draws, trace, time.time() - start,
                      [("avg_effect", 0), ("avg_stddev", 0), ("z", 8)])
  report = "\n".join(f"{n}: mean {s.mean:.4g} sd {s.sd:.4g} ess {s.ess:.0f} "
                     f"rhat {s.rhat:.4f}" for n, s in summary.items())
  print(report)
  divergent = float(np.mean(trace["diverging"]))
  assert divergent < 0.01, f"{divergent:.2%} divergent\n{report}"
  for n, s in summary.items():
    assert s.rhat < 1.01, f"{n} rhat\n{report}"
