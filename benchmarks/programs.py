r"""Benchmark: autobatched recursive and looping programs, ours against peers.

Usage:

  python -m benchmarks.programs --programs=fib,collatz \
      --backends=local:eager,local:eager_xla,pc:xla,tfp_reference:graph,tfp_reference:xla,python_loop \
      --batch_sizes=1,4,16,64,256,1024 --output=benchmarks/results/programs.json \
      [--plot=benchmarks/results/programs.png] [--repeats=3]

Programs (one example each, written as plain Python with TF ops):

- ``fib(n)``: naive doubly recursive Fibonacci.  Inputs ``n`` uniform in
  ``[5, 15)`` (``--fib_range``): the call tree of ``fib(n)`` has
  ``2 fib(n+1) - 1`` calls (1,219 at ``n = 14``), so the per-example Python
  loop stays affordable and one batched run takes at most ~1,000 VM steps.
- ``collatz(n)``: number of steps of ``while n != 1: n = n/2 or 3n+1`` until
  ``n == 1``.  Inputs ``n`` uniform in ``[1, 1000)`` (``--collatz_range``):
  0 to 178 iterations, a long-tailed divergent loop.

Systems (``--backends``):

- ``<strategy>:<execution>`` (any name in ``tfp_autobatch.BACKENDS``, e.g.
  ``local:eager``, ``local:eager_xla``, ``pc:graph``, ``pc:xla``): our
  package.  Names the installed package does not know are skipped with a
  message.
- ``tfp_reference:<mode>`` (``graph``, ``xla``, ``eager``, ``numpy``): TFP's
  original autobatching, called through its public API
  (`benchmarks.tfp_reference_programs`).
- ``python_loop``: a Python loop over the examples calling
  ``fn.run_unbatched(tf.constant(n_i))``, i.e. the original function on one
  example in eager TensorFlow.  Only the first ``--python_loop_cap`` examples
  are timed; the rate is per example and is reported (``extrapolated: true``)
  for larger batches too.

Every system gets the same inputs (the first ``batch_size`` of a pool drawn
once with ``--seed``), and every result is checked against plain Python
(``correct`` in the records).  Max stack depths are the same for ours and
TFP's reference (``tfp_reference_programs.DEFAULT_MAX_STACK_DEPTH``).

Measurements, per program x system x batch size:

- ``first_call_sec``: wall time of the first call with this system and batch
  size in this process (tracing, vectorisation, XLA compilation, and, at the
  first batch size of a program, the conversion of Python to IR; TFP's
  reference is rebuilt in a fresh ``Context`` for each system so it pays its
  conversion there too).  For ``python_loop`` it is the first pass over the
  timed examples.
- one warm-up call, then ``--repeats`` timed runs; a run repeats the call
  until it lasts ``--min_run_sec`` (``calls_per_run``).  At each batch size
  the systems' runs are interleaved, one run of each per round (every
  system's first and warm-up calls come first), so that the machine's
  slow stretches (its speed moved by up to 2x within minutes on 2 shared
  cores) fall on every system alike, not on whichever ran through them.
  ``examples_per_sec = batch_size / median(seconds per call)``.  A warm-up
  call slower than ``--slow_call_sec`` is itself the only timed run
  (``timed_runs: 1``); once one is slower than ``--max_call_sec`` the
  system's larger batch sizes are skipped.

The output JSON is ``{"machine": ..., "config": ..., "records": [...],
"skipped": [...]}``.
"""
import math
import os
import statistics
import sys
import time
import traceback

import numpy as np

from benchmarks import machine as machine_lib
from benchmarks import programs_report
from benchmarks import programs_systems
from benchmarks import progress as progress_lib
from benchmarks import quiet
from benchmarks import tfp_reference_programs as tfp_ref

# ---------------------------------------------------------------------------
# Timing.
# ---------------------------------------------------------------------------

