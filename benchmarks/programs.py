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
  until it lasts ``--min_run_sec`` (``calls_per_run``).
  ``examples_per_sec = batch_size / median(seconds per call)``.  A warm-up
  call slower than ``--slow_call_sec`` is itself the only timed run
  (``timed_runs: 1``); once one is slower than ``--max_call_sec`` the
  system's larger batch sizes are skipped.

The output JSON is ``{"machine": ..., "config": ..., "records": [...],
"skipped": [...]}``.
"""
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np
import tensorflow as tf

from benchmarks import tfp_reference_programs as tfp_ref

try:
  import tqdm as _tqdm
except ImportError:  # pragma: no cover - tqdm is in the "bench" extra.
  _tqdm = None

# ---------------------------------------------------------------------------
# Our programs.  Defined at module level with the decorator, as a user would.
# If the package is missing or cannot convert them, its systems are skipped.
# ---------------------------------------------------------------------------

TAB_ERROR = None
OUR_PROGRAMS = {}
try:
  import tfp_autobatch as tab
except Exception as e:  # pylint: disable=broad-except
  tab = None
  TAB_ERROR = "cannot import tfp_autobatch: {!r}".format(e)

if tab is not None:
  try:

    @tab.batch(max_stack_depth=tfp_ref.DEFAULT_MAX_STACK_DEPTH["fib"])
    def fib(n):
      if n <= 1:
        return n
      return fib(n - 1) + fib(n - 2)

    @tab.batch(max_stack_depth=tfp_ref.DEFAULT_MAX_STACK_DEPTH["collatz"])
    def collatz(n):
      steps = tf.zeros_like(n)
      while n != 1:
        if n % 2 == 0:
          n = n // 2
        else:
          n = 3 * n + 1
        steps += 1
      return steps

    OUR_PROGRAMS = {"fib": fib, "collatz": collatz}
  except Exception as e:  # pylint: disable=broad-except
    TAB_ERROR = "tfp_autobatch cannot decorate the programs: {!r}".format(e)

# Inputs: name -> (low, high) for n uniform in [low, high).
DEFAULT_RANGES = {"fib": (5, 15), "collatz": (1, 1000)}
INPUT_DTYPE = np.int32
PROGRAMS = tuple(DEFAULT_RANGES)
DEFAULT_SYSTEMS = ("local:eager", "local:eager_xla", "pc:xla",
                   "tfp_reference:graph", "tfp_reference:xla", "python_loop")
# Ratios printed when both systems were measured.
RATIO_PAIRS = (("pc:xla", "tfp_reference:xla"),
               ("pc:graph", "tfp_reference:graph"))


class SkipSystem(Exception):
  """A system cannot run this program (unknown, failed, too slow)."""


def make_inputs(program, size, seed=0, ranges=None):
  """`size` inputs for `program`, the same for all systems given the seed."""
  low, high = (ranges or DEFAULT_RANGES)[program]
  rng = np.random.default_rng([seed, PROGRAMS.index(program)])
  return rng.integers(low, high, size=size).astype(INPUT_DTYPE)


def available_backends():
  """Our backend names, or () when the package is unavailable."""
  if tab is None:
    return ()
  return tuple(getattr(tab, "BACKENDS", ()))


# ---------------------------------------------------------------------------
# Systems: each becomes `call(xs: np.ndarray) -> np.ndarray`.
# ---------------------------------------------------------------------------

def _to_numpy(value):
  if hasattr(value, "numpy"):
    return value.numpy()
  return np.asarray(value)


def _our_callable(program, backend):
  if TAB_ERROR is not None:
    raise SkipSystem(TAB_ERROR)
  if backend not in available_backends():
    raise SkipSystem(
        "backend {!r} is not in tfp_autobatch.BACKENDS {}".format(
            backend, list(available_backends())))
  fn = OUR_PROGRAMS[program]

  def call(xs):
    return _to_numpy(fn(xs, backend=backend))
  return call


def _stats_summary(stats):
  """A JSON-able summary of `fn.last_stats` (whatever its form)."""
  if stats is None:
    return None
  out = {}
  for key in ("batch_size", "steps", "active_members", "max_stack_depth",
              "mean_active", "utilization"):
    try:
      value = getattr(stats, key)
    except Exception:  # pylint: disable=broad-except
      continue
    try:
      value = _to_numpy(value).item()
    except Exception:  # pylint: disable=broad-except
      value = str(value)
    out[key] = value
  if not out:
    out["repr"] = str(stats)
  return out


def _system_kind(system):
  if system == "python_loop":
    return "python_loop"
  if system.startswith("tfp_reference:"):
    return "tfp_reference"
  return "ours"


def _make_callable(program, system):
  kind = _system_kind(system)
  if kind == "tfp_reference":
    mode = system.split(":", 1)[1]
    if mode not in tfp_ref.MODES:
      raise SkipSystem("unknown tfp_reference mode {!r}; modes: {}".format(
          mode, list(tfp_ref.MODES)))
    return tfp_ref.make_tfp_reference(program, mode)
  return _our_callable(program, system)


# ---------------------------------------------------------------------------
# Timing.
# ---------------------------------------------------------------------------

def time_batched(call, xs, repeats, min_run_sec, max_calls_per_run,
                 slow_call_sec=float("inf")):
  """First call, warm-up, then `repeats` timed runs of `call(xs)`.

  Returns `(first output, first-call seconds, [seconds per call, one per
  timed run], calls per run)`.  When the warm-up call itself takes longer
  than `slow_call_sec`, it is the only timed run (repeating calls that long
  buys little precision and a lot of time).
  """
  start = time.perf_counter()
  first_out = call(xs)
  first_call_sec = time.perf_counter() - start

  start = time.perf_counter()
  call(xs)
  warm_sec = time.perf_counter() - start
  if warm_sec > slow_call_sec:
    return first_out, first_call_sec, [warm_sec], 1

  calls_per_run = int(min(max_calls_per_run, max(
      1, math.ceil(min_run_sec / max(warm_sec, 1e-6)))))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(calls_per_run):
      call(xs)
    times.append((time.perf_counter() - start) / calls_per_run)
  return first_out, first_call_sec, times, calls_per_run


def _time_python_loop(program, xs, repeats, slow_call_sec=float("inf")):
  """Per-example loop over `xs` with `fn.run_unbatched` (eager TF).

  Returns `(outputs, first pass seconds, [seconds per timed pass])`; when the
  first pass takes longer than `slow_call_sec` only one pass is timed.
  """
  if TAB_ERROR is not None:
    raise SkipSystem(TAB_ERROR)
  fn = OUR_PROGRAMS[program]
  if not hasattr(fn, "run_unbatched"):
    raise SkipSystem("tfp_autobatch functions have no run_unbatched")
  examples = [tf.constant(x) for x in xs]

  def one_pass():
    return np.array([_to_numpy(fn.run_unbatched(e)) for e in examples],
                    dtype=xs.dtype)

  start = time.perf_counter()
  first_out = one_pass()
  first_pass_sec = time.perf_counter() - start
  times = []
  for _ in range(1 if first_pass_sec > slow_call_sec else repeats):
    start = time.perf_counter()
    one_pass()
    times.append(time.perf_counter() - start)
  return first_out, first_pass_sec, times


def _progress(total, enabled):
  if enabled and _tqdm is not None:
    return _tqdm.tqdm(total=total, desc="benchmark", unit="run",
                      file=sys.stderr, dynamic_ncols=True)
  return None


def run_benchmarks(programs=PROGRAMS, systems=DEFAULT_SYSTEMS,
                   batch_sizes=(1, 4, 16, 64, 256, 1024), repeats=3, seed=0,
                   ranges=None, python_loop_cap=64, min_run_sec=0.05,
                   max_calls_per_run=100, max_call_sec=60.0,
                   slow_call_sec=5.0, progress=True, log=None):
  """Runs the benchmark; returns `(records, skipped)`.

  Args:
    programs: program names (see `PROGRAMS`).
    systems: system names (see the module docstring).
    batch_sizes: batch sizes, measured in increasing order.
    repeats: timed runs per measurement (the median is reported).
    seed: input seed.
    ranges: `{program: (low, high)}` overriding `DEFAULT_RANGES`.
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
  ranges = dict(DEFAULT_RANGES, **(ranges or {}))
  batch_sizes = sorted(set(int(b) for b in batch_sizes))
  bar = _progress(len(programs) * len(systems) * len(batch_sizes), progress)
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

  for program in programs:
    if program not in PROGRAMS:
      raise ValueError("unknown program {!r}; programs: {}".format(
          program, list(PROGRAMS)))
    pool = make_inputs(program, max(batch_sizes), seed, ranges)
    for system in systems:
      kind = _system_kind(system)
      if bar is not None:
        bar.set_postfix_str("{} {}".format(program, system))
      try:
        call = None if kind == "python_loop" else _make_callable(program,
                                                                 system)
      except SkipSystem as e:
        skip(program, system, None, str(e), len(batch_sizes))
        continue
      python_loop_cache = {}
      for i, batch_size in enumerate(batch_sizes):
        xs = pool[:batch_size]
        expected = tfp_ref.plain_python(program, xs)
        record = {"program": program, "system": system,
                  "batch_size": batch_size, "repeats": repeats}
        try:
          if kind == "python_loop":
            n_timed = min(batch_size, python_loop_cap)
            if n_timed not in python_loop_cache:
              python_loop_cache[n_timed] = _time_python_loop(
                  program, xs[:n_timed], repeats, slow_call_sec)
            out, first_sec, pass_times = python_loop_cache[n_timed]
            per_call = [t / n_timed * batch_size for t in pass_times]
            record.update(
                first_call_sec=first_sec, calls_per_run=1,
                examples_timed=n_timed,
                extrapolated=batch_size > n_timed,
                note=("per-example eager loop over the first {} examples; "
                      "rate extrapolated to the batch".format(n_timed)
                      if batch_size > n_timed else
                      "per-example eager loop; first_call_sec is the first "
                      "pass"))
            correct = bool(np.array_equal(out, expected[:n_timed]))
          else:
            out, first_sec, per_call, calls_per_run = time_batched(
                call, xs, repeats, min_run_sec, max_calls_per_run,
                slow_call_sec)
            record.update(first_call_sec=first_sec,
                          calls_per_run=calls_per_run,
                          examples_timed=batch_size, extrapolated=False)
            correct = bool(out.shape == expected.shape and
                           np.array_equal(out, expected))
        except SkipSystem as e:
          skip(program, system, batch_size, str(e), len(batch_sizes) - i)
          break
        except Exception as e:  # pylint: disable=broad-except
          reason = "failed: {}: {}".format(
              type(e).__name__, str(e).strip().splitlines()[0][:300]
              if str(e).strip() else "")
          skip(program, system, batch_size, reason, len(batch_sizes) - i)
          if os.environ.get("BENCH_TRACEBACK"):
            log(traceback.format_exc())
          break
        median = statistics.median(per_call)
        record.update(
            timed_runs=len(per_call),
            examples_per_sec=batch_size / median,
            seconds_per_call=median,
            times_sec=per_call,
            correct=correct)
        if kind == "ours":
          record["max_stack_depth"] = getattr(OUR_PROGRAMS[program],
                                              "max_stack_depth", None)
          record["stats"] = _stats_summary(
              getattr(OUR_PROGRAMS[program], "last_stats", None))
        elif kind == "tfp_reference":
          record["max_stack_depth"] = tfp_ref.DEFAULT_MAX_STACK_DEPTH[program]
        if not correct:
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
          break
  if bar is not None:
    bar.close()
  return records, skipped


