r"""The programs demo: batch two programs written for one example, check, time.

  python -m benchmarks.programs_demo [--batch_sizes=16,256] \
      [--backends=pc:xla,...]
  python -m benchmarks.programs_demo --batch_sizes=8,64 --ir2

(`make demo` runs the NUTS demo, `benchmarks/demo.py`.)

Two single-example programs, a recursive one (``fib``) and a looping one
(``collatz``), are decorated with ``@tab.batch``.  The demo

1. prints their IR (``fn.ir()``; with ``--ir2`` also the lowered IR-2),
2. runs them with every backend in ``tab.BACKENDS`` at each batch size and
   checks the results: at the smallest batch size against the original Python
   function run on each example alone (``fn.run_unbatched``), at larger ones
   against exact integer Python,
3. prints a small timing table (examples/sec after warm-up, first-call
   seconds) per backend and batch size, next to TFP's reference autobatching
   compiled with XLA (``--tfp_reference``).

It exits non-zero if any result is wrong.  Inputs are kept small (fib n in
[3, 10), collatz n in [1, 100)) so that it runs in about two minutes on two
idle cores: a backend whose warm call takes longer than ``--max_call_sec`` is
timed once and not run at larger batch sizes, and each program gets an equal
share of ``--time_budget_sec``, after which its remaining cells are skipped
(compiled backends are timed first, ``pc:eager`` last).
"""
import sys
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import tfp_autobatch as tab
from benchmarks import machine as machine_lib
from benchmarks import programs as bench
from benchmarks import programs_report
from benchmarks import programs_systems
from benchmarks import quiet
from benchmarks import tfp_reference_programs as tfp_ref


# The same two programs the programs benchmark times: fib (recursive) and
# collatz (a data-dependent while loop), each written for one example.
fib = programs_systems.OUR_PROGRAMS["fib"]
collatz = programs_systems.OUR_PROGRAMS["collatz"]
PROGRAMS = {"fib": fib, "collatz": collatz}
RANGES = {"fib": (3, 10), "collatz": (1, 100)}

FLAGS = flags.FLAGS
flags.DEFINE_list("batch_sizes", ["16", "256"], "Batch sizes to time.")
flags.DEFINE_list("backends", None,
                  "Backends to run (default: all of tab.BACKENDS).")
flags.DEFINE_list("programs", list(PROGRAMS), "Programs to run.")
flags.DEFINE_integer("repeats", 2, "Timed runs per cell (median).")
flags.DEFINE_integer("seed", 0, "Seed of the inputs.")
flags.DEFINE_boolean("tfp_reference", True,
                     "Also time TFP's reference autobatching under XLA.")
flags.DEFINE_boolean("ir2", False, "Also print the lowered IR-2.")
flags.DEFINE_float("max_call_sec", 5.0,
                   "A backend whose warm call takes longer than this is "
                   "timed once, and not run at larger batch sizes.")
flags.DEFINE_float("time_budget_sec", 100.0,
                   "Skip the remaining timing cells after this many seconds.")


def _inputs(program, size, seed):
  low, high = RANGES[program]
  rng = np.random.default_rng([seed, list(PROGRAMS).index(program)])
  return rng.integers(low, high, size=size).astype(np.int32)


def _unbatched(fn, xs):
  return np.array([programs_systems._to_numpy(fn.run_unbatched(tf.constant(x)))  # pylint: disable=protected-access
                   for x in xs], dtype=xs.dtype)


def _rule(title):
  print()
  print("=" * 78)
  print(title)
  print("=" * 78)


# Timing order: the compiled backends first (with TFP's reference right after
# pc:xla), the op-by-op debugging backend last, so that a spent time budget
# cuts the least interesting cells.
_ORDER = ("pc:xla", "pc:graph", "local:eager_xla", "local:eager", "pc:eager")


def _ordered(backends):
  return sorted(backends, key=lambda b: (
      _ORDER.index(b) if b in _ORDER else len(_ORDER), backends.index(b)))


def _time_cell(call, xs):
  """(first output, first-call s, median s per warm call, warm runs timed).

  The programs benchmark's timing: one warm call, and if it is not slower
  than --max_call_sec, --repeats timed runs of enough calls for ~20 ms.
  """
  out, first, times, _ = bench.time_batched(
      call, xs, FLAGS.repeats, min_run_sec=0.02, max_calls_per_run=20,
      slow_call_sec=FLAGS.max_call_sec)
  return out, first, float(np.median(times)), len(times)