def warm_up(call, xs, min_run_sec, max_calls_per_run,
            slow_call_sec=float("inf")):
  """First call and one warm-up call of `call(xs)`.

  Returns `(first output, first-call seconds, calls per timed run, [seconds
  of the warm-up call] if that call is slower than `slow_call_sec` (it is
  then the only timed run: repeating calls that long buys little precision
  and a lot of time), else None)`.
  """
  start = time.perf_counter()
  first_out = call(xs)
  first_call_sec = time.perf_counter() - start

  start = time.perf_counter()
  call(xs)
  warm_sec = time.perf_counter() - start
  if warm_sec > slow_call_sec:
    return first_out, first_call_sec, 1, [warm_sec]
  calls_per_run = int(min(max_calls_per_run, max(
      1, math.ceil(min_run_sec / max(warm_sec, 1e-6)))))
  return first_out, first_call_sec, calls_per_run, None


def timed_run(call, xs, calls_per_run):
  """Seconds per call of one timed run: `calls_per_run` calls of
  `call(xs)`."""
  start = time.perf_counter()
  for _ in range(calls_per_run):
    call(xs)
  return (time.perf_counter() - start) / calls_per_run


def time_batched(call, xs, repeats, min_run_sec, max_calls_per_run,
                 slow_call_sec=float("inf")):
  """First call, warm-up, then `repeats` timed runs of `call(xs)` (see
  `warm_up`).

  Returns `(first output, first-call seconds, [seconds per call, one per
  timed run], calls per run)`.
  """
  first_out, first_call_sec, calls_per_run, times = warm_up(
      call, xs, min_run_sec, max_calls_per_run, slow_call_sec)
  if times is None:
    times = [timed_run(call, xs, calls_per_run) for _ in range(repeats)]
  return first_out, first_call_sec, times, calls_per_run


def _keep_stats(record, program, kind):
  """Our systems' run statistics of the call just made, into `record`
  (their batched function keeps only its last call's, and the systems'
  calls are interleaved)."""
  if kind == "ours":
    fn = programs_systems.OUR_PROGRAMS[program]
    record["max_stack_depth"] = getattr(fn, "max_stack_depth", None)
    record["stats"] = programs_systems.stats_summary(
        getattr(fn, "last_stats", None))


