r"""Scaling of sharded NUTS chains over the replicas of a MirroredStrategy.

    python -m benchmarks.replicas --replicas=1,2,4 --chains_per_replica=8 \
        --problem=correlated_gaussian --num_dims=20 --draws=20 \
        --output=benchmarks/results/replicas.json

For each replica count r (a fresh process each: TensorFlow fixes its
logical devices when it starts them), r logical CPU devices share the
machine's cores under `tf.distribute.MirroredStrategy`; each replica runs
`--chains_per_replica` chains of `nuts.NoUTurnSampler` with
`experimental_chain_axis_names` (weak scaling: r times the chains), one
`strategy.run` per step, at the problem's fixed step size (no adaptation,
so no cross-replica reduction is timed). After `--burnin` untimed steps
(the first one converts, traces and compiles), `--draws` steps are timed.
Recorded per r: seconds per step, draws and gradients (leapfrog steps of
all chains) per second, and the same for the r*C chains run in one batch
without a strategy (`unsharded_*`, the same draws). Logical devices on one machine share its cores, so
this measures the overhead and the parallelism the strategy's threads find,
not what several GPUs or hosts would give.
"""
import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from benchmarks import ess_replicas
from benchmarks import nuts_problems
import nuts

_REPLICAS = flags.DEFINE_list("replicas", ["1", "2"],
                              "replica counts (logical CPU devices)")
_CHAINS = flags.DEFINE_integer("chains_per_replica", 8, "chains per replica")
_PROBLEM = flags.DEFINE_enum("problem", "correlated_gaussian",
                             ["correlated_gaussian", "logistic_regression"],
                             "model (benchmarks/nuts_problems.py)")
_DIMS = flags.DEFINE_integer("num_dims", 20, "dimension of the state")
_DRAWS = flags.DEFINE_integer("draws", 20, "timed steps")
_BURNIN = flags.DEFINE_integer("burnin", 3, "untimed steps first")
_BACKEND = flags.DEFINE_string("backend", "pc:xla", "tfp_autobatch backend")
_MAX_DEPTH = flags.DEFINE_integer("max_tree_depth", 6, "NUTS tree depth")
_OUTPUT = flags.DEFINE_string("output", None,
                              "JSON file for the records (else stdout)")


def measure(replicas):
  """One record: `replicas` logical CPUs, timed as the module says."""
  ess_replicas.set_logical_cpus(replicas)
  # After the devices are fixed: the problem builds tensors.
  problem = nuts_problems.make_problem(_PROBLEM.value, num_dims=_DIMS.value)
  chains = _CHAINS.value
  init = problem.initial_state(replicas * chains)
  strategy = ess_replicas.mirrored_strategy(replicas)
  kernel = nuts.NoUTurnSampler(
      problem.target_log_prob, problem.step_size,
      max_tree_depth=_MAX_DEPTH.value, backend=_BACKEND.value,
      experimental_chain_axis_names="chains")

  def local_init(context):
    first = context.replica_id_in_sync_group * chains
    return tf.constant(init[first:first + chains])

  state = strategy.experimental_distribute_values_from_function(local_init)
  results = strategy.run(tf.function(kernel.bootstrap_results,
                                     autograph=False), (state,))
  step = tf.function(kernel.one_step, autograph=False)

  def run(first, count):
    nonlocal state, results
    leapfrogs = 0
    for i in range(first, first + count):
      state, results = strategy.run(step, (state, results,
                                           tf.constant([5, i])))
      leapfrogs += sum(int(np.sum(x)) for x in
                       strategy.experimental_local_results(
                           results.leapfrogs_taken))
    return leapfrogs

  start = time.perf_counter()
  run(0, _BURNIN.value)
  warmup_sec = time.perf_counter() - start
  start = time.perf_counter()
  leapfrogs = run(_BURNIN.value, _DRAWS.value)
  seconds = time.perf_counter() - start

  # The same chains in one batch on one device, no strategy: the same
  # draws (global chain indices), timed alike.
  plain = nuts.NoUTurnSampler(problem.target_log_prob, problem.step_size,
                              max_tree_depth=_MAX_DEPTH.value,
                              backend=_BACKEND.value)
  plain_state = tf.constant(init)
  plain_results = plain.bootstrap_results(plain_state)
  plain_step = tf.function(plain.one_step, autograph=False)
  plain_leapfrogs, plain_seconds = 0, 0.
  for i in range(_BURNIN.value + _DRAWS.value):
    start = time.perf_counter()
    plain_state, plain_results = plain_step(plain_state, plain_results,
                                            tf.constant([5, i]))
    taken = int(np.sum(plain_results.leapfrogs_taken))
    if i >= _BURNIN.value:
      plain_seconds += time.perf_counter() - start
      plain_leapfrogs += taken
  return {"replicas": replicas, "chains_per_replica": chains,
          "chains": replicas * chains, "problem": _PROBLEM.value,
          "num_dims": _DIMS.value, "backend": _BACKEND.value,
          "draws": _DRAWS.value, "warmup_sec": warmup_sec,
          "sec_per_step": seconds / _DRAWS.value,
          "draws_per_sec": replicas * chains * _DRAWS.value / seconds,
          "grads_per_sec": leapfrogs / seconds,
          "unsharded_sec_per_step": plain_seconds / _DRAWS.value,
          "unsharded_grads_per_sec": plain_leapfrogs / plain_seconds,
          "cpu_count": os.cpu_count()}


def main(argv):
  del argv
  counts = [int(r) for r in _REPLICAS.value]
  if len(counts) == 1:
    records = [measure(counts[0])]
  else:
    records = []
    flag_args = [a for a in sys.argv[1:]
                 if not a.startswith(("--replicas", "--output"))]
    for count in counts:
      done = subprocess.run(
          [sys.executable, "-m", "benchmarks.replicas",
           f"--replicas={count}"] + flag_args,
          capture_output=True, text=True, check=True)
      records.extend(json.loads(done.stdout.strip().splitlines()[-1]))
  text = json.dumps(records)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      f.write(json.dumps(records, indent=1) + "\n")
  print(text)


if __name__ == "__main__":
  app.run(main)
