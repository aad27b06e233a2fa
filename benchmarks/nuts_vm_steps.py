"""What one NUTS transition costs in VM steps, and what a VM step costs.

    python -m benchmarks.nuts_vm_steps --problem=correlated_gaussian \
        --batch_sizes=1,64 --repeats=25 \
        --output=benchmarks/results/nuts_vm_steps.json

`benchmarks.nuts` measures what users see (gradients per second); this one
takes the program-counter VM apart: for one fixed transition (same state,
same seed, so the same work every time) it reports the VM steps the
transition takes (blocks executed, from the backend's run statistics), the
leapfrog steps it computes, and the fastest and median time of the
transition traced in `tf.function` after `--warmup` untimed ones (XLA
compiled kernels start slow), hence microseconds per VM step, and the
first call's seconds (conversion, tracing and XLA compilation). With
`--num_data` small, the logistic regression's gradient is nearly free and
what remains is the VM's own cost.
"""
import json
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import nuts
from benchmarks import nuts_problems
from benchmarks import programs as bench

FLAGS = flags.FLAGS
flags.DEFINE_enum("problem", "correlated_gaussian", nuts_problems.PROBLEMS,
                  "Target (see benchmarks/nuts_problems.py).")
flags.DEFINE_list("batch_sizes", ["1", "64"], "Numbers of chains.")
flags.DEFINE_integer("num_trajectories_per_step", 1,
                     "Trajectories fused into one transition.")
flags.DEFINE_integer("repeats", 25, "Timed transitions.")
flags.DEFINE_integer("warmup", 10,
                     "Untimed transitions after the first call (XLA-compiled "
                     "kernels run slower for their first few calls).")
flags.DEFINE_integer("num_dims", None, "State dimension (default 100).")
flags.DEFINE_integer("num_data", None,
                     "Logistic regression data points (default 10,000).")
flags.DEFINE_string("backend", "pc:xla", "A pc backend.")
flags.DEFINE_bool("chains_known_at_trace", True,
                  "Trace the transition with the number of chains static "
                  "(as a fixed state gives it); false traces it with that "
                  "dimension unknown, as in a caller's tf.function with "
                  "[None, ...] signatures, where pc:xla runs its trace for "
                  "any batch size instead of one per size.")
flags.DEFINE_string("output", None, "JSON file for the results.")


def _unknown_chains(value, chains):
  """A spec of `value` with its leading dimension unknown where it is
  the chains'."""
  shape = value.shape.as_list()
  if shape and shape[0] == chains:
    shape[0] = None
  return tf.TensorSpec(shape, value.dtype)


def measure(problem, chains, num_trajectories, repeats, backend, warmup=10,
            chains_known_at_trace=True):
  """One record: VM steps and timings of one fixed transition."""
  kernel = nuts.NoUTurnSampler(
      problem.target_log_prob, problem.step_size, backend=backend,
      num_trajectories_per_step=num_trajectories)
  state = tf.constant(problem.initial_state(chains))
  results = kernel.bootstrap_results(state)
  seed = tf.constant([0, 7])
  signature = None
  if not chains_known_at_trace:
    signature = tf.nest.map_structure(lambda x: _unknown_chains(x, chains),
                                      [state, results, seed])
  step = tf.function(lambda state, results, seed: kernel.one_step(
      state, results, seed=seed), input_signature=signature)
  start = time.perf_counter()
  _, out = step(state, results, seed=seed)
  out.target_log_prob.numpy()
  first = time.perf_counter() - start
  for _ in range(warmup):
    step(state, results, seed=seed)[1].target_log_prob.numpy()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    step(state, results, seed=seed)[1].target_log_prob.numpy()
    times.append(time.perf_counter() - start)
  kernel.one_step(state, results, seed=seed)    # eagerly: run statistics
  steps = kernel.last_run_stats.steps
  return {
      "problem": problem.name, "backend": backend, "batch_size": chains,
      "chains_known_at_trace": chains_known_at_trace,
      "num_trajectories_per_step": num_trajectories,
      "num_dims": problem.num_dims, "warmup": warmup,
      "vm_steps": steps,
      "leapfrogs": int(np.sum(out.leapfrogs_taken)),
      "first_call_sec": first,
      "min_sec": min(times), "median_sec": float(np.median(times)),
      "us_per_vm_step": float(np.median(times)) / steps * 1e6,
  }


def main(argv):
  del argv
  sizes = {k: v for k, v in (("num_dims", FLAGS.num_dims),
                             ("num_data", FLAGS.num_data)) if v is not None}
  problem = nuts_problems.make_problem(FLAGS.problem, **sizes)
  records = []
  for chains in [int(b) for b in FLAGS.batch_sizes]:
    r = measure(problem, chains, FLAGS.num_trajectories_per_step,
                FLAGS.repeats, FLAGS.backend, FLAGS.warmup,
                FLAGS.chains_known_at_trace)
    records.append(r)
    print(f"{r['problem']} d={r['num_dims']} chains={chains} "
          f"k={r['num_trajectories_per_step']}: {r['vm_steps']} VM steps, "
          f"{r['leapfrogs']} leapfrogs, median {r['median_sec'] * 1e3:.2f} ms"
          f" (fastest {r['min_sec'] * 1e3:.2f} ms), "
          f"{r['us_per_vm_step']:.1f} us per VM step; first call "
          f"{r['first_call_sec']:.1f} s")
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump({"machine": bench.machine_info(), "records": records}, f,
                indent=1)
    print(f"wrote {FLAGS.output}")


if __name__ == "__main__":
  app.run(main)
