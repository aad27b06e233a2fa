r"""Benchmark: dynamic neural networks written for one example, against DyNet.

    python -m benchmarks.neural --output=benchmarks/results/neural.json \
        --plot=benchmarks/results/neural.png \
        [--workloads=tree_lstm,bilstm_tagger,rnn_classifier] \
        [--batch_sizes=1,4,16,64,256] [--threads=1,2] \
        [--backends=local:eager,local:eager_xla,pc:graph,pc:xla]

Workloads (`examples/`, issue 46): a binary TreeLSTM sentiment classifier,
a BiLSTM tagger and an LSTM sequence classifier, at the DyNet paper's
sizes (embeddings and states of 256, a vocabulary of 10,000) on seeded
synthetic data with its length distributions (`examples/neural_data.py`).

Systems: each of our `--backends`, with the models' cells vectorised with the per-example code
and, named `<backend>+batched_cells`, as `@tab.batched_primitive`s
(`--cells`); `tf_eager`, the per-example plain-TF models one example after
another (the floor; only the first `--eager_cap` examples of a batch are
timed, `extrapolated`); and, if `dynet38` is installed (`pip install
-e .[dynet]`), DyNet with no batching, depth-based and agenda-based
autobatching (`dynet:none`, `dynet:depth`, `dynet:agenda`), each in a
worker process, on the same examples and the same cell math.

Modes: "inference" computes the batch's mean loss; "training" also its
gradient (tf.GradientTape; DyNet's backward) and an Adam update.

Memory: TensorFlow runs with its pooled host allocator
(`--tf_cpu_bfc_allocator`, TF_CPU_ALLOCATOR_USE_BFC=true), as DyNet runs
with its own memory pool: with TensorFlow's default, the arrays of a
training step's XLA programs (tens of MB) are handed back to the system
after each call and faulted in again at the next.

Threads: each of `--threads` runs in a process of its own, TensorFlow
with that many intra- and inter-op threads and the DyNet workers with
OMP_NUM_THREADS and MKL_NUM_THREADS set to it (DyNet's CPU kernels are
Eigen's, single-threaded in the PyPI build, so its numbers hardly move).

Timing, per workload x mode x batch size: each system's first call
(`first_call_sec`: tracing, vectorising, XLA compilation at a new batch
size), one warm-up call that sets `calls_per_run` (enough calls to last
`--min_run_sec`), then `--rounds` rounds in which every system runs once
in turn (interleaved, so the machine's slow stretches fall on all
systems alike). `examples_per_sec = batch_size / median(seconds per
call)`. A system whose warm-up call takes over `--max_call_sec` skips
the larger batch sizes.
"""
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import tensorflow as tf

from benchmarks import machine as machine_lib
from benchmarks import neural_report
from benchmarks import neural_systems as systems_lib

FLAGS = flags.FLAGS
flags.DEFINE_list("workloads", ["tree_lstm", "bilstm_tagger",
                                "rnn_classifier"], "Workloads to run.")
flags.DEFINE_list("modes", ["inference", "training"], "Modes to run.")
flags.DEFINE_list("backends", ["local:eager", "pc:graph", "pc:xla"],
                  "Our backends to time (local:eager_xla compiles each "
                  "segment at each subset size: minutes for the TreeLSTM).")
flags.DEFINE_list("cells", ["per_example", "batched"],
                  "How our models' cells run: vectorised with the "
                  "per-example code, or as @tab.batched_primitives.")
flags.DEFINE_list("batch_sizes", ["1", "4", "16", "64", "256"],
                  "Batch sizes.")
flags.DEFINE_list("threads", ["1", "2"], "Thread counts, one process each.")
flags.DEFINE_list("dynet", ["none", "depth", "agenda"],
                  "DyNet strategies (empty: none; skipped if not installed).")
flags.DEFINE_bool("tf_eager", True, "Time the per-example TF eager floor.")
flags.DEFINE_integer("eager_cap", 8, "Examples of a batch tf_eager times.")
flags.DEFINE_integer("rounds", 3, "Interleaved timed rounds.")
flags.DEFINE_float("min_run_sec", 0.3, "Least seconds of one timed run.")
flags.DEFINE_float("max_call_sec", 20.0,
                   "A slower warm-up call skips larger batches.")
flags.DEFINE_integer("pool_size", 256, "Examples in each workload's pool.")
flags.DEFINE_integer("seed", 0, "Seed of the synthetic data.")
flags.DEFINE_bool("tf_cpu_bfc_allocator", True,
                  "Run TensorFlow with its pooled host allocator "
                  "(TF_CPU_ALLOCATOR_USE_BFC=true; DyNet pools its memory "
                  "too).")
flags.DEFINE_integer("embedding_size", 256, "Word embedding size.")
flags.DEFINE_integer("hidden_size", 256, "LSTM state size.")
flags.DEFINE_integer("vocabulary_size", 10_000, "Vocabulary size.")
flags.DEFINE_string("output", None, "Where to write the JSON results.")
flags.DEFINE_string("plot", None, "Where to write the plot (PNG).")


def _sizes(fv):
  return dict(systems_lib.PAPER_SIZES,
              vocabulary_size=fv.vocabulary_size,
              embedding_size=fv.embedding_size, hidden_size=fv.hidden_size)