# ---------------------------------------------------------------------------
# Reporting.
# ---------------------------------------------------------------------------

def _cpu_model():
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.lower().startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _git_commit():
  try:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root,
                          capture_output=True, text=True, timeout=10,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root,
                           capture_output=True, text=True, timeout=10,
                           check=True).stdout.strip()
    return head + ("+dirty" if dirty else "")
  except Exception:  # pylint: disable=broad-except
    return None


def machine_info():
  """A description of the machine and software versions."""
  import tensorflow_probability as tfp  # pylint: disable=g-import-not-at-top
  try:
    affinity = len(os.sched_getaffinity(0))
  except AttributeError:
    affinity = os.cpu_count()
  try:
    load = os.getloadavg()
  except OSError:
    load = None
  return {
      "cpu_model": _cpu_model(),
      "cpu_count": os.cpu_count(),
      "usable_cores": affinity,
      "load_average_at_start": load,
      "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
      "platform": platform.platform(),
      "python": platform.python_version(),
      "tensorflow": tf.__version__,
      "tensorflow_probability": tfp.__version__,
      "numpy": np.__version__,
      "tfp_autobatch_backends": list(available_backends()),
      "git_commit": _git_commit(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
  }


def write_json(path, machine, config, records, skipped):
  """Writes the results (atomically) to `path`."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  payload = {"machine": machine, "config": config, "records": records,
             "skipped": skipped}
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(payload, f, indent=1, sort_keys=False)
    f.write("\n")
  os.replace(tmp, path)


def _fmt_rate(value):
  if value is None:
    return "-"
  if value >= 100:
    return "{:,.0f}".format(value)
  return "{:.3g}".format(value)


def format_table(records, systems=None):
  """A readable table: examples/sec (first-call seconds) per system."""
  if not records:
    return "(no measurements)"
  if systems is None:
    systems = []
    for r in records:
      if r["system"] not in systems:
        systems.append(r["system"])
  by_key = {(r["program"], r["batch_size"], r["system"]): r for r in records}
  programs = []
  for r in records:
    if r["program"] not in programs:
      programs.append(r["program"])
  header = ["program", "batch"] + list(systems)
  rows = []
  for program in programs:
    sizes = sorted({r["batch_size"] for r in records
                    if r["program"] == program})
    for size in sizes:
      row = [program, str(size)]
      for system in systems:
        r = by_key.get((program, size, system))
        if r is None:
          row.append("-")
        else:
          cell = "{} ({:.2f}s)".format(_fmt_rate(r["examples_per_sec"]),
                                       r["first_call_sec"])
          if r.get("extrapolated"):
            cell += "*"
          if not r.get("correct", True):
            cell += " WRONG"
          row.append(cell)
      rows.append(row)
  widths = [max(len(h), *(len(row[i]) for row in rows))
            for i, h in enumerate(header)]
  lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)),
           "  ".join("-" * w for w in widths)]
  lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
  legend = "cells: examples/sec after warm-up (first-call seconds)"
  if any(r.get("extrapolated") for r in records):
    legend += "; * = python_loop rate extrapolated from its capped examples"
  lines.append(legend)
  return "\n".join(lines)


def format_ratios(records, pairs=RATIO_PAIRS):
  """Ratios of examples/sec, e.g. pc:xla / tfp_reference:xla."""
  by_key = {(r["program"], r["batch_size"], r["system"]): r for r in records}
  lines = []
  for ours, theirs in pairs:
    keys = sorted({(p, b) for (p, b, s) in by_key if s == ours} &
                  {(p, b) for (p, b, s) in by_key if s == theirs})
    if not keys:
      continue
    lines.append("examples/sec ratio {} / {}:".format(ours, theirs))
    for program, size in keys:
      a = by_key[(program, size, ours)]["examples_per_sec"]
      b = by_key[(program, size, theirs)]["examples_per_sec"]
      lines.append("  {:<8} batch {:>5}: {:8.2f}x".format(program, size,
                                                           a / b))
  return "\n".join(lines)


def plot(records, path):
  """Examples/sec against batch size, one panel per program."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  programs = []
  for r in records:
    if r["program"] not in programs:
      programs.append(r["program"])
  if not programs:
    return
  fig, axes = plt.subplots(1, len(programs), figsize=(6 * len(programs), 4.5),
                           squeeze=False)
  for ax, program in zip(axes[0], programs):
    systems = []
    for r in records:
      if r["program"] == program and r["system"] not in systems:
        systems.append(r["system"])
    for system in systems:
      rs = sorted((r for r in records
                   if r["program"] == program and r["system"] == system),
                  key=lambda r: r["batch_size"])
      style = "--" if system == "python_loop" else (
          ":" if system.startswith("tfp_reference") else "-")
      ax.plot([r["batch_size"] for r in rs],
              [r["examples_per_sec"] for r in rs], style, marker="o",
              label=system)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("examples / second")
    ax.set_title(program)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)


