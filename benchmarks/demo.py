r"""`make demo`: our NUTS against TFP's, effective samples per second first.

  python -m benchmarks.demo [--batch_sizes=4,16,64] [--systems=...]
  make demo ARGS="--systems=pc:xla,limit --batch_sizes=8,32"
  make demo ARGS="--ess_args='--models=eight_schools --chains=16'"
  make demo ARGS="--noess"                   # the gradients/s part only

The project's main job in a few minutes on a 2-core CPU, in two parts.

1. **Effective samples per second**, the user's metric: `benchmarks.ess`
   (see `benchmarks/ess.py`) on two models with ground truth, Inference
   Gym's eight schools and the paper's 100-d correlated Gaussian, at 4 and
   64 chains: `nuts.NoUTurnSampler` on `pc:xla` against
   `tfp.mcmc.NoUTurnSampler` through one harness (`sample_chain` with dual
   averaging inside `tf.function(jit_compile=True)`, uniform(-2, 2)
   starts), one round of 200 warm-up and 200 kept steps. It prints
   first-call seconds, min and median ESS/s, R-hat and the error against
   the ground truth, and writes `benchmarks/results/ess_demo.json` and
   `.png`. `--ess_args` replaces its flags; the full run is
   `python -m benchmarks.ess`.
2. **Gradients per second**, how well the hardware is used: NUTS on the
   paper's Bayesian logistic regression (100 regressors, 10,000 synthetic
   data points; `benchmarks/nuts_problems.py`) with

   - `pc:xla`: our `nuts.NoUTurnSampler`, the recursive single-chain NUTS
     of `nuts/tree.py` batched over chains by program-counter autobatching;
   - `tfp_reference`: `tfp.experimental.mcmc.NoUTurnSampler` (TFP's own
     autobatched NUTS), XLA;
   - `tfp_iterative`: `tfp.mcmc.NoUTurnSampler`, XLA;
   - `limit`: a raw batched leapfrog loop, the most gradients/s the machine
     gives at that number of chains, and `limit_logp`, the same keeping the
     log density of every leapfrog as NUTS must,

   at 4, 16 and 64 chains, all from the same start with the same step size
   (8 warm-up steps, then 3 rounds of 5 timed steps, each round timing
   every system in turn; the rates are the median round's), each kernel
   that can fuse trajectories also with 10 trajectories per step (paper
   Fig. 7). Fused steps count gradients, not draws: part 1 is the measure
   of what a user gets. It writes `benchmarks/results/nuts_demo.json` and
   `nuts_demo.png`. Every flag of `python -m benchmarks.nuts` passes
   through (see `benchmarks/nuts.py`; the defaults here are a smaller run).

It exits non-zero if one of our systems fails in either part.
"""
import shlex
import subprocess
import sys
import time

from absl import app
from absl import flags

from benchmarks import nuts as nuts_bench
from benchmarks import nuts_systems
from benchmarks import quiet

FLAGS = nuts_bench.define_flags(
    problem=["logistic_regression"], systems=list(nuts_bench.DEMO_SYSTEMS),
    batch_sizes=["4", "16", "64"], num_trajectories_per_step=["1", "10"],
    num_results=5, num_burnin=8, rounds=3,
    output="benchmarks/results/nuts_demo.json",
    plot="benchmarks/results/nuts_demo.png", max_step_sec=20.0)
flags.DEFINE_bool("ess", True, "run part 1, the ESS/s comparison, first")
flags.DEFINE_string(
    "ess_args", "--models=eight_schools,correlated_gaussian --chains=4,64 "
    "--num_warmup=200 --num_draws=200 --rounds=1 "
    "--output=benchmarks/results/ess_demo.json "
    "--plot=benchmarks/results/ess_demo.png",
    "flags of part 1's `python -m benchmarks.ess` run, as one string")


def run_ess_part():
  """Runs `benchmarks.ess` with `--ess_args` in a child process (its flags
  share names with the gradients/s benchmark's); True if it succeeded."""
  print("\n== Part 1: effective samples per second (ours against "
        "tfp.mcmc.NoUTurnSampler) ==", flush=True)
  command = [sys.executable, "-m", "benchmarks.ess",
             *shlex.split(FLAGS.ess_args)]
  print("$ python -m benchmarks.ess " + FLAGS.ess_args, flush=True)
  return subprocess.run(command, check=False).returncode == 0


def main(argv):
  quiet.silence_peers()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  started = time.monotonic()
  print("Batched recursive NUTS (nuts.NoUTurnSampler on tfp_autobatch) "
        "against TFP's NUTS kernels")
  ess_ok = run_ess_part() if FLAGS.ess else True
  print("\n== Part 2: gradients per second on the logistic regression "
        "(hardware use; fused steps count gradients, not draws) ==")
  print(f"problem(s): {', '.join(FLAGS.problem)}; systems: "
        f"{', '.join(FLAGS.systems)}; chains: {', '.join(FLAGS.batch_sizes)}; "
        f"{FLAGS.num_burnin} warm-up steps, then {FLAGS.rounds} round(s) of "
        f"{FLAGS.num_results} timed steps, interleaved across the systems")
  print("(the first step of each system and batch size converts and "
        "compiles: tens of seconds each)")
  payload = nuts_bench.run_from_flags(FLAGS)
  ours = set(nuts_systems.OUR_BACKENDS)
  failed = [f"{s['system']}: {s['reason']}" for s in payload["skipped"]
            if s["system"] in ours]
  if not ess_ok:
    failed.insert(0, "the ESS/s run (part 1) failed")
  print(f"\ndemo finished in {time.monotonic() - started:.0f}s"
        + (": OUR SYSTEMS FAILED: " + "; ".join(failed) if failed else ""))
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  app.run(main)
