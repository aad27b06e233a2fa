r"""Benchmark: batched NUTS, ours against peers (Radul et al. 2020, Figs. 6-7).

Usage:

  python -m benchmarks.nuts --problem=logistic_regression \
      --systems=pc:xla,pc:graph,local:eager,local:eager_xla,unbatched,tfp_reference,tfp_iterative,stan,limit,limit_logp \
      --batch_sizes=1,4,16,64,256 --num_results=20 --num_burnin=10 \
      --output=benchmarks/results/nuts.json --plot=benchmarks/results/nuts.png
  python -m benchmarks.nuts --problem=correlated_gaussian \
      --systems=pc:xla,local:eager_xla --num_trajectories_per_step=1,10 \
      --batch_sizes=1,4,16,64 ...                        # Fig. 7
  python -m benchmarks.nuts --problem=correlated_gaussian \
      --systems=pc:xla,tfp_reference,tfp_iterative --steps_per_call=10 \
      --num_burnin=20 --num_results=20 ...     # as sample_chain runs them
  python -m benchmarks.nuts --from_json=benchmarks/results/nuts.json \
      --plot=benchmarks/results/nuts.png        # re-plot, no run

Problems (`benchmarks/nuts_problems.py`): the paper's 100-d Bayesian
logistic regression on 10,000 synthetic points (Fig. 6) and a 100-d
correlated Gaussian (Fig. 7); systems: `benchmarks/nuts_systems.py`.  All
systems get the same target, the same starting points (the first
`batch_size` of one seeded pool, near the posterior) and the same fixed step
size (`--step_size`, per-problem defaults; TFP's reference kernel cannot
adapt it; Stan only starts from it, see below), `--max_tree_depth` and
`--unrolled_leapfrog_steps` (the paper used 4 leapfrog steps per leaf; the
default here is standard NUTS, 1).

Per system, `--num_trajectories_per_step` value and batch size (number of
chains), one run: the first MCMC step (`first_call_sec`: conversion,
tracing and compilation, plus one step), `--num_burnin` - 1 more untimed
steps (`burnin_sec`), then `--rounds` windows of `--num_results` timed
steps whose states are kept.  Batch size by batch size, every system is
warmed up first, then each round times one window of every system in
turn, so that a slow stretch of the machine (this one's speed moves by
1.5-2x from minute to minute) falls on every system of a round rather
than on one system's cell; the rates are the median window's.  The
default burn-in of 10 steps is there because XLA-compiled kernels run
slower for their first steps: on 2 cores one fixed
logistic-regression transition of `pc:xla` took 26, 15, 8, 8, 6 ms on its
first calls and 4.5-5 ms from about the eighth (TFP's reference kernel: 15
then 9 ms; with one intra-op thread the slow start was 2 calls long; the
cause is not known).  With 2 burn-in steps the timed steps were mostly
this slow start.

By default every step is one call from Python of a `tf.function` around
the kernel's `one_step`, which pays the cost of entering a compiled
function each step (about 0.6 ms on this machine for a NUTS state).  With
`--steps_per_call=n` the kernels (ours on `pc:xla` and `pc:graph`, TFP's
two) run n steps in one `tf.while_loop` inside one `tf.function` (with
XLA, except `pc:graph`), as `tfp.mcmc.sample_chain` runs them in a user's
`tf.function`; the first call, the burn-in and the timed steps are then
whole calls of n steps (n must divide `--num_burnin` and
`--num_results`).  The steps and their seeds are the same either way.
Eager systems (`local:*`, `unbatched`) still take one step per call (their
records say so), `limit` one call of `--limit_leapfrogs` leapfrogs, and
Stan its own run.  Recorded:

- `grads_per_sec`: gradients the chains' trajectories used (sum of their
  leapfrog steps, as in the paper), summed over chains, per second;
- `grads_computed` and `utilization` = used / computed.  Our kernel counts
  the gradients its batch computed (`num_grads_computed`: the backend's
  batched leaf calls x chains); TFP's reference reports its own count;
  for `tfp_iterative`, which runs chains in lockstep, it is estimated as
  chains x the longest chain's leapfrogs per step
  (`computed_is_estimate: true`).  For Fig. 7, run the correlated Gaussian
  with `--num_trajectories_per_step=1,10`;
- `rounds` and `round_grads_per_sec` (every window's rate; the record's
  `grads_per_sec` and `sec_per_step` are the median window's);
- `sec_per_step`, `accept_rate` (mean acceptance statistic; `None` for
  systems that do not report it), `ess_per_sec` (minimum over dimensions of
  `tfp.mcmc.effective_sample_size` of the kept states, cross-chain when
  there are several chains, over the timed seconds; noisy with few
  results).
- `steps_per_call`: the steps the system ran per call;
- `unbatched` runs its first `--unbatched_cap` chains one after the other,
  Stan one chain (its per-chain rate stands for every batch size, since
  Stan runs one chain per process): their rates are per chain and
  `extrapolated: true` where the batch is larger; `sec_per_step` is scaled
  to the batch.
- Stan cannot sample with a fixed step size: it runs its usual warm-up
  (`--stan_num_warmup` iterations adapting the step size and a diagonal
  metric, untimed), then `--stan_num_results` timed draws, timed by Stan's
  own sampling clock.  Its record's `step_size` is the adapted one
  (`initial_step_size`: the one given); it also has `num_warmup`,
  `warmup_sec`, `wall_sec` (the whole pystan call) and `divergences`.
- `limit` times `--limit_leapfrogs` batched leapfrog steps per "step";
  `limit_logp` the same keeping each leapfrog's log density, which NUTS
  needs and `limit` leaves out.

The output JSON is a list of records, one per system, problem, fusion
setting and batch size, with the keys above plus `system`, `problem`,
`batch_size`, the details (`grads_used`, `grads_computed`, ...), `machine`
(the programs benchmark's machine description: CPU, cores, versions, date,
commit) and `config` (the run's settings and the systems it skipped, with
why); `read_json` reads it back.
"""
import json
import math
import os
import sys
import time
import traceback

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from benchmarks import nuts_problems
from benchmarks import nuts_report
from benchmarks import nuts_systems
from benchmarks import programs as bench

