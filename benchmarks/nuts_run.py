"""Runs the NUTS benchmark's systems over its problems and batch sizes.

`run_benchmarks` measures every system (`nuts_measure`) in interleaved
rounds, so that a slow stretch of the machine falls on all systems of a
round, and skips a system that fails, cannot run or gets too slow, with
its reason.  `benchmarks/nuts.py` is the command line around it.
"""
import os
import traceback

from benchmarks import nuts_measure
from benchmarks import nuts_problems
from benchmarks import nuts_systems
from benchmarks import progress as progress_lib


def run_benchmarks(problems=("logistic_regression",),
                   systems=nuts_systems.SYSTEMS, batch_sizes=(1, 4, 16, 64),
                   num_results=20, num_burnin=10,
                   num_trajectories_per_step=(1,), seed=0, step_size=None,
                   max_tree_depth=10, unrolled_leapfrog_steps=1,
                   num_dims=None, num_data=None, trace_kernel=True,
                   unbatched_cap=4, limit_leapfrogs=64, stan_num_results=200,
                   stan_num_warmup=200, max_step_sec=60.0, steps_per_call=1,
                   rounds=1, progress=True, log=None):
  """Runs the benchmark; returns `(records, skipped)` (see
  `benchmarks/nuts.py`).

  Batch size by batch size, every system is built and warmed up, then
  timed in `rounds` rounds, each timing `num_results` steps of every
  system in turn: a slow stretch of the machine falls on all systems of
  a round instead of on one system's cell. A system that fails or cannot
  run is skipped with its reason; once a step takes longer than
  `max_step_sec`, its larger batch sizes are.
  """
  for system in systems:
    if system not in nuts_systems.SYSTEMS:
      raise ValueError(f"unknown system {system!r}; systems: "
                       f"{list(nuts_systems.SYSTEMS)}")
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
  bar = progress_lib.progress_bar(
      len(problems) * len(all_cells) * len(batch_sizes), progress,
      "benchmark", "run")
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
        records += nuts_measure.measure_stan(
            problem, settings_for(1), pool, batch_sizes, stan_num_results,
            stan_num_warmup)
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
          measurements[system, k] = nuts_measure.Measurement(
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
