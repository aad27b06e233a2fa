r"""Gathering vs masking in the local static runtime: which runs faster.

    python -m benchmarks.local_strategies --batch_sizes=16,256 \
        --output=benchmarks/results/local_strategies.json

Times examples/second of fib and collatz under both ways of running a block
on a subset of the batch, for eager and XLA-compiled blocks, after warm-up.
"""
import json
import time

from absl import app
from absl import flags
import numpy as np

from benchmarks import programs_systems
from benchmarks import quiet
from tfp_autobatch import api
from tfp_autobatch import pipeline
from tfp_autobatch.runtime import local_static
from tfp_autobatch.runtime import vectorize

FLAGS = flags.FLAGS
flags.DEFINE_list("batch_sizes", ["16", "256"], "Batch sizes.")
flags.DEFINE_integer("repeats", 3, "Timed runs (median is reported).")
flags.DEFINE_string("output", None, "JSON file for the results.")


fib = programs_systems.OUR_PROGRAMS["fib"]
collatz = programs_systems.OUR_PROGRAMS["collatz"]

PROGRAMS = {
    "fib": (fib, lambda rng, b: rng.integers(5, 12, b).astype(np.int32)),
    "collatz": (collatz, lambda rng, b: rng.integers(1, 300, b).astype(np.int32)),
}


def measure(fn, x, strategy, jit_compile, repeats):
  args, arg_types, size = api._prepare(fn, (x,))  # pylint: disable=protected-access
  runtime = local_static.LocalStaticRuntime(
      pipeline.typed_program(fn, arg_types),
      vectorize.KernelCache(jit_compile=jit_compile), 64, strategy=strategy,
      bucket=jit_compile)
  runtime.run(args, size)   # warm-up: traces and compiles
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    np.asarray(runtime.run(args, size))
    times.append(time.perf_counter() - start)
  return size / float(np.median(times))


def main(argv):
  quiet.silence_peers()
  del argv
  rng = np.random.default_rng(0)
  records = []
  print(f"{'program':8} {'batch':>6} {'execution':10} {'gather ex/s':>12} "
        f"{'mask ex/s':>12}")
  for name, (fn, make) in PROGRAMS.items():
    for b in map(int, FLAGS.batch_sizes):
      x = make(rng, b)
      for jit in (False, True):
        rates = {s: measure(fn, x, s, jit, FLAGS.repeats)
                 for s in ("gather", "mask")}
        execution = "xla" if jit else "eager"
        print(f"{name:8} {b:6d} {execution:10} {rates['gather']:12.1f} "
              f"{rates['mask']:12.1f}")
        records.append(dict(program=name, batch_size=b, execution=execution,
                            **{f"{s}_examples_per_sec": r
                               for s, r in rates.items()}))
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump(records, f, indent=1)


if __name__ == "__main__":
  app.run(main)