SYSTEMS = nuts_systems.SYSTEMS
DEMO_SYSTEMS = ("pc:xla", "tfp_reference", "tfp_iterative", "limit",
                "limit_logp")
RECORD_KEYS = ("system", "problem", "batch_size", "grads_per_sec",
               "utilization", "sec_per_step", "first_call_sec", "burnin_sec",
               "accept_rate", "ess_per_sec")


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


# The programs benchmark's tqdm handling (None when tqdm is missing).
_tqdm = bench._tqdm  # pylint: disable=protected-access
_progress = bench._progress  # pylint: disable=protected-access


def _inner_bar(total, enabled, desc):
  if enabled and _tqdm is not None:
    return _tqdm.tqdm(total=total, desc=desc, unit="step", leave=False,
                      file=sys.stderr, dynamic_ncols=True)
  return None


class Measurement:
  """One system on one batch of chains: built, compiled and warmed up when
  made, then timed in windows of consecutive steps (`time_window`), which
  `run_benchmarks` interleaves with other systems' windows."""

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
      # slower for their first few steps (see the module doc).
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
  stan = nuts_systems.Stan(problem, settings, init[:1])
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


def run_benchmarks(problems=("logistic_regression",), systems=SYSTEMS,
                   batch_sizes=(1, 4, 16, 64), num_results=20, num_burnin=10,
                   num_trajectories_per_step=(1,), seed=0, step_size=None,
                   max_tree_depth=10, unrolled_leapfrog_steps=1,
                   num_dims=None, num_data=None, trace_kernel=True,
                   unbatched_cap=4, limit_leapfrogs=64, stan_num_results=200,
                   stan_num_warmup=200, max_step_sec=60.0, steps_per_call=1,
                   rounds=1, progress=True, log=None):
  """Runs the benchmark; returns `(records, skipped)` (see the module doc).

  Batch size by batch size, every system is built and warmed up, then
  timed in `rounds` rounds, each timing `num_results` steps of every
  system in turn: a slow stretch of the machine falls on all systems of
  a round instead of on one system's cell. A system that fails or cannot
  run is skipped with its reason; once a step takes longer than
  `max_step_sec`, its larger batch sizes are.
  """
  for system in systems:
    if system not in SYSTEMS:
      raise ValueError(f"unknown system {system!r}; systems: {list(SYSTEMS)}")
  for problem in problems:
    if problem not in nuts_problems.PROBLEMS:
      raise ValueError(f"unknown problem {problem!r}; problems: "
                       f"{list(nuts_problems.PROBLEMS)}")
  if num_results < 1 or num_burnin < 0 or rounds < 1:
    raise ValueError("--num_results and --rounds must be at least 1 and "
                     f"--num_burnin at least 0; got {num_results}, {rounds} "
                     f"and {num_burnin}")
  if steps_per_call < 1 or num_results % steps_per_call or (
      num_burnin % steps_per_call):
    raise ValueError(
        "--steps_per_call must be at least 1 and divide --num_results and "
        f"--num_burnin; got {steps_per_call}, {num_results} and {num_burnin}")
  if steps_per_call > 1 and not trace_kernel:
    raise ValueError("--steps_per_call > 1 runs steps inside a compiled "
                     "function: it needs --trace_kernel")
  if "stan" in systems and (stan_num_results < 1 or stan_num_warmup < 1):
    raise ValueError(
        "--stan_num_results and --stan_num_warmup must be at least 1 (with "
        "no warm-up Stan's step-size adaptation ends at once and sets the "
        f"step size to 1); got {stan_num_results} and {stan_num_warmup}")
  batch_sizes = sorted(set(int(b) for b in batch_sizes))
  ks = sorted(set(int(k) for k in num_trajectories_per_step))
  all_cells = [(s, k) for s in systems
               for k in (ks if s in nuts_systems.FUSING else [1])]
  bar = _progress(len(problems) * len(all_cells) * len(batch_sizes),
                  progress)
  log = log or (bar.write if bar is not None else print)
  records, skipped = [], []

  def skip(problem, system, k, batch, reason, count):
    skipped.append({"problem": problem, "system": system,
                    "num_trajectories_per_step": k, "batch_size": batch,
                    "reason": reason})
    log(f"SKIP {system} on {problem}"
        f"{'' if batch is None else f' (batch size {batch}+)'}: {reason}")
    if bar is not None:
      bar.update(count)

  for name in problems:
    problem = nuts_problems.make_problem(
        name, num_dims, num_data if name == "logistic_regression" else None,
        seed)
    pool = problem.initial_state(max(batch_sizes))

    def settings_for(k, problem=problem):
      return nuts_systems.Settings(
          step_size if step_size is not None else problem.step_size,
          max_tree_depth, unrolled_leapfrog_steps, k, seed, trace_kernel,
          unbatched_cap, limit_leapfrogs, steps_per_call)

    if "stan" in systems:
      if bar is not None:
        bar.set_postfix_str(f"{name} stan")
      try:
        records += measure_stan(problem, settings_for(1), pool, batch_sizes,
                                stan_num_results, stan_num_warmup)
        if bar is not None:
          bar.update(len(batch_sizes))
      except Exception as e:  # pylint: disable=broad-except
        skip(name, "stan", 1, None, _reason(e, log), len(batch_sizes))
    cells = [(s, k) for s, k in all_cells if s != "stan"]
    for i, batch in enumerate(batch_sizes):
      left = len(batch_sizes) - i
      measurements = {}
      for system, k in cells:
        if bar is not None:
          bar.set_postfix_str(f"{name} {system} k={k} x{batch}")
        try:
          measurements[system, k] = Measurement(
              system, problem, settings_for(k), pool[:batch], num_burnin,
              progress)
        except Exception as e:  # pylint: disable=broad-except
          skip(name, system, k, batch, _reason(e, log), left)
      failed = set()
      for _ in range(rounds):
        for cell, measurement in measurements.items():
          if cell in failed:
            continue
          try:
            measurement.time_window(num_results)
          except Exception as e:  # pylint: disable=broad-except
            failed.add(cell)
            skip(name, cell[0], cell[1], batch, _reason(e, log), left)
      done = []
      for cell, measurement in measurements.items():
        if cell in failed:
          continue
        record = measurement.record()
        records.append(record)
        if bar is not None:
          bar.update(1)
        if record["sec_per_step"] > max_step_sec and i + 1 < len(batch_sizes):
          skip(name, cell[0], cell[1], batch_sizes[i + 1],
               f"a step took {record['sec_per_step']:.1f}s > --max_step_sec="
               f"{max_step_sec}", left - 1)
        else:
          done.append(cell)
      # Failed and too slow systems stop here; the rest go on.
      cells = done
  if bar is not None:
    bar.close()
  return records, skipped


