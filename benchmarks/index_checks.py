r"""What the subscript checks cost: one program read through a checked
subscript and through an unchecked `tf.gather`, side by side.

    python -m benchmarks.index_checks --backends=pc:xla,pc:graph \
        --batch_sizes=1,64,1024 --rounds=5 \
        --output=benchmarks/results/index_checks.json

`walk(start, n)` follows a table of 1,000 indices `n` times from `start`
(a data-dependent loop of 20 to 99 reads per example) and sums what it
read. `walk_checked` reads with `TABLE[k]`, a subscript the frontend
rewrites into a gather whose index is checked (an index out of range is
`tab.IndexOutOfRangeError` on every backend; see `docs/language.md`,
"Subscripts and slices"); `walk_unchecked` calls `tf.gather(TABLE, k)`,
which is left as the user wrote it. Everything else is the same, so the ratio of
their times is the cost of the checks: the fault records each read
computes, and the one per member that the pc VM carries in its state.

Each round times both functions at every batch size, in turn, `--calls`
calls each after a warm-up; a cell's time is its median round's.
"""
import json
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from benchmarks import machine as machine_lib
from benchmarks import quiet
import tfp_autobatch as tab

FLAGS = flags.FLAGS
flags.DEFINE_list("backends", ["pc:xla", "pc:graph"], "Backends to time.")
flags.DEFINE_list("batch_sizes", ["1", "64", "1024"], "Batch sizes.")
flags.DEFINE_integer("rounds", 5, "Interleaved rounds (median reported).")
flags.DEFINE_integer("calls", 20, "Calls per function and round.")
flags.DEFINE_string("output", None, "JSON file for the results.")

TABLE_SIZE = 1000
# A permutation-like walk: every entry is a valid index into the table.
TABLE = tf.constant((np.arange(TABLE_SIZE) * 7 + 3) % TABLE_SIZE, tf.int32)


@tab.batch
def walk_checked(start, n):
  k = start
  total = tf.zeros_like(start)
  i = 0
  while i < n:
    k = TABLE[k]
    total += k
    i += 1
  return total


@tab.batch
def walk_unchecked(start, n):
  k = start
  total = tf.zeros_like(start)
  i = 0
  while i < n:
    k = tf.gather(TABLE, k)
    total += k
    i += 1
  return total


FUNCTIONS = {"checked": walk_checked, "unchecked": walk_unchecked}


def make_inputs(batch_size, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.integers(0, TABLE_SIZE, batch_size).astype(np.int32),
          rng.integers(20, 100, batch_size).astype(np.int32))


def _expected(start, n):
  table = TABLE.numpy()
  totals = []
  for k, m in zip(start, n):
    total = 0
    for _ in range(m):
      k = table[k]
      total += k
    totals.append(total)
  return np.array(totals)


def _time_calls(fn, args, backend, calls):
  start = time.perf_counter()
  for _ in range(calls):
    fn(*args, backend=backend).numpy()
  return (time.perf_counter() - start) / calls


def benchmark(backends, batch_sizes, rounds, calls):
  """`{(backend, batch size, "checked" or "unchecked"): [seconds a call
  per round]}`, after checking both functions' answers."""
  inputs = {b: make_inputs(b) for b in batch_sizes}
  times = {}
  for backend in backends:
    for b in batch_sizes:
      expected = _expected(*inputs[b])
      for kind, fn in FUNCTIONS.items():
        np.testing.assert_array_equal(fn(*inputs[b], backend=backend),
                                      expected)   # warm-up and check
        times[(backend, b, kind)] = []
  for _ in range(rounds):
    for backend in backends:
      for b in batch_sizes:
        for kind, fn in FUNCTIONS.items():
          times[(backend, b, kind)].append(
              _time_calls(fn, inputs[b], backend, calls))
  return times


def main(argv):
  quiet.silence_peers()
  del argv
  batch_sizes = [int(b) for b in FLAGS.batch_sizes]
  machine = machine_lib.machine_info()
  times = benchmark(FLAGS.backends, batch_sizes, FLAGS.rounds, FLAGS.calls)
  records = []
  print(f"{'backend':10} {'batch':>6} {'checked ms':>11} "
        f"{'unchecked ms':>13} {'ratio':>6}")
  for backend in FLAGS.backends:
    for b in batch_sizes:
      checked = float(np.median(times[(backend, b, "checked")]))
      unchecked = float(np.median(times[(backend, b, "unchecked")]))
      records.append({
          "backend": backend, "batch_size": b,
          "checked_sec_per_call": checked,
          "unchecked_sec_per_call": unchecked,
          "checked_over_unchecked": checked / unchecked,
          "checked_rounds_sec": times[(backend, b, "checked")],
          "unchecked_rounds_sec": times[(backend, b, "unchecked")],
      })
      print(f"{backend:10} {b:6d} {checked * 1e3:11.3f} "
            f"{unchecked * 1e3:13.3f} {checked / unchecked:6.2f}")
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump({"machine": machine, "config": {
          "backends": FLAGS.backends, "batch_sizes": batch_sizes,
          "rounds": FLAGS.rounds, "calls": FLAGS.calls},
                 "records": records}, f, indent=1)
    print(f"wrote {FLAGS.output}")


if __name__ == "__main__":
  app.run(main)
