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
  the gradients its batch computed (`num_grads_computed`: on the pc
  backends the rows its gradient calls computed, under `pc:xla` the
  chains that reached each call gathered into one of a few sizes; on the
  local ones batched leaf calls x chains); TFP's reference reports its
  own count;
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
import os
import sys

from benchmarks import machine as machine_lib
from benchmarks import nuts_problems
from benchmarks import nuts_report
from benchmarks import nuts_run
from benchmarks import nuts_systems
from benchmarks import quiet

SYSTEMS = nuts_systems.SYSTEMS
DEMO_SYSTEMS = ("pc:xla", "tfp_reference", "tfp_iterative", "limit",
                "limit_logp")
RECORD_KEYS = ("system", "problem", "batch_size", "grads_per_sec",
               "utilization", "sec_per_step", "first_call_sec", "burnin_sec",
               "accept_rate", "ess_per_sec")


def benchmark(output=None, plot_path=None, **kwargs):
  """Runs, prints and saves the benchmark; returns the JSON payload.

  Arguments are those of `nuts_run.run_benchmarks`, plus `output` (JSON
  path or None) and `plot_path` (PNG path or None).
  """
  machine = machine_lib.machine_info()
  config = dict(kwargs, command=" ".join(
      [os.path.basename(sys.executable)] + sys.argv))
  config.pop("log", None)
  config["step_size_defaults"] = dict(nuts_problems.DEFAULT_STEP_SIZES)
  records, skipped = nuts_run.run_benchmarks(**kwargs)
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
    quiet.silence_peers()
    run(flags.FLAGS)
  define()
  app.run(main)


if __name__ == "__main__":
  run_program(define_flags, run_from_flags)
