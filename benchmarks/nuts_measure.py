"""Measuring one system of the NUTS benchmark on one batch of chains.

`Measurement` builds, warms up and times one of `nuts_systems`' steppers
in windows of steps, then makes its JSON record; `measure_stan` makes
Stan's records, timed by Stan's own clock.  `benchmarks/nuts.py` documents
the records' keys.
"""
import math
import time

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from benchmarks import nuts_stan
from benchmarks import nuts_systems
from benchmarks import progress as progress_lib


def min_ess(draws):
  """Minimum over dimensions of the effective sample size of `draws`
  [results, chains, d] (cross-chain when chains > 1), or None."""
  n, chains, _ = draws.shape
  if n < 2:
    return None
  x = tf.constant(draws, tf.float64)
  if chains > 1:
    ess = tfp.mcmc.effective_sample_size(x, cross_chain_dims=1)
  else:
    ess = tfp.mcmc.effective_sample_size(x)[0]
  value = float(tf.reduce_min(ess))
  return value if math.isfinite(value) and value > 0 else None


def _inner_bar(total, enabled, desc):
  return progress_lib.progress_bar(total, enabled, desc, "step", leave=False)


class Measurement:
  """One system on one batch of chains: built, compiled and warmed up when
  made, then timed in windows of consecutive steps (`time_window`), which
  `nuts_run.run_benchmarks` interleaves with other systems' windows."""

  def __init__(self, system, problem, settings, init, num_burnin,
               progress=False):
    self.system, self.problem, self.settings = system, problem, settings
    self.batch = len(init)
    self.progress = progress
    # The first call's steps are the first burn-in steps.
    warm = max(num_burnin, settings.steps_per_call)
    bar = _inner_bar(warm, progress, f"{system} x{self.batch} warm-up")
    start = time.perf_counter()
    self.stepper = nuts_systems.make_stepper(system, problem, settings, init)
    self.next_step = 0
    self._run(self.stepper.steps_per_call, bar)
    self.first_call_sec = time.perf_counter() - start
    start = time.perf_counter()
    self._run(warm - self.next_step, bar)
    self.burnin_sec = time.perf_counter() - start
    if bar is not None:
      bar.close()
    self.windows = []

  def _run(self, n, bar):
    """The outcomes of the next `n` steps, in calls of `steps_per_call`."""
    per_call = self.stepper.steps_per_call
    outcomes = []
    for i in range(self.next_step, self.next_step + n, per_call):
      outcomes += self.stepper.run_steps(i, per_call)
      if bar is not None:
        bar.update(per_call)
    self.next_step += n
    return outcomes

  def time_window(self, num_results):
    """Times the next `num_results` steps as one window."""
    bar = _inner_bar(num_results, self.progress,
                     f"{self.system} x{self.batch} round "
                     f"{len(self.windows) + 1}")
    start = time.perf_counter()
    outcomes = self._run(num_results, bar)
    timed_sec = time.perf_counter() - start
    if bar is not None:
      bar.close()
    self.windows.append((timed_sec, outcomes))

  def record(self):
    """The JSON record of the timed windows (see `_record`)."""
    system, settings = self.system, self.settings
    outcomes = [out for _, window in self.windows for out in window]
    rates = [sum(out.grads_used for out in window) / sec
             for sec, window in self.windows]
    chains, batch = self.stepper.chains_run, self.batch
    # (the limits' states are leapfrog end points, not MCMC draws.)
    ess = (min_ess(np.stack([out.state for out in outcomes]))
           if outcomes and system not in nuts_systems.LIMITS else None)
    accept = [out.accept_stat for out in outcomes
              if out.accept_stat is not None]
    k = (settings.num_trajectories_per_step
         if system in nuts_systems.FUSING else 1)
    num_results = len(self.windows[0][1])
    record = _record(
        system, self.problem, settings, batch, k,
        first_call_sec=self.first_call_sec, burnin_sec=self.burnin_sec,
        window_secs=[sec for sec, _ in self.windows],
        num_results=num_results,
        grads_used=sum(out.grads_used for out in outcomes),
        grads_computed=sum(out.grads_computed for out in outcomes),
        chains_run=chains,
        computed_is_estimate=bool(self.stepper.computed_is_estimate),
        accept=np.mean(accept) if accept else None, ess=ess,
        trajectories=chains * len(outcomes) * k, rates=rates)
    record["steps_per_call"] = per_call = self.stepper.steps_per_call
    notes = []
    if system in nuts_systems.LIMITS:
      record["leapfrogs_per_step"] = settings.limit_leapfrogs
      notes.append("raw batched leapfrog loop"
                   + (" with the log density" if system == "limit_logp"
                      else "")
                   + f"; a step is {settings.limit_leapfrogs} leapfrog steps")
    elif system == "unbatched" and chains < batch:
      notes.append(f"one chain at a time; timed {chains} chains, rate per "
                   "chain extrapolated to the batch")
    if (per_call < settings.steps_per_call
        and system not in nuts_systems.LIMITS):
      notes.append("runs eagerly: one step per call")
    if record["computed_is_estimate"]:
      notes.append(nuts_systems.COMPUTED_ESTIMATE_NOTE)
    if notes:
      record["note"] = "; ".join(notes)
    if system in nuts_systems.TRACEABLE:
      record["traced_kernel"] = settings.trace_kernel
    return record