def _reason(error, log):
  if isinstance(error, nuts_systems.SkipSystem):
    return str(error)
  if os.environ.get("BENCH_TRACEBACK"):
    log(traceback.format_exc())
  first_line = str(error).strip().splitlines()[0][:300] if str(
      error).strip() else ""
  return f"failed: {type(error).__name__}: {first_line}"


def benchmark(output=None, plot_path=None, **kwargs):
  """Runs, prints and saves the benchmark; returns the JSON payload.

  Arguments are those of `run_benchmarks`, plus `output` (JSON path or
  None) and `plot_path` (PNG path or None).
  """
  machine = bench.machine_info()
  config = dict(kwargs, command=" ".join(
      [os.path.basename(sys.executable)] + sys.argv))
  config.pop("log", None)
  config["step_size_defaults"] = dict(nuts_problems.DEFAULT_STEP_SIZES)
  records, skipped = run_benchmarks(**kwargs)
  print()
  nuts_report.report(records, skipped, machine)
  if output:
    write_json(output, machine, _jsonable(config), records, skipped)
    print(f"\nwrote {output}")
  if plot_path and records:
    nuts_report.plot(records, plot_path)
    print(f"wrote {plot_path}")
  return {"machine": machine, "config": config, "records": records,
          "skipped": skipped}