def benchmark(programs=PROGRAMS, systems=DEFAULT_SYSTEMS,
              batch_sizes=(1, 4, 16, 64, 256, 1024), repeats=3, seed=0,
              output=None, plot_path=None, progress=True, ranges=None,
              **kwargs):
  """Runs, prints and saves the benchmark; returns the JSON payload.

  Arguments are those of `run_benchmarks`, plus `output` (JSON path or None)
  and `plot_path` (PNG path or None).
  """
  ranges = dict(DEFAULT_RANGES, **(ranges or {}))
  machine = machine_info()
  config = {"programs": list(programs), "systems": list(systems),
            "batch_sizes": sorted(set(int(b) for b in batch_sizes)),
            "repeats": repeats, "seed": seed,
            "input_ranges": {p: list(ranges[p]) for p in programs},
            "input_dtype": np.dtype(INPUT_DTYPE).name,
            "tfp_reference_max_stack_depth": dict(
                tfp_ref.DEFAULT_MAX_STACK_DEPTH),
            "command": " ".join([os.path.basename(sys.executable)] +
                                sys.argv)}
  config.update({k: v for k, v in kwargs.items() if k != "log"})
  if tab is None or TAB_ERROR is not None:
    print("NOTE: {}; its systems will be skipped.".format(TAB_ERROR))
  records, skipped = run_benchmarks(programs, systems, batch_sizes, repeats,
                                    seed, ranges=ranges, progress=progress,
                                    **kwargs)
  print()
  print("Machine: {} ({} usable cores), TF {}, TFP {}, {}".format(
      machine["cpu_model"], machine["usable_cores"], machine["tensorflow"],
      machine["tensorflow_probability"], machine["date"]))
  print(format_table(records, [s for s in systems
                               if any(r["system"] == s for r in records)]))
  ratios = format_ratios(records)
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
    write_json(output, machine, config, records, skipped)
    print("\nwrote {}".format(output))
  if plot_path and records:
    plot(records, plot_path)
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
  flags.DEFINE_list("programs", list(PROGRAMS), "Programs to run.",
                    flag_values=fv)
  flags.DEFINE_list("backends", list(DEFAULT_SYSTEMS),
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
  flags.DEFINE_list("fib_range", [str(v) for v in DEFAULT_RANGES["fib"]],
                    "fib inputs: n in [low, high).", flag_values=fv)
  flags.DEFINE_list("collatz_range",
                    [str(v) for v in DEFAULT_RANGES["collatz"]],
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
  if len(argv) > 1:
    raise SystemExit("unexpected arguments: {}".format(argv[1:]))
  from absl import flags  # pylint: disable=g-import-not-at-top
  run_from_flags(flags.FLAGS)


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  define_flags()
  app.run(main)
