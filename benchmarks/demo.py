r"""`make demo`: batched recursive NUTS against TFP's NUTS kernels.

  python -m benchmarks.demo [--batch_sizes=4,16,64] [--systems=...]
  make demo ARGS="--systems=pc:xla,limit --batch_sizes=8,32"

The project's main job in a few minutes on a 2-core CPU: NUTS on the
paper's Bayesian logistic regression (100 regressors, 10,000 synthetic data
points; `benchmarks/nuts_problems.py`) with

- `pc:xla`: our `nuts.NoUTurnSampler`, the recursive single-chain NUTS of
  `nuts/tree.py` batched over chains by program-counter autobatching;
- `tfp_reference`: `tfp.experimental.mcmc.NoUTurnSampler` (TFP's own
  autobatched NUTS), XLA;
- `tfp_iterative`: `tfp.mcmc.NoUTurnSampler`, XLA;
- `limit`: a raw batched leapfrog loop, the most gradients/s the machine
  gives at that number of chains, and `limit_logp`, the same keeping the
  log density of every leapfrog as NUTS must,

at 4, 16 and 64 chains, all from the same start with the same step size
(8 warm-up steps, then 3 rounds of 5 timed steps, each round timing every
system in turn; the rates are the median round's),
each kernel that can fuse trajectories (ours and TFP's reference) also with
10 trajectories per step (paper Fig. 7: a chain that finishes a short
trajectory starts its next one instead of waiting). It prints model
gradients per second (used by the chains, summed over chains), the other
measurements and the ratios of `pc:xla` to each system, writes
`benchmarks/results/nuts_demo.json` and the plot
`benchmarks/results/nuts_demo.png`.
Every flag of `python -m benchmarks.nuts` passes through (see
`benchmarks/nuts.py`; the defaults here are a smaller run).  It exits
non-zero if one of our systems fails.  The full benchmark is
`python -m benchmarks.nuts`; the programs demo is
`python -m benchmarks.programs_demo`.
"""
import sys
import time

from absl import app

from benchmarks import nuts as nuts_bench
from benchmarks import nuts_systems
from benchmarks import quiet

FLAGS = nuts_bench.define_flags(
    problem=["logistic_regression"], systems=list(nuts_bench.DEMO_SYSTEMS),
    batch_sizes=["4", "16", "64"], num_trajectories_per_step=["1", "10"],
    num_results=5, num_burnin=8, rounds=3,
    output="benchmarks/results/nuts_demo.json",
    plot="benchmarks/results/nuts_demo.png", max_step_sec=20.0)


def main(argv):
  quiet.silence_peers()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  started = time.monotonic()
  print("Batched recursive NUTS (nuts.NoUTurnSampler on tfp_autobatch) "
        "against TFP's NUTS kernels")
  print(f"problem(s): {', '.join(FLAGS.problem)}; systems: "
        f"{', '.join(FLAGS.systems)}; chains: {', '.join(FLAGS.batch_sizes)}; "
        f"{FLAGS.num_burnin} warm-up steps, then {FLAGS.rounds} round(s) of "
        f"{FLAGS.num_results} timed steps, interleaved across the systems")
  print("(the first step of each system and batch size converts and "
        "compiles: tens of seconds each)")
  payload = nuts_bench.run_from_flags(FLAGS)
  ours = set(nuts_systems.OUR_BACKENDS)
  failed = [s for s in payload["skipped"] if s["system"] in ours]
  print(f"\ndemo finished in {time.monotonic() - started:.0f}s"
        + (": OUR SYSTEMS FAILED: " + "; ".join(
            f"{s['system']}: {s['reason']}" for s in failed)
           if failed else ""))
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  app.run(main)
