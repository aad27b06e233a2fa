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

Checks (one parametrised test), with ArviZ's diagnostics: rank-normalised
split R-hat below 1.01; posterior means within 5 Monte Carlo standard errors
of the reference means (ArviZ's MCSE of the mean, combined with the
reference's own, sd / sqrt(10000)); posterior sds within 20% of the
reference sds; no divergent transitions after warm-up. A funnel (eight
schools, non-centred) is held to the same bar against its exact posterior
moments (one-dimensional quadrature), with under 1% divergent transitions.

They take minutes each (XLA compilation, then thousands of NUTS
trajectories on a CPU): marked nightly (`make test-nightly`).
"""
import collections
import json
import os
import time

import arviz as az
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
    "mean", "sd", "mcse", "ess", "rhat"])
Run = collections.namedtuple("Run", [
    "summary", "divergent", "leapfrogs", "step_size", "seconds"])


def summarise(draws, names_and_sizes):
  """{scalar name: Summary} of `[draws, chains, ...]` draws, by ArviZ:
  rank-normalised split R-hat, bulk ESS, MCSE of the mean."""
  posterior = {}
  for name, size in names_and_sizes:
    x = np.asarray(draws[name])
    names = [f"{name}[{i + 1}]" for i in range(size)] if size else [name]
    x = x.reshape(x.shape[:2] + (len(names),))   # [draws, chains, scalars]
    for i, n in enumerate(names):
      posterior[n] = np.swapaxes(x[..., i], 0, 1)   # ArviZ: [chains, draws]
  data = az.convert_to_dataset(posterior)
  rhat = az.rhat(data, method="rank")
  ess = az.ess(data, method="bulk")
  mcse = az.mcse(data, method="mean")
  return {n: Summary(float(x.mean()), float(x.std()), float(mcse[n]),
                     float(ess[n]), float(rhat[n]))
          for n, x in posterior.items()}


def run(model, pins, names_and_sizes, seed):
  """Runs a model's chains from rough starts, as a new user would: only
  the number of draws, chains and warm-up steps are given."""
  start = time.time()
  draws, trace = nuts.windowed_adaptive_nuts(
      NUM_RESULTS, model, n_chains=NUM_CHAINS,
      num_adaptation_steps=NUM_ADAPTATION_STEPS, seed=seed,
      backend=_compiled_backend(), **pins)
  seconds = time.time() - start
  return Run(summarise(draws, names_and_sizes),
             float(np.mean(trace["diverging"])),
             float(np.mean(trace["n_steps"])),
             float(np.asarray(trace["step_size"])[-1]), seconds)


def check_against_reference(result, reference, reference_ess=None):
  """Asserts the bar; returns the report (shown with `pytest -s`).

  Means: within 5 standard errors of the difference from the reference
  mean, sqrt(MCSE^2 + sd^2 / reference_ess): ours from ArviZ, the
  reference's from its (thinned, near-independent) draws; an exact
  reference has none. ~6e-7 false failures per parameter if the MCSEs are
  right. Sds: within 20% of the reference's. The Monte Carlo error of an sd
  at these ESS is 2-4% (1 / sqrt(2 ESS) for a Gaussian, more for skewed or
  heavy-tailed marginals), so 20% does not fail by chance, yet a missing
  Jacobian, a wrong likelihood scale or a sampler that under-disperses
  moves sds by more. Rank-normalised split R-hat (32 half-chains of 500
  draws) is near 1.002 at stationarity; a chain left stuck by the warm-up
  crosses 1.01.
  """
  summary = result.summary
  assert set(summary) == set(reference)
  rows = []
  worst = dict(rhat=0., z=0., sd=0.)
  for n, s in summary.items():
    ref = reference[n]
    se = np.sqrt(s.mcse ** 2 + (ref["sd"] ** 2 / reference_ess
                                if reference_ess else 0.))
    z = abs(s.mean - ref["mean"]) / se
    sd_error = abs(s.sd / ref["sd"] - 1.)
    worst = dict(rhat=max(worst["rhat"], s.rhat), z=max(worst["z"], z),
                 sd=max(worst["sd"], sd_error))
    rows.append(f"{n}: mean {s.mean:.6g} (ref {ref['mean']:.6g}, "
                f"{z:.2f} se), sd {s.sd:.4g} (ref {ref['sd']:.4g}), "
                f"ess {s.ess:.0f}, rhat {s.rhat:.4f}")
  rows.append(f"max rhat {worst['rhat']:.4f}, worst |mean - ref| / se "
              f"{worst['z']:.2f}, worst |sd / ref - 1| {worst['sd']:.3f}, "
              f"divergent {result.divergent:.3%}, leapfrogs/draw "
              f"{result.leapfrogs:.1f}, step size {result.step_size:.3g}, "
              f"{result.seconds:.0f} s")
  report = "\n".join(rows)
  print(report)
  for n, s in summary.items():
    ref = reference[n]
    se = np.sqrt(s.mcse ** 2 + (ref["sd"] ** 2 / reference_ess
                                if reference_ess else 0.))
    assert abs(s.mean - ref["mean"]) < 5 * se, f"{n} mean\n{report}"
    assert abs(s.sd / ref["sd"] - 1.) < 0.2, f"{n} sd\n{report}"
    assert s.rhat < 1.01, f"{n} rhat\n{report}"
  return report


@pytest.mark.nightly   # minutes each: `make test-nightly`
@pytest.mark.slow
@pytest.mark.skipif(_compiled_backend() is None, reason="no pc backend")
@pytest.mark.parametrize("posterior", POSTERIORS, ids=[p.name for p in
                                                       POSTERIORS])
def test_posteriordb(posterior):
  # Fixed seeds, 16 chains x 1000 draws after 1000 warm-up steps.
  spec = _load(posterior.name)
  model, pins = posterior.build(spec["data"])
  result = run(model, pins, posterior.parts, seed=(7, 1234))
  report = check_against_reference(result, spec["reference"],
                                   REFERENCE_ESS)
  assert result.divergent == 0., report


EIGHT_SCHOOLS_EFFECTS = np.array([28., 8, -3, 7, -1, 1, 18, 12])
EIGHT_SCHOOLS_STDDEVS = np.array([15., 10, 16, 11, 9, 11, 10, 18])


def _eight_schools_non_centred():
  """Eight schools (Rubin 1981), non-centred, as posteriordb's
  eight_schools_noncentered: the school effects are avg_effect +
  avg_stddev * z with z ~ Normal(0, 1), which turns the centred model's
  funnel between avg_stddev and the effects into an isotropic prior;
  avg_effect ~ Normal(0, 5), avg_stddev ~ HalfCauchy(0, 5)."""
  model = tfd.JointDistributionNamed(dict(
      avg_effect=tfd.Normal(F64(0.), F64(5.)),
      avg_stddev=tfd.HalfCauchy(F64(0.), F64(5.)),
      z=tfd.Sample(tfd.Normal(F64(0.), F64(1.)), 8),
      y=lambda avg_effect, avg_stddev, z: tfd.Independent(tfd.Normal(
          avg_effect[..., None] + avg_stddev[..., None] * z,
          EIGHT_SCHOOLS_STDDEVS), 1)))
  return model, {"y": tf.constant(EIGHT_SCHOOLS_EFFECTS)}


def eight_schools_moments(num_points=200000):
  """The exact posterior means and sds of the non-centred eight schools,
  {name: {"mean", "sd"}}, by quadrature over avg_stddev (tau) alone.

  Given tau, everything else is Gaussian: with the school effects theta
  integrated out, y_j ~ Normal(mu, s_j^2 + tau^2), so mu | tau, y is Normal
  (mean m, variance v) and p(tau | y) is the HalfCauchy prior times that
  marginal likelihood, in closed form; theta_j | mu, tau, y is Normal too,
  so z_j = (theta_j - mu) / tau has conditional mean
  (y_j - mu) tau / (s_j^2 + tau^2) and variance s_j^2 / (s_j^2 + tau^2).
  The midpoint rule runs over tau = 5 tan(u), u in (0, pi / 2).
  """
  y, s = EIGHT_SCHOOLS_EFFECTS, EIGHT_SCHOOLS_STDDEVS
  u = (np.arange(num_points) + 0.5) / num_points * (np.pi / 2)
  tau = 5. * np.tan(u)
  dtau = 5. / np.cos(u) ** 2
  var = s ** 2 + tau[:, None] ** 2
  precision = 1. / 25. + np.sum(1. / var, 1)
  m = np.sum(y / var, 1) / precision
  v = 1. / precision
  log_p = (-np.log1p((tau / 5.) ** 2) - 0.5 * np.sum(np.log(var), 1)
           - 0.5 * np.sum(y ** 2 / var, 1) + 0.5 * m ** 2 * precision
           + 0.5 * np.log(v))
  w = np.exp(log_p - log_p.max()) * dtau
  w /= w.sum()
  moments = {"avg_effect": (w @ m, w @ (m ** 2 + v)),
             "avg_stddev": (w @ tau, w @ tau ** 2)}
  t, residual = tau[:, None], y - m[:, None]
  z1 = w @ (residual * t / var)
  z2 = w @ ((residual ** 2 + v[:, None]) * t ** 2 / var ** 2 + s ** 2 / var)
  for j in range(len(y)):
    moments[f"z[{j + 1}]"] = (z1[j], z2[j])
  return {n: {"mean": a, "sd": np.sqrt(b - a * a)}
          for n, (a, b) in moments.items()}


def test_eight_schools_moments_match_importance_sampling():
  # The quadrature against a method that shares none of its algebra:
  # prior draws of (avg_effect, avg_stddev, z) weighted by the likelihood
  # (effective sample size ~2e5). Means within 5 standard errors, sds
  # within 2%.
  y, s = EIGHT_SCHOOLS_EFFECTS, EIGHT_SCHOOLS_STDDEVS
  rng = np.random.default_rng(0)
  n = 1000000
  draws = {"avg_effect": 5. * rng.standard_normal(n),
           "avg_stddev": np.abs(5. * rng.standard_cauchy(n))}
  z = rng.standard_normal((n, len(y)))
  draws.update({f"z[{j + 1}]": z[:, j] for j in range(len(y))})
  log_w = -0.5 * np.sum(((y - draws["avg_effect"][:, None]
                          - draws["avg_stddev"][:, None] * z) / s) ** 2, 1)
  w = np.exp(log_w - log_w.max())
  w /= w.sum()
  ess = 1. / np.sum(w ** 2)
  assert ess > 1e5
  moments = eight_schools_moments()
  for name, x in draws.items():
    mean = w @ x
    sd = np.sqrt(w @ (x - mean) ** 2)
    assert abs(mean - moments[name]["mean"]) < 5 * sd / np.sqrt(ess), name
    assert abs(sd / moments[name]["sd"] - 1.) < 0.02, name


@pytest.mark.nightly
@pytest.mark.slow
@pytest.mark.skipif(_compiled_backend() is None, reason="no pc backend")
def test_funnel_non_centred_eight_schools():
  # The posteriordb bar against the exact moments, and under 1% divergent
  # transitions after warm-up (the centred funnel gives several percent at
  # Stan's default adaptation).
  model, pins = _eight_schools_non_centred()
  result = run(model, pins, [("avg_effect", 0), ("avg_stddev", 0), ("z", 8)],
               seed=(11, 12))
  report = check_against_reference(result, eight_schools_moments())
  assert result.divergent < 0.01, f"{result.divergent:.2%} divergent\n{report}"