def run_benchmarks(programs=programs_systems.PROGRAMS,
                   systems=programs_systems.DEFAULT_SYSTEMS,
                   batch_sizes=(1, 4, 16, 64, 256, 1024), repeats=3, seed=0,
                   ranges=None, python_loop_cap=64, min_run_sec=0.05,
                   max_calls_per_run=100, max_call_sec=60.0,
                   slow_call_sec=5.0, progress=True, log=None):
  """Runs the benchmark; returns `(records, skipped)`.

  Args:
    programs: program names (see `programs_systems.PROGRAMS`).
    systems: system names (see the module docstring).
    batch_sizes: batch sizes, measured in increasing order.
    repeats: timed runs per measurement (the median is reported).
    seed: input seed.
    ranges: `{program: (low, high)}` overriding
      `programs_systems.DEFAULT_RANGES`.
    python_loop_cap: `python_loop` times at most this many examples.
    min_run_sec: a timed run repeats the call until it lasts this long.
    max_calls_per_run: ... but at most this many calls.
    max_call_sec: once a warm call of a system takes longer than this, its
      larger batch sizes are skipped.
    slow_call_sec: a warm-up call longer than this is the only timed run
      (`timed_runs` is then 1).
    progress: show a tqdm progress bar.
    log: `print`-like function for messages (default: tqdm-safe print).

  Returns:
    records: list of dicts, one per program x system x batch size measured.
    skipped: list of `{program, system, batch_size, reason}` dicts.
  """
  ranges = dict(programs_systems.DEFAULT_RANGES, **(ranges or {}))
  batch_sizes = sorted(set(int(b) for b in batch_sizes))
  bar = progress_lib.progress_bar(
      len(programs) * len(systems) * len(batch_sizes), progress,
      "benchmark", "run")
  if log is None:
    log = bar.write if bar is not None else print
  records, skipped = [], []

  def skip(program, system, batch_size, reason, count=1):
    skipped.append({"program": program, "system": system,
                    "batch_size": batch_size, "reason": reason})
    log("SKIP {} on {}{}: {}".format(
        system, program,
        "" if batch_size is None else " (batch size {}+)".format(batch_size),
        reason))
    if bar is not None:
      bar.update(count)

  def failed(e):
    if os.environ.get("BENCH_TRACEBACK"):
      log(traceback.format_exc())
    return "failed: {}: {}".format(
        type(e).__name__, str(e).strip().splitlines()[0][:300]
        if str(e).strip() else "")

  for program in programs:
    if program not in programs_systems.PROGRAMS:
      raise ValueError("unknown program {!r}; programs: {}".format(
          program, list(programs_systems.PROGRAMS)))
    pool = programs_systems.make_inputs(program, max(batch_sizes), seed,
                                        ranges)
    calls = {}   # the systems still running: name -> callable (None: loop)
    for system in systems:
      try:
        calls[system] = (
            None if programs_systems.system_kind(system) == "python_loop"
            else programs_systems.make_callable(program, system))
      except programs_systems.SkipSystem as e:
        skip(program, system, None, str(e), len(batch_sizes))
    python_loop_cache = {}
    for i, batch_size in enumerate(batch_sizes):
      xs = pool[:batch_size]
      expected = tfp_ref.plain_python(program, xs)
      # Every system's first call and warm-up, then their timed runs
      # interleaved, one run of each per round: a slow stretch of the
      # machine then slows all of them, not the one that ran through it.
      cells = {}   # system -> (record, calls per timed run or None, times)
      for system in list(calls):
        kind = programs_systems.system_kind(system)
        if bar is not None:
          bar.set_postfix_str("{} {} x{}".format(program, system, batch_size))
        record = {"program": program, "system": system,
                  "batch_size": batch_size, "repeats": repeats}
        try:
          if kind == "python_loop":
            n_timed = min(batch_size, python_loop_cap)
            if n_timed not in python_loop_cache:
              python_loop_cache[n_timed] = programs_systems.time_python_loop(
                  program, xs[:n_timed], repeats, slow_call_sec)
            out, first_sec, pass_times = python_loop_cache[n_timed]
            record.update(
                first_call_sec=first_sec, calls_per_run=1,
                examples_timed=n_timed,
                extrapolated=batch_size > n_timed,
                note=("per-example eager loop over the first {} examples; "
                      "rate extrapolated to the batch".format(n_timed)
                      if batch_size > n_timed else
                      "per-example eager loop; first_call_sec is the first "
                      "pass"),
                correct=bool(np.array_equal(out, expected[:n_timed])))
            cells[system] = (record, None,
                             [t / n_timed * batch_size for t in pass_times])
          else:
            out, first_sec, calls_per_run, single = warm_up(
                calls[system], xs, min_run_sec, max_calls_per_run,
                slow_call_sec)
            record.update(first_call_sec=first_sec,
                          calls_per_run=calls_per_run,
                          examples_timed=batch_size, extrapolated=False,
                          correct=bool(out.shape == expected.shape and
                                       np.array_equal(out, expected)))
            cells[system] = (record, None if single else calls_per_run,
                             single or [])
            _keep_stats(record, program, kind)
        except programs_systems.SkipSystem as e:
          skip(program, system, batch_size, str(e), len(batch_sizes) - i)
          del calls[system]
        except Exception as e:  # pylint: disable=broad-except
          skip(program, system, batch_size, failed(e), len(batch_sizes) - i)
          del calls[system]
      for _ in range(repeats):
        for system, (record, calls_per_run, times) in list(cells.items()):
          if calls_per_run is None:
            continue
          try:
            times.append(timed_run(calls[system], xs, calls_per_run))
          except Exception as e:  # pylint: disable=broad-except
            skip(program, system, batch_size, failed(e), len(batch_sizes) - i)
            del calls[system], cells[system]
            continue
          _keep_stats(record, program, programs_systems.system_kind(system))
      for system, (record, _, per_call) in cells.items():
        kind = programs_systems.system_kind(system)
        median = statistics.median(per_call)
        record.update(
            timed_runs=len(per_call),
            examples_per_sec=batch_size / median,
            seconds_per_call=median,
            times_sec=per_call)
        if kind == "tfp_reference":
          record["max_stack_depth"] = tfp_ref.DEFAULT_MAX_STACK_DEPTH[program]
        if not record["correct"]:
          log("WRONG RESULTS: {} on {} at batch size {}".format(
              system, program, batch_size))
        records.append(record)
        if bar is not None:
          bar.update(1)
        # (python_loop's cost stops growing at its cap: never cut it.)
        if (median > max_call_sec and i + 1 < len(batch_sizes) and
            kind != "python_loop"):
          skip(program, system, batch_sizes[i + 1],
               "a warm call took {:.1f}s > --max_call_sec={}".format(
                   median, max_call_sec), len(batch_sizes) - i - 1)
          del calls[system]
  if bar is not None:
    bar.close()
  return records, skipped