def run_program(program, backends, batch_sizes, deadline):
  """Checks and times `program`; returns (all correct, timing records).

  At the smallest batch size every backend's first call is compared with
  `fn.run_unbatched` on each example (the original Python function run on
  one example in eager TF); at larger sizes with exact integer Python.
  """
  fn = PROGRAMS[program]
  xs_check = _inputs(program, batch_sizes[0], FLAGS.seed)
  start = time.perf_counter()
  unbatched = _unbatched(fn, xs_check)
  print("{} examples, n = {}".format(len(xs_check), xs_check.tolist()))
  print("run_unbatched, one example at a time ({:.2f}s): {}".format(
      time.perf_counter() - start, unbatched.tolist()))
  systems = _ordered(list(backends))
  if FLAGS.tfp_reference:  # the peer, right after our XLA backend
    at = systems.index("pc:xla") + 1 if "pc:xla" in systems else 0
    systems.insert(at, "tfp_reference:xla")
  ok, records, notes = True, [], []
  for system in systems:
    if system.startswith("tfp_reference:"):
      call = tfp_ref.make_tfp_reference(program, system.split(":", 1)[1])
    else:
      call = lambda xs, b=system: programs_systems._to_numpy(fn(xs, backend=b))  # pylint: disable=protected-access,cell-var-from-loop
    for size in batch_sizes:
      if time.monotonic() > deadline:
        notes.append("time budget spent: {} at batch {}+ not run".format(
            system, size))
        break
      xs = _inputs(program, size, FLAGS.seed)
      try:
        out, first, median, timed = _time_cell(call, xs)
      except Exception as e:  # pylint: disable=broad-except
        print("  {:<18} batch {:>4}: FAILED {}: {}".format(
            system, size, type(e).__name__, e))
        ok = False
        break
      expected = unbatched if size == batch_sizes[0] else (
          tfp_ref.plain_python(program, xs))
      correct = out.shape == expected.shape and np.array_equal(out, expected)
      ok &= correct
      print("  {:<18} batch {:>4}: {} {}".format(
          system, size,
          "OK" if correct else "MISMATCH " + str(out.tolist()),
          "(= run_unbatched)" if size == batch_sizes[0] else
          "(= plain Python)"))
      records.append({
          "program": program, "system": system, "batch_size": size,
          "examples_per_sec": size / median, "first_call_sec": first,
          "correct": bool(correct)})
      if system == "pc:xla" and size == batch_sizes[-1]:
        notes.append("last_stats (pc:xla, batch {}): {}".format(
            size, fn.last_stats))
      if timed == 1:
        notes.append("{} takes {:.1f}s per call at batch {}: timed once, "
                     "larger batches not run".format(system, median, size))
        break
  print()
  print(programs_report.format_table(records))
  for note in notes:
    print("  " + note)
  return ok, records


def main(argv):
  quiet.silence_peers()
  if len(argv) > 1:
    raise app.UsageError("unexpected arguments: {}".format(argv[1:]))
  started = time.monotonic()
  backends = list(FLAGS.backends or tab.BACKENDS)
  unknown = [b for b in backends if b not in tab.BACKENDS]
  if unknown:
    print("Skipping backends unknown to tfp_autobatch: {} (known: {})".format(
        unknown, list(tab.BACKENDS)))
    backends = [b for b in backends if b in tab.BACKENDS]
  batch_sizes = sorted(set(int(b) for b in FLAGS.batch_sizes))
  machine = machine_lib.machine_info()
  print("tfp_autobatch demo on {} ({} cores), TF {}, TFP {}".format(
      machine["cpu_model"], machine["usable_cores"], machine["tensorflow"],
      machine["tensorflow_probability"]))
  print("backends: {}".format(", ".join(backends)))

  all_ok, records = True, []
  for k, program in enumerate(FLAGS.programs):
    fn = PROGRAMS[program]
    _rule("{}: IR-1 (print(fn.ir()))".format(program))
    print(fn.ir())
    _rule("{}: check against per-example Python, and time "
          "(n in [{}, {}))".format(program, *RANGES[program]))
    # Each program gets an equal share of what is left of the budget.
    left = FLAGS.time_budget_sec - (time.monotonic() - started)
    deadline = time.monotonic() + left / (len(FLAGS.programs) - k)
    ok, program_records = run_program(program, backends, batch_sizes,
                                      deadline)
    all_ok &= ok
    records += program_records
    if FLAGS.ir2:
      _rule("{}: IR-2 (print(fn.ir(level=2)), typed by the last call)"
            .format(program))
      try:
        print(fn.ir(level=2))
      except Exception as e:  # pylint: disable=broad-except
        print("IR-2 not available: {}: {}".format(type(e).__name__, e))

  ratios = programs_report.format_ratios(records)
  if ratios:
    print()
    print(ratios)
  print()
  print("demo finished in {:.0f}s: {}".format(
      time.monotonic() - started,
      "all results correct" if all_ok else "SOME RESULTS WRONG"))
  sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
  app.run(main)