def measure(fv, threads):
  """Runs every measurement at one thread count; returns the records."""
  # Before TensorFlow runs its first op (it fixes its pools then).
  tf.config.threading.set_intra_op_parallelism_threads(threads)
  tf.config.threading.set_inter_op_parallelism_threads(threads)
  sizes = _sizes(fv)
  pools = systems_lib.make_pools(sizes, fv.pool_size, fv.seed)
  pools = {w: pools[w] for w in fv.workloads}
  systems = [systems_lib.Ours(b, sizes, pools, cells == "batched")
             for cells in fv.cells for b in fv.backends]
  if fv.tf_eager:
    systems.append(systems_lib.TFEager(sizes, pools, fv.eager_cap))
  skipped = []
  workers = []
  if fv.dynet and not systems_lib.dynet_available():
    skipped.append("dynet: not installed (pip install -e .[dynet])")
  elif fv.dynet:
    data_path = os.path.join(tempfile.mkdtemp(), "pools.npz")
    systems_lib.save_pools(data_path, pools, sizes)
    workers = [systems_lib.DyNet(s, data_path, threads) for s in fv.dynet]
    systems += workers
  records = []
  try:
    for workload in fv.workloads:
      for mode in fv.modes:
        too_slow = set()
        for batch_size in map(int, fv.batch_sizes):
          active = [s for s in systems
                    if s.supports(mode) and s.name not in too_slow]
          records += _measure_point(fv, threads, workload, mode, batch_size,
                                    active, too_slow)
  finally:
    for w in workers:
      w.close()
  return records, skipped


def _measure_point(fv, threads, workload, mode, batch_size, systems,
                   too_slow):
  """First calls, warm-ups, then interleaved rounds, at one batch size."""
  records = {}
  for s in systems:
    first = s.seconds(workload, mode, batch_size, 1)
    warm = s.seconds(workload, mode, batch_size, 1)
    calls = max(1, min(1000, math.ceil(fv.min_run_sec / max(warm, 1e-6))))
    if warm > fv.max_call_sec:
      too_slow.add(s.name)
    records[s.name] = dict(
        workload=workload, mode=mode, system=s.name, batch_size=batch_size,
        threads=threads, first_call_sec=first, warm_call_sec=warm,
        calls_per_run=calls, seconds_per_call=[],
        extrapolated=bool(getattr(s, "extrapolated", lambda b: False)(
            batch_size)))
  for _ in range(fv.rounds):
    for s in systems:
      r = records[s.name]
      r["seconds_per_call"].append(
          s.seconds(workload, mode, batch_size, r["calls_per_run"])
          / r["calls_per_run"])
  for r in records.values():
    r["examples_per_sec"] = batch_size / statistics.median(
        r["seconds_per_call"])
    print(f"[threads {threads}] {workload} {mode} b={batch_size} "
          f"{r['system']}: {r['examples_per_sec']:.1f} examples/s "
          f"(first call {r['first_call_sec']:.2f} s)", file=sys.stderr,
          flush=True)
  return list(records.values())


def _child_flags(fv, threads, output):
  args = [f"--threads={threads}", f"--output={output}"]
  for name in ("workloads", "modes", "backends", "cells", "batch_sizes",
               "dynet"):
    args.append(f"--{name}={','.join(getattr(fv, name))}")
  for name in ("eager_cap", "rounds", "min_run_sec", "max_call_sec",
               "pool_size", "seed", "embedding_size", "hidden_size",
               "vocabulary_size"):
    args.append(f"--{name}={getattr(fv, name)}")
  args.append("--tf_eager" if fv.tf_eager else "--notf_eager")
  args.append("--tf_cpu_bfc_allocator" if fv.tf_cpu_bfc_allocator
              else "--notf_cpu_bfc_allocator")
  return args


def main(argv):
  del argv
  started = time.time()
  machine_lib.use_tf_cpu_bfc_allocator(FLAGS.tf_cpu_bfc_allocator)
  if len(FLAGS.threads) == 1:
    records, skipped = measure(FLAGS, int(FLAGS.threads[0]))
  else:   # TensorFlow fixes its thread pools once: a process per count
    records, skipped = [], []
    for threads in FLAGS.threads:
      with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "part.json")
        subprocess.run([sys.executable, "-m", "benchmarks.neural"]
                       + _child_flags(FLAGS, threads, out), check=True)
        with open(out) as f:
          part = json.load(f)
      records += part["records"]
      skipped += part["skipped"]
  result = {"machine": machine_lib.machine_info(),
            "config": {**_sizes(FLAGS), "flags": {
                k: FLAGS[k].value for k in (
                    "workloads", "modes", "backends", "cells", "batch_sizes",
                    "threads", "dynet", "eager_cap", "rounds",
                    "min_run_sec", "pool_size", "seed",
                    "tf_cpu_bfc_allocator")}},
            "wall_sec": time.time() - started,
            "records": records, "skipped": skipped}
  print(neural_report.table(result))
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump(result, f, indent=1)
  if FLAGS.plot:
    neural_report.plot(result, FLAGS.plot)


if __name__ == "__main__":
  app.run(main)
