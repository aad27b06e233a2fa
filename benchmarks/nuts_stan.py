"""Stan's NUTS (through pystan 3) for the NUTS benchmark, timed by Stan's
own clock.

Stan runs one chain per process and does its warm-up and sampling in one
call, so it is not one of `nuts_systems`' steppers: `Stan.run` returns a
whole run (`StanRun`), and `nuts_measure.measure_stan` makes its records.
"""
import collections
import re
import time

import numpy as np

from benchmarks import nuts_systems

StanRun = collections.namedtuple("StanRun", [
    "build_sec", "draws", "grads_used", "accept_stat",
    "sample_sec",   # Stan's own "Elapsed Time ... (Sampling)": the sampling
                    # iterations only (millisecond ticks, so 0 for a run
                    # shorter than 1 ms)
    "warmup_sec",   # Stan's own "Elapsed Time ... (Warm-up)"
    "wall_sec",     # the whole call: warm-up, sampling and pystan's server
                    # round trips
    "step_size",    # the adapted step size the sampling draws used
    "num_warmup", "divergences"])

STAN_MISSING = ("pystan is not installed; install it with "
                "`pip install -e '.[stan]'` (or `pip install pystan`; it "
                "needs a C++ compiler) to benchmark Stan")
_STAN_TIME = re.compile(rb"([0-9.eE+-]+) seconds \((Warm-up|Sampling)\)")


def stan_elapsed(stan_outputs):
  """Stan's own clock, `(warm-up seconds, sampling seconds)`, read from the
  "Elapsed Time: ... seconds (Warm-up)" / "... seconds (Sampling)" lines of
  a fit's output (pystan's `fit.stan_outputs`)."""
  found = {}
  for value, phase in _STAN_TIME.findall(b"".join(stan_outputs)):
    found[phase] = float(value)
  if set(found) != {b"Warm-up", b"Sampling"}:
    raise RuntimeError("Stan's output has no \"Elapsed Time\" lines for "
                       "warm-up and sampling: cannot time its sampling")
  return found[b"Warm-up"], found[b"Sampling"]


class Stan:
  """Stan's NUTS (through pystan 3) on one chain, the same target and start.

  Stan runs one chain per process.  Each `run` is Stan's usual adaptive
  NUTS (`stan::services::sample::hmc_nuts_diag_e_adapt`, the only NUTS that
  pystan 3 / httpstan offer): `num_warmup` warm-up iterations from the given
  start, adapting the step size (dual averaging to a mean acceptance of 0.8,
  starting from `settings.step_size`) and a diagonal metric (windowed
  variance estimates; the identity at the start), then `num_results`
  sampling iterations with both fixed.  Only the sampling iterations are
  timed (Stan's own "seconds (Sampling)" clock) and counted (`n_leapfrog__`
  of the sampling draws); the warm-up is not, as the other systems' burn-in
  is not.

  So Stan samples with its own adapted step size and metric, not the fixed
  `settings.step_size` and identity metric of the other systems (its step
  size is in the record): Stan cannot run NUTS with a fixed step size.
  httpstan only offers the adaptive sampler, and with no warm-up its
  adaptation ends at once and sets the step size to exp(0) = 1 (the dual
  averaging's initial mean): on the 100-d logistic regression every
  transition then diverged.  Gradients per second compare fairly (a
  gradient costs the same whatever the step size); leapfrogs per trajectory,
  acceptance and ESS are Stan's own.  Its leaves are one leapfrog step
  (`unrolled_leapfrog_steps` must be 1).  The model is built without a
  random seed, so runs are not reproducible: with one, httpstan would
  return its cached fit when the same run is asked for again, with no
  sampling to time.
  """

  def __init__(self, problem, settings, init):
    try:
      import stan  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise nuts_systems.SkipSystem(STAN_MISSING) from e
    if settings.unrolled_leapfrog_steps != 1:
      raise nuts_systems.SkipSystem("Stan's NUTS has leaves of one leapfrog step; run it "
                       "with --unrolled_leapfrog_steps=1")
    self._problem = problem
    self._settings = settings
    self._init = [{problem.stan_param: init[0].astype(float).tolist()}]
    start = time.perf_counter()
    self._posterior = stan.build(problem.stan_code, data=problem.stan_data)
    self.build_sec = time.perf_counter() - start

  def run(self, num_results, num_warmup):
    """`num_warmup` adapting warm-up iterations, then `num_results` draws."""
    if num_warmup < 1:
      raise ValueError(
          "Stan needs warm-up (num_warmup >= 1): with none its step-size "
          "adaptation ends at once and sets the step size to 1")
    start = time.perf_counter()
    fit = self._posterior.sample(
        num_chains=1, num_samples=num_results, num_warmup=num_warmup,
        save_warmup=False, init=self._init,
        stepsize=self._settings.step_size, stepsize_jitter=0.,
        max_depth=self._settings.max_tree_depth)
    wall = time.perf_counter() - start
    warmup_sec, sample_sec = stan_elapsed(fit.stan_outputs)
    # Sampling draws only (save_warmup=False): [num_results] each.
    n_leapfrog = np.asarray(fit["n_leapfrog__"]).ravel()
    step_sizes = np.asarray(fit["stepsize__"]).ravel()
    if len(n_leapfrog) != num_results or np.ptp(step_sizes) != 0:
      raise RuntimeError(
          f"unexpected Stan draws: {len(n_leapfrog)} for {num_results} "
          f"results, step sizes {np.unique(step_sizes)}")
    draws = np.asarray(fit[self._problem.stan_param]).T.reshape(
        num_results, 1, -1)
    return StanRun(
        self.build_sec, draws, int(np.sum(n_leapfrog)),
        np.asarray(fit["accept_stat__"]).ravel(), sample_sec, warmup_sec,
        wall, float(step_sizes[0]), num_warmup,
        int(np.sum(fit["divergent__"])))
