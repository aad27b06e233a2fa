r"""Benchmark in the user's metric: effective samples per second, ours against
`tfp.mcmc.NoUTurnSampler`, on models with ground truth.

  python -m benchmarks.ess                       # every model, 1-256 chains
  python -m benchmarks.ess --models=eight_schools,item_response \
      --chains=4,64 --num_warmup=200 --num_draws=200 --rounds=3 \
      --output=/tmp/ess.json \
      --plot=/tmp/ess.png
  python -m benchmarks.ess --num_trajectories_per_step=1,4   # fusion A/B
  python -m benchmarks.ess --quick               # a tiny run (tests)
  python -m benchmarks.ess --replicas=2 --systems=pc:xla --chains=8
      # our chains split over 2 logical CPU devices (MirroredStrategy)
  python -m benchmarks.ess --from_json=benchmarks/results/ess.json \
      --plot=benchmarks/results/ess.png          # re-plot, no run

Models (`benchmarks/ess_models.py`): six from TFP's Inference Gym and the
paper's logistic regression and 100-d correlated Gaussian, each a flat
unconstrained target with ground-truth posterior means and standard
deviations. Every system runs through one harness
(`benchmarks/ess_harness.py`: `sample_chain` with dual averaging inside
`tf.function(jit_compile=True)`), from the same starts (uniform(-2, 2) in
the unconstrained space, as Stan) and seeds. Per model and number of chains,
each round runs every system in turn (`tfp` first), so that a slow stretch
of the machine falls on all of them; each number of the table is the median
over the rounds (`benchmarks/ess_report.py` defines them). Each run
compiles afresh: first-call seconds are measured every round.

`--replicas=N` (N >= 1) splits the CPU into N logical devices and runs our
kernel's chains split over a `tf.distribute.MirroredStrategy` of N replicas
(`benchmarks/ess_replicas.py`: one `strategy.run` per step, the step size
adapted over all replicas' chains); run it once per N to measure scaling.
TFP's kernel is not sharded, so leave `tfp` out of `--systems` there.

`--compile_cache_dir=DIR` turns on TensorFlow's persistent XLA compilation
cache there (see docs/compile_cache.md), so that a second process reuses
the first's XLA compilations.

`--bucket_float_ops_per_row=N` sets the per-row cost (TensorFlow's estimate
of floating-point operations) from which our kernel gathers a gradient
call's chains into buckets (`BUCKETS_FROM_FLOAT_OPS_PER_ROW` in
`tfp_autobatch/runtime/batched_primitive_calls.py`): 0 for buckets
whatever the model, a large number for none, to measure that choice.
"""
import functools
import json
import os
import sys
import time

from absl import app
from absl import flags

from benchmarks import ess_harness
from benchmarks import ess_models
from benchmarks import ess_replicas
from benchmarks import ess_report
from benchmarks import machine as machine_lib
from benchmarks import quiet
from tfp_autobatch.runtime import batched_primitive_calls

flags.DEFINE_list("models", list(ess_models.MODELS),
                  f"models, of: {', '.join(ess_models.MODELS)}")
flags.DEFINE_list("chains", ["1", "4", "16", "64", "256"],
                  "numbers of chains")
flags.DEFINE_list("systems", [ess_harness.TFP, "pc:xla"],
                  "'tfp' (tfp.mcmc.NoUTurnSampler) and our backends "
                  "(nuts.NoUTurnSampler's `backend`: pc:xla, pc:graph)")
flags.DEFINE_list("num_trajectories_per_step", ["1"],
                  "trajectory fusion settings of our kernel (each a run; "
                  "all k draws of a step are kept)")
flags.DEFINE_integer("num_warmup", 500, "warm-up steps (step-size adaptation)")
flags.DEFINE_integer("num_draws", 500, "kept steps per chain")
flags.DEFINE_integer("steps_per_call", 50,
                     "steps per call of the compiled sample_chain (must "
                     "divide --num_warmup and --num_draws)")
flags.DEFINE_integer("rounds", 3, "rounds per cell; the median is reported")
flags.DEFINE_integer("max_tree_depth", 10, "NUTS max tree depth")
flags.DEFINE_float("target_accept_prob", 0.8, "dual averaging's target")
flags.DEFINE_integer("seed", 0, "seed of the starts and the chains")
flags.DEFINE_string("output", "benchmarks/results/ess.json", "JSON output")
flags.DEFINE_string("plot", "benchmarks/results/ess.png",
                    "plot path ('' for none)")
flags.DEFINE_string("from_json", None, "re-plot and print this JSON, no run")
flags.DEFINE_string("compile_cache_dir", None,
                    "TensorFlow's persistent XLA compilation cache folder")
flags.DEFINE_float("bucket_float_ops_per_row", None,
                   "our kernel's bucket threshold (default: the library's)")
flags.DEFINE_integer("replicas", 0,
                     "N >= 1: our chains split over a MirroredStrategy of N "
                     "logical CPU devices (--chains in multiples of N); 0: "
                     "no strategy")
flags.DEFINE_bool("quick", False,
                  "a tiny run (eight_schools, 2 chains, 20 + 20 steps, 1 "
                  "round) for flags not given")
FLAGS = flags.FLAGS

QUICK = {"models": ["eight_schools"], "chains": ["2"], "num_warmup": 20,
         "num_draws": 20, "steps_per_call": 10, "rounds": 1}