def benchmark(programs=programs_systems.PROGRAMS,
              systems=programs_systems.DEFAULT_SYSTEMS,
              batch_sizes=(1, 4, 16, 64, 256, 1024), repeats=3, seed=0,
              output=None, plot_path=None, progress=True, ranges=None,
              **kwargs):
  """Runs, prints and saves the benchmark; returns the JSON payload.

  Arguments are those of `run_benchmarks`, plus `output` (JSON path or None)
  and `plot_path` (PNG path or None).
  """
  ranges = dict(programs_systems.DEFAULT_RANGES, **(ranges or {}))
  machine = machine_lib.machine_info()
  config = {"programs": list(programs), "systems": list(systems),
            "batch_sizes": sorted(set(int(b) for b in batch_sizes)),
            "repeats": repeats, "seed": seed,
            "input_ranges": {p: list(ranges[p]) for p in programs},
            "input_dtype": np.dtype(programs_systems.INPUT_DTYPE).name,
            "tfp_reference_max_stack_depth": dict(
                tfp_ref.DEFAULT_MAX_STACK_DEPTH),
            "command": " ".join([os.path.basename(sys.executable)] +
                                sys.argv)}
  config.update({k: v for k, v in kwargs.items() if k != "log"})
  if (programs_systems.tab is None or
      programs_systems.TAB_ERROR is not None):
    print("NOTE: {}; its systems will be skipped.".format(
        programs_systems.TAB_ERROR))
  records, skipped = run_benchmarks(programs, systems, batch_sizes, repeats,
                                    seed, ranges=ranges, progress=progress,
                                    **kwargs)
  print()
  print("Machine: {} ({} usable cores), TF {}, TFP {}, {}".format(
      machine["cpu_model"], machine["usable_cores"], machine["tensorflow"],
      machine["tensorflow_probability"], machine["date"]))
  print(programs_report.format_table(
      records, [s for s in systems
                if any(r["system"] == s for r in records)]))
  ratios = programs_report.format_ratios(records)
  if ratios:
    print()
    print(ratios)
  if skipped:
    print()
    print("Skipped:")
    for s in skipped:
      print("  {} on {}{}: {}".format(
          s["system"], s["program"],
          "" if s["batch_size"] is None else
          " from batch size {}".format(s["batch_size"]), s["reason"]))
  if output:
    programs_report.write_json(output, machine, config, records, skipped)
    print("\nwrote {}".format(output))
  if plot_path and records:
    programs_report.plot(records, plot_path)
    print("wrote {}".format(plot_path))
  return {"machine": machine, "config": config, "records": records,
          "skipped": skipped}