def write_json(path, machine, config, records, skipped):
  """Writes the run to `path` as a JSON list of records, each carrying the
  machine description (with versions) and the run's configuration, which
  includes the systems it skipped and why."""
  config = dict(config, skipped=skipped)
  payload = [dict(r, machine=machine, config=config) for r in records]
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(payload, f, indent=1)
    f.write("\n")
  os.replace(tmp, path)


def read_json(path):
  """The payload (`machine`, `config`, `records`, `skipped`) of a file
  written by `write_json`."""
  with open(path) as f:
    saved = json.load(f)
  if not saved:
    return {"machine": None, "config": {}, "records": [], "skipped": []}
  records = [{k: v for k, v in r.items() if k not in ("machine", "config")}
             for r in saved]
  config = dict(saved[0]["config"])
  skipped = config.pop("skipped", [])
  return {"machine": saved[0]["machine"], "config": config,
          "records": records, "skipped": skipped}


def _jsonable(config):
  return {k: list(v) if isinstance(v, tuple) else v
          for k, v in config.items()}


# ---------------------------------------------------------------------------
# Command line.  Flags are defined only when run as a program (or by the
# demo), so importing this module defines none.
# ---------------------------------------------------------------------------

def define_flags(flag_values=None, **defaults):
  """Defines the flags on `flag_values` (default absl's); `defaults`
  overrides default values by flag name (the demo's smaller run)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  fv = flags.FLAGS if flag_values is None else flag_values

  def d(name, value):
    return defaults.get(name, value)
  flags.DEFINE_list("problem", d("problem", ["logistic_regression"]),
                    f"Problems: {', '.join(nuts_problems.PROBLEMS)}.",
                    flag_values=fv)
  flags.DEFINE_list("systems", d("systems", list(SYSTEMS)),
                    f"Systems: {', '.join(SYSTEMS)}.", flag_values=fv)
  flags.DEFINE_list("batch_sizes", d("batch_sizes", ["1", "4", "16", "64"]),
                    "Numbers of chains.", flag_values=fv)
  flags.DEFINE_integer("num_results", d("num_results", 20),
                       "Timed MCMC steps (states kept for ESS).",
                       flag_values=fv)
  flags.DEFINE_integer("num_burnin", d("num_burnin", 10),
                       "Untimed MCMC steps first (the first one is the "
                       "first call).", flag_values=fv)
  flags.DEFINE_list("num_trajectories_per_step",
                    d("num_trajectories_per_step", ["1"]),
                    "Trajectories fused per step, e.g. 1,10 (Fig. 7); for "
                    "our systems, unbatched and tfp_reference.",
                    flag_values=fv)
  flags.DEFINE_integer("seed", d("seed", 0), "Seed of data, starts and MCMC.",
                       flag_values=fv)
  flags.DEFINE_string("output", d("output", "benchmarks/results/nuts.json"),
                      "Where to write the JSON results ('' for nowhere).",
                      flag_values=fv)
  flags.DEFINE_string("plot", d("plot", ""),
                      "Where to write the PNG plot ('' for none).",
                      flag_values=fv)
  flags.DEFINE_float("step_size", d("step_size", None),
                     "Step size for every system (default per problem: "
                     + ", ".join(f"{k} {v}" for k, v in
                                 nuts_problems.DEFAULT_STEP_SIZES.items())
                     + ").", flag_values=fv)
  flags.DEFINE_integer("max_tree_depth", d("max_tree_depth", 10),
                       "NUTS maximum tree depth.", flag_values=fv)
  flags.DEFINE_integer("unrolled_leapfrog_steps",
                       d("unrolled_leapfrog_steps", 1),
                       "Leapfrog steps per tree leaf (the paper used 4).",
                       flag_values=fv)
  flags.DEFINE_integer("num_dims", d("num_dims", None),
                       "Override the problem's dimension (default 100).",
                       flag_values=fv)
  flags.DEFINE_integer("num_data", d("num_data", None),
                       "Override logistic regression's data points "
                       "(default 10,000).", flag_values=fv)
  flags.DEFINE_boolean("trace_kernel", d("trace_kernel", True),
                       "Run pc backends' one_step in tf.function; false: "
                       "eagerly (the batched program still compiled).",
                       flag_values=fv)
  flags.DEFINE_integer("unbatched_cap", d("unbatched_cap", 4),
                       "unbatched runs at most this many chains.",
                       flag_values=fv)
  flags.DEFINE_integer("limit_leapfrogs", d("limit_leapfrogs", 64),
                       "Leapfrog steps per limit call.", flag_values=fv)
  flags.DEFINE_integer("stan_num_results", d("stan_num_results", 200),
                       "Timed draws of Stan's single chain.", flag_values=fv)
  flags.DEFINE_integer("stan_num_warmup", d("stan_num_warmup", 200),
                       "Untimed warm-up iterations of Stan's chain first "
                       "(adapting its step size and diagonal metric; at "
                       "least 1).", flag_values=fv)
  flags.DEFINE_integer("steps_per_call", d("steps_per_call", 1),
                       "MCMC steps per compiled call: with n > 1, the "
                       "kernels' steps run n at a time in one "
                       "tf.while_loop inside one tf.function (XLA), as "
                       "tfp.mcmc.sample_chain runs them; must divide "
                       "--num_burnin and --num_results.", flag_values=fv)
  flags.DEFINE_integer("rounds", d("rounds", 1),
                       "Timed windows of --num_results steps per system "
                       "and batch size, interleaved across the systems; "
                       "rates are the median window's.", flag_values=fv)
  flags.DEFINE_float("max_step_sec", d("max_step_sec", 60.0),
                     "Skip a system's larger batches once a step takes "
                     "longer than this.", flag_values=fv)
  flags.DEFINE_boolean("progress", d("progress", True), "Progress bars.",
                       flag_values=fv)
  flags.DEFINE_string("from_json", d("from_json", ""),
                      "Print and plot the results in this JSON instead of "
                      "running.", flag_values=fv)
  return fv


def run_from_flags(fv):
  """Runs (or, with --from_json, re-reports) as the parsed flags `fv` say."""
  if fv.from_json:
    payload = read_json(fv.from_json)
    nuts_report.report(payload["records"], payload["skipped"],
                       payload["machine"])
    if fv.plot:
      nuts_report.plot(payload["records"], fv.plot)
      print(f"wrote {fv.plot}")
    return payload
  return benchmark(
      output=fv.output or None, plot_path=fv.plot or None,
      problems=tuple(fv.problem), systems=tuple(fv.systems),
      batch_sizes=tuple(int(b) for b in fv.batch_sizes),
      num_results=fv.num_results, num_burnin=fv.num_burnin,
      num_trajectories_per_step=tuple(
          int(k) for k in fv.num_trajectories_per_step),
      seed=fv.seed, step_size=fv.step_size, max_tree_depth=fv.max_tree_depth,
      unrolled_leapfrog_steps=fv.unrolled_leapfrog_steps,
      num_dims=fv.num_dims, num_data=fv.num_data,
      trace_kernel=fv.trace_kernel, unbatched_cap=fv.unbatched_cap,
      limit_leapfrogs=fv.limit_leapfrogs,
      stan_num_results=fv.stan_num_results,
      stan_num_warmup=fv.stan_num_warmup, max_step_sec=fv.max_step_sec,
      steps_per_call=fv.steps_per_call, rounds=fv.rounds,
      progress=fv.progress)


def run_program(define, run):
  """Runs a benchmark as an absl program: `define()` defines its flags,
  then `run(flags.FLAGS)`; positional arguments are an error."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top

  def main(argv):
    if len(argv) > 1:
      raise SystemExit(f"unexpected arguments: {argv[1:]}")
    run(flags.FLAGS)
  define()
  app.run(main)


if __name__ == "__main__":
  run_program(define_flags, run_from_flags)