def _record(system, problem, settings, batch, k, first_call_sec, burnin_sec,
            window_secs, num_results, grads_used, grads_computed, chains_run,
            computed_is_estimate, accept, ess, trajectories, rates=None):
  """One JSON record; rates of `chains_run` < `batch` chains stand for the
  batch (they ran one after the other).

  `window_secs` are the seconds of the timed windows (rounds) of
  `num_results` steps each, and `rates` their gradients per second. The
  record's `grads_per_sec` and `sec_per_step` are the median window's, so
  a window slowed by the machine (other processes, frequency changes)
  moves them less; `round_grads_per_sec` keeps every window's rate.
  """
  scale = batch / chains_run
  timed_sec = sum(window_secs)
  if rates is None:
    rates = [grads_used / timed_sec]
  return {
      "system": system, "problem": problem.name, "batch_size": batch,
      "num_trajectories_per_step": k,
      "grads_per_sec": float(np.median(rates)),
      "utilization": grads_used / max(grads_computed, 1),
      "sec_per_step": float(np.median(window_secs)) / num_results * scale,
      "first_call_sec": first_call_sec,
      # The untimed steps after the first call: XLA-compiled kernels run
      # slower for their first few steps (see `benchmarks/nuts.py`).
      "burnin_sec": burnin_sec,
      "accept_rate": None if accept is None else float(accept),
      "ess_per_sec": None if ess is None else ess / timed_sec,
      "ess_min": ess,
      "grads_used": grads_used, "grads_computed": grads_computed,
      "computed_is_estimate": computed_is_estimate,
      "mean_leapfrogs_per_trajectory": grads_used / max(trajectories, 1),
      "num_results": num_results, "timed_sec": timed_sec,
      "rounds": len(window_secs),
      "round_grads_per_sec": [float(r) for r in rates],
      "step_size": settings.step_size, "num_dims": problem.num_dims,
      "chains_run": chains_run, "extrapolated": chains_run < batch,
  }


# Resolution of Stan's own clock (it counts whole milliseconds).
STAN_CLOCK_TICK_SEC = 1e-3


def measure_stan(problem, settings, init, batch_sizes, num_results,
                 num_warmup):
  """Stan's single-chain rates, one record per batch size: `num_warmup`
  untimed adapting warm-up iterations, then `num_results` timed draws."""
  stan = nuts_stan.Stan(problem, settings, init[:1])
  run = stan.run(num_results, num_warmup)
  accept = float(np.mean(run.accept_stat))
  ess = min_ess(run.draws)
  # Stan's clock reads 0 for a sampling phase under 1 ms: time it as one
  # tick (an upper bound, so its rates are lower bounds).
  timed_sec = max(run.sample_sec, STAN_CLOCK_TICK_SEC)
  records = []
  for batch in batch_sizes:
    record = _record(
        "stan", problem, settings, batch, 1, first_call_sec=run.build_sec,
        burnin_sec=None, window_secs=[timed_sec], num_results=num_results,
        grads_used=run.grads_used, grads_computed=run.grads_used,
        chains_run=1, computed_is_estimate=False, accept=accept, ess=ess,
        trajectories=num_results)
    record.update(
        step_size=run.step_size, initial_step_size=settings.step_size,
        num_warmup=run.num_warmup, warmup_sec=run.warmup_sec,
        wall_sec=run.wall_sec, divergences=run.divergences)
    record["note"] = (
        "Stan runs one chain per process: single-chain rate, timed by "
        + ("Stan's own sampling clock, which read 0 (under its 1 ms "
           "resolution): timed as 1 ms, rates are lower bounds"
           if run.sample_sec < STAN_CLOCK_TICK_SEC else
           "Stan's own sampling clock (warmup_sec: its warm-up; wall_sec: "
           "the whole pystan call)")
        + "; the draws follow an untimed warm-up that adapted the step size "
        "(step_size; initial_step_size was given) and a diagonal metric; "
        "first_call_sec is the model build (C++ compilation, cached by "
        "httpstan)")
    records.append(record)
  return records