def _label(system, k):
  if system == ess_harness.TFP:
    return "tfp.mcmc.NoUTurnSampler"
  label = system if k == 1 else f"{system} k={k}"
  if FLAGS.replicas:
    label += f" on {FLAGS.replicas} replicas"
  return label


def _configurations():
  """(system, k) in run order: TFP's kernel first."""
  out = []
  for system in FLAGS.systems:
    for k in ([1] if system == ess_harness.TFP
              else [int(k) for k in FLAGS.num_trajectories_per_step]):
      out.append((system, k))
  return sorted(out, key=lambda c: c[0] != ess_harness.TFP)


def run_cell(model, num_chains, strategy=None):
  """Every system's records for one model and number of chains (split over
  `strategy`'s replicas when given)."""
  init = ess_models.initial_state(model, num_chains, FLAGS.seed)
  rounds = {c: [] for c in _configurations()}
  harness = (ess_harness.run if strategy is None else
             functools.partial(ess_replicas.run, strategy=strategy))
  for round_index in range(FLAGS.rounds):
    for system, k in rounds:
      result = harness(
          system, model, init, num_warmup=FLAGS.num_warmup,
          num_draws=FLAGS.num_draws, steps_per_call=FLAGS.steps_per_call,
          seed=FLAGS.seed, round_index=round_index,
          max_tree_depth=FLAGS.max_tree_depth, num_trajectories_per_step=k,
          target_accept_prob=FLAGS.target_accept_prob)
      numbers = ess_report.metrics(
          result, model.to_truth(result.draws).numpy(), model.truth_mean,
          model.truth_mcse)
      rounds[(system, k)].append(numbers)
      print(f"  {model.name} {num_chains} chains round {round_index}: "
            f"{_label(system, k)}: first call {numbers['first_call_s']:.1f}"
            f" s, sampling {numbers['sampling_s']:.2f} s, min ESS/s "
            f"{numbers['min_ess_per_s']:.1f}, R-hat "
            f"{numbers['max_rhat']:.3f}", flush=True)
  return [{"model": model.name, "description": model.description,
           "num_dims": model.num_dims, "num_chains": num_chains,
           "system": system, "num_trajectories_per_step": k,
           "label": _label(system, k), "replicas": FLAGS.replicas,
           "rounds": per_round,
           "median": ess_report.aggregate(per_round)}
          for (system, k), per_round in rounds.items()]


def _settings():
  return {name: FLAGS[name].value for name in (
      "models", "chains", "systems", "num_trajectories_per_step",
      "num_warmup", "num_draws", "steps_per_call", "rounds",
      "max_tree_depth", "target_accept_prob", "seed", "compile_cache_dir",
      "replicas", "bucket_float_ops_per_row")}


def _write(payload):
  if FLAGS.output:
    os.makedirs(os.path.dirname(FLAGS.output) or ".", exist_ok=True)
    with open(FLAGS.output, "w") as f:
      json.dump(payload, f, indent=1)


def main(argv):
  quiet.silence_peers()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if FLAGS.from_json:
    with open(FLAGS.from_json) as f:
      payload = json.load(f)
  else:
    if FLAGS.quick:
      for name, value in QUICK.items():
        if not FLAGS[name].present:
          FLAGS[name].value = value
    if FLAGS.compile_cache_dir:
      os.environ["TF_XLA_FLAGS"] = (
          os.environ.get("TF_XLA_FLAGS", "") +
          f" --tf_xla_persistent_cache_directory={FLAGS.compile_cache_dir}")
    if FLAGS.bucket_float_ops_per_row is not None:
      batched_primitive_calls.BUCKETS_FROM_FLOAT_OPS_PER_ROW = (
          FLAGS.bucket_float_ops_per_row)
    unknown = set(FLAGS.models) - set(ess_models.MODELS)
    if unknown:
      raise app.UsageError(f"unknown models {sorted(unknown)}; models: "
                           f"{', '.join(ess_models.MODELS)}")
    strategy = None
    if FLAGS.replicas:
      if ess_harness.TFP in FLAGS.systems:
        raise app.UsageError(
            "--replicas shards our kernel's chains; leave 'tfp' out of "
            "--systems (e.g. --systems=pc:xla)")
      bad = [c for c in FLAGS.chains if int(c) % FLAGS.replicas]
      if bad:
        raise app.UsageError(f"--chains {bad} cannot be split evenly over "
                             f"--replicas={FLAGS.replicas}")
      ess_replicas.set_logical_cpus(FLAGS.replicas)
      strategy = ess_replicas.mirrored_strategy(FLAGS.replicas)
    began = time.monotonic()
    payload = {"command": "python -m benchmarks.ess " + " ".join(argv[1:] or
                                                                 sys.argv[1:]),
               "settings": _settings(),
               "machine": machine_lib.machine_info(), "records": []}
    for name in FLAGS.models:
      model = ess_models.make_model(name)
      print(f"{name}: {model.description}", flush=True)
      for num_chains in (int(c) for c in FLAGS.chains):
        payload["records"] += run_cell(model, num_chains, strategy)
        payload["elapsed_s"] = time.monotonic() - began
        _write(payload)
  print(ess_report.format_table(payload["records"]))
  if FLAGS.plot:
    ess_report.plot(payload["records"], FLAGS.plot)
    print(f"plot: {FLAGS.plot}")


if __name__ == "__main__":
  app.run(main)
