r"""Inference Gym's models beyond the ESS benchmark's: does ours run them as
`tfp.mcmc.NoUTurnSampler` does?

    python -m benchmarks.gym_models --chains=8 \
        --output=benchmarks/results/gym_models.json

For each of Inference Gym's targets (`--models`; by default every one
that builds with its defaults, in the order of `gym_targets`), in a
process of its own with a time limit (`--timeout_s`): both kernels through
the ESS harness (`benchmarks/ess_harness.py`: `sample_chain` with dual
averaging inside `jit_compile`, TFP's first) from the same uniform(-2, 2)
starts, `--num_warmup` and `--num_draws` steps, one round. Per kernel: the
first call's and the sampling seconds, divergences, whether every draw is
finite and, where the model has ground truth, the largest |mean - truth|
in ground-truth standard deviations (a check of gross errors only: a
short run's Monte Carlo error is a good part of it). A model whose
density cannot be computed (it needs constructor arguments, or data from
`tensorflow_datasets`, which is not installed) is listed as skipped, with
the reason; one that runs past the limit as timed out.

It is a net for models unlike the ESS benchmark's (it found a fixed
Cholesky factor's solve redone at every gradient call: docs/backends.md,
"Work on constants in a batched primitive"), not a speed benchmark: one
round, short runs.
"""
import json
import subprocess
import sys
import time
import zlib

import numpy as np
import tensorflow as tf

from benchmarks import ess_harness
from benchmarks import ess_models
from benchmarks import nuts as nuts_bench
from benchmarks import nuts_vm_steps

SYSTEMS = ("tfp", "pc:xla")
# Inference Gym's base classes, which are not targets.
_BASES = ("Model", "BayesianModel", "VectorModel")


def gym_targets():
  """The names of Inference Gym's targets (its classes, less the bases)."""
  from inference_gym import using_tensorflow as gym   # pylint: disable=g-import-not-at-top
  return [name for name in sorted(dir(gym.targets))
          if isinstance(getattr(gym.targets, name), type)
          and issubclass(getattr(gym.targets, name), gym.targets.Model)
          and name not in _BASES]


def run_one(name, chains, num_warmup, num_draws, systems=SYSTEMS, seed=0):
  """The record of model `name`: its dimension and, per system, what
  `ess_harness.run` gave (or the error), or why it was skipped."""
  record = {"model": name}
  try:
    model = ess_models.gym_model(name, name, "")
    # The density once, before any kernel: a model whose data need a
    # download fails here (its data are read lazily).
    model.target_log_prob(tf.zeros([1, model.num_dims]))
  except Exception as e:  # pylint: disable=broad-except
    record["skipped"] = f"{type(e).__name__}: {str(e)[:300]}"
    return record
  record["num_dims"] = model.num_dims
  rng = np.random.default_rng([seed, zlib.crc32(name.encode()), chains])
  init = rng.uniform(-2., 2., (chains, model.num_dims)).astype(np.float32)
  truth_known = bool(np.all(np.isfinite(model.truth_mean))
                     and np.all(np.isfinite(model.truth_sd)))
  for system in systems:
    began = time.perf_counter()
    try:
      run = ess_harness.run(system, model, init, num_warmup=num_warmup,
                            num_draws=num_draws,
                            steps_per_call=_steps_per_call(num_warmup,
                                                           num_draws))
    except Exception as e:  # pylint: disable=broad-except
      record[system] = {"error": f"{type(e).__name__}: {str(e)[:600]}"}
      continue
    draws = np.asarray(model.to_truth(tf.constant(
        run.draws.reshape(-1, model.num_dims))))
    result = {
        "first_call_s": run.first_call_s, "sampling_s": run.sampling_s,
        "divergences": int(np.sum(run.divergences)),
        "finite": bool(np.all(np.isfinite(draws))),
        "step_size": run.step_size,
        "wall_s": time.perf_counter() - began}
    if truth_known:
      error = np.abs(draws.mean(0) - model.truth_mean) / np.maximum(
          model.truth_sd, 1e-12)
      result["max_error_in_sd"] = float(np.max(error))
    record[system] = result
  return record