# ---------------------------------------------------------------------------
# Command line.  Flags are defined only when run as a program, so importing
# this module (tests, the demo) defines none.
# ---------------------------------------------------------------------------

def define_flags(flag_values=None):
  """Defines the command-line flags (on `flag_values`, default absl's)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  fv = flags.FLAGS if flag_values is None else flag_values
  flags.DEFINE_list("programs", list(programs_systems.PROGRAMS),
                    "Programs to run.", flag_values=fv)
  flags.DEFINE_list("backends", list(programs_systems.DEFAULT_SYSTEMS),
                    "Systems: tfp_autobatch backends (strategy:execution), "
                    "tfp_reference:<graph|xla|eager|numpy>, python_loop.",
                    flag_values=fv)
  flags.DEFINE_list("batch_sizes", ["1", "4", "16", "64", "256", "1024"],
                    "Batch sizes.", flag_values=fv)
  flags.DEFINE_integer("repeats", 3, "Timed runs per measurement (median).",
                       flag_values=fv)
  flags.DEFINE_integer("seed", 0, "Seed of the inputs.", flag_values=fv)
  flags.DEFINE_string("output", "benchmarks/results/programs.json",
                      "Where to write the JSON results ('' for nowhere).",
                      flag_values=fv)
  flags.DEFINE_string("plot", "", "Where to write a PNG plot ('' for none).",
                      flag_values=fv)
  flags.DEFINE_integer("python_loop_cap", 64,
                       "python_loop times at most this many examples.",
                       flag_values=fv)
  flags.DEFINE_float("min_run_sec", 0.05,
                     "A timed run repeats the call until it lasts this long.",
                     flag_values=fv)
  flags.DEFINE_integer("max_calls_per_run", 100,
                       "At most this many calls in a timed run.",
                       flag_values=fv)
  flags.DEFINE_float("max_call_sec", 60.0,
                     "Skip a system's larger batches once a warm call takes "
                     "longer than this.", flag_values=fv)
  flags.DEFINE_float("slow_call_sec", 5.0,
                     "A warm-up call longer than this is the only timed run.",
                     flag_values=fv)
  ranges = programs_systems.DEFAULT_RANGES
  flags.DEFINE_list("fib_range", [str(v) for v in ranges["fib"]],
                    "fib inputs: n in [low, high).", flag_values=fv)
  flags.DEFINE_list("collatz_range", [str(v) for v in ranges["collatz"]],
                    "collatz inputs: n in [low, high).", flag_values=fv)
  flags.DEFINE_boolean("progress", True, "Show a progress bar.",
                       flag_values=fv)
  return fv


def run_from_flags(fv):
  """Runs the benchmark as configured by parsed flags `fv`."""
  ranges = {"fib": tuple(int(v) for v in fv.fib_range),
            "collatz": tuple(int(v) for v in fv.collatz_range)}
  return benchmark(
      ranges=ranges, programs=fv.programs, systems=fv.backends,
      batch_sizes=[int(b) for b in fv.batch_sizes], repeats=fv.repeats,
      seed=fv.seed, output=fv.output or None, plot_path=fv.plot or None,
      progress=fv.progress, python_loop_cap=fv.python_loop_cap,
      min_run_sec=fv.min_run_sec, max_calls_per_run=fv.max_calls_per_run,
      max_call_sec=fv.max_call_sec, slow_call_sec=fv.slow_call_sec)


def main(argv):
  quiet.silence_peers()
  if len(argv) > 1:
    raise SystemExit("unexpected arguments: {}".format(argv[1:]))
  from absl import flags  # pylint: disable=g-import-not-at-top
  run_from_flags(flags.FLAGS)


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  define_flags()
  app.run(main)
