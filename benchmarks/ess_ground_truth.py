r"""Ground truth of the logistic regression for `python -m benchmarks.ess`.

  python -m benchmarks.ess_ground_truth --num_chains=64 --num_warmup=500 \
      --num_draws=4000

A long run of `tfp.mcmc.NoUTurnSampler` through the benchmark's own harness
(`benchmarks/ess_harness.py`: dual averaging, uniform(-2, 2) starts) on the
paper's logistic regression (`benchmarks/nuts_problems.py`), whose posterior
has no closed form. It writes the posterior mean and standard deviation of
each weight, with their ESS, R-hat and Monte Carlo standard errors and the
command, to `benchmarks/results/ess_ground_truth_logistic_regression.json`,
which `benchmarks/ess_models.py` reads. The benchmark's error column is in
units of its own MCSE; the truth's MCSE (stored) should be several times
smaller than a benchmark run's for that column to mean what it says (the
benchmark adds it to the run's MCSE). The stored run (64 chains, 4000
draws: min bulk ESS about 14,000) agreed with an independent 16-chain run
to within 1.8 combined standard errors on every weight.
"""
import json
import sys

from absl import app
from absl import flags
import arviz
import numpy as np

from benchmarks import ess_harness
from benchmarks import ess_models
from benchmarks import machine as machine_lib

flags.DEFINE_integer("num_chains", 64, "chains")
flags.DEFINE_integer("num_warmup", 500, "warm-up (adaptation) steps")
flags.DEFINE_integer("num_draws", 4000, "kept steps per chain")
flags.DEFINE_integer("steps_per_call", 100, "steps per compiled call")
flags.DEFINE_integer("seed", 12345, "seed of the starts and the chains")
flags.DEFINE_string("output", None, "JSON path (default: where "
                    "benchmarks/ess_models.py reads it)")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  model = ess_models.make_model("logistic_regression")
  init = ess_models.initial_state(model, FLAGS.num_chains, FLAGS.seed)
  result = ess_harness.run(
      ess_harness.TFP, model, init, num_warmup=FLAGS.num_warmup,
      num_draws=FLAGS.num_draws, steps_per_call=FLAGS.steps_per_call,
      seed=FLAGS.seed)
  draws = result.draws.astype(np.float64)
  data = arviz.convert_to_dataset(draws)
  ess = arviz.ess(data, method="bulk")["x"].values
  payload = {
      "model": model.name,
      "command": "python -m benchmarks.ess_ground_truth " + " ".join(
          sys.argv[1:]),
      "num_chains": FLAGS.num_chains, "num_warmup": FLAGS.num_warmup,
      "num_draws": FLAGS.num_draws, "seed": FLAGS.seed,
      "mean": draws.mean((0, 1)).tolist(),
      "sd": draws.std((0, 1)).tolist(),
      "mcse_mean": arviz.mcse(data, method="mean")["x"].values.tolist(),
      "min_ess_bulk": float(ess.min()),
      "max_rhat": float(arviz.rhat(data)["x"].values.max()),
      "divergences": int(result.divergences.sum()),
      "sampling_s": result.sampling_s,
      "machine": machine_lib.machine_info(),
  }
  path = FLAGS.output or ess_models.ground_truth_path(model.name)
  with open(path, "w") as f:
    json.dump(payload, f, indent=1)
  print(f"wrote {path}: min bulk ESS {payload['min_ess_bulk']:.0f}, max "
        f"R-hat {payload['max_rhat']:.3f}, {payload['divergences']} "
        "divergences")


if __name__ == "__main__":
  app.run(main)