def _steps_per_call(num_warmup, num_draws):
  """The harness's steps per compiled call: the largest of 50, 25, 10, 5
  and 1 that divides both counts."""
  return next(n for n in (50, 25, 10, 5, 1)
              if num_warmup % n == 0 and num_draws % n == 0)


def run_all(names, chains, num_warmup, num_draws, timeout_s):
  """The records of `names`, each run by `run_one` in a process of its own
  (a model's compilation cannot hold up the others past `timeout_s`)."""
  records = []
  for name in names:
    command = [sys.executable, "-m", "benchmarks.gym_models", f"--one={name}",
               f"--chains={chains}", f"--num_warmup={num_warmup}",
               f"--num_draws={num_draws}"]
    began = time.perf_counter()
    try:
      done = subprocess.run(command, capture_output=True, text=True,
                            timeout=timeout_s, check=False)
      lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
      record = (json.loads(lines[-1]) if lines else
                {"model": name,
                 "error": f"exit {done.returncode}: {done.stderr[-600:]}"})
    except subprocess.TimeoutExpired:
      record = {"model": name, "timed_out_s": timeout_s}
    record["wall_s"] = time.perf_counter() - began
    records.append(record)
    print(summary(record), flush=True)
  return records


def summary(record):
  """One line for a record."""
  name = record["model"]
  if "skipped" in record:
    return f"{name}: skipped ({record['skipped'][:120]})"
  if "timed_out_s" in record:
    return f"{name}: did not finish in {record['timed_out_s']} s"
  if "error" in record:
    return f"{name}: failed ({record['error'][:200]})"
  parts = []
  for system in SYSTEMS:
    r = record.get(system)
    if r is None:
      continue
    if "error" in r:
      parts.append(f"{system} failed ({r['error'][:160]})")
      continue
    error = (f", max |mean - truth| {r['max_error_in_sd']:.2f} sd"
             if "max_error_in_sd" in r else "")
    parts.append(f"{system} first call {r['first_call_s']:.1f} s, sampling "
                 f"{r['sampling_s']:.2f} s, {r['divergences']} divergences"
                 f"{'' if r['finite'] else ', NON-FINITE draws'}{error}")
  return f"{name} ({record.get('num_dims')}-d): " + "; ".join(parts)


def define_flags():
  """The command line's flags, defined only when run as a program."""
  from absl import flags   # pylint: disable=g-import-not-at-top
  flags.DEFINE_list("models", None,
                    "Inference Gym target names (default: all of them).")
  flags.DEFINE_integer("chains", 8, "Number of chains.")
  flags.DEFINE_integer("num_warmup", 100, "Warm-up steps (dual averaging).")
  flags.DEFINE_integer("num_draws", 100, "Steps kept.")
  flags.DEFINE_integer("timeout_s", 600, "Time limit of one model's process.")
  flags.DEFINE_string("one", None,
                      "Run this one model in this process and print its "
                      "record as a JSON line (what each model's process "
                      "does).")
  flags.DEFINE_string("output", None, "JSON file for the records.")


def run_from_flags(fv):
  """Runs as the parsed flags `fv` say; returns the records."""
  if fv.one:
    record = run_one(fv.one, fv.chains, fv.num_warmup, fv.num_draws)
    print(json.dumps(record))
    return [record]
  records = run_all(fv.models or gym_targets(), fv.chains, fv.num_warmup,
                    fv.num_draws, fv.timeout_s)
  if fv.output:
    nuts_vm_steps.write_results(fv.output, records=records,
                                chains=fv.chains, num_warmup=fv.num_warmup,
                                num_draws=fv.num_draws)
  return records


if __name__ == "__main__":
  nuts_bench.run_program(define_flags, run_from_flags)
