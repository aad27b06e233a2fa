"""Smoke test of `benchmarks.programs` at tiny sizes: it runs and reports.

No timing is asserted: only that every system runs (or is skipped with a
reason), gets the right answers, and that the JSON has its fields with
positive values.
"""
import json
import os

import pytest

from benchmarks import programs as bench
from benchmarks import programs_report
from benchmarks import programs_systems
from tfp_autobatch import pipeline

# Small inputs keep the test fast; the programs still recurse and loop.
TINY_RANGES = {"fib": (3, 8), "collatz": (1, 30)}
NOT_A_BACKEND = "pc:not_a_backend"
RECORD_FIELDS = ("program", "system", "batch_size", "examples_per_sec",
                 "first_call_sec", "seconds_per_call", "times_sec", "correct",
                 "repeats", "calls_per_run", "examples_timed", "extrapolated")
MACHINE_FIELDS = ("cpu_model", "cpu_count", "usable_cores", "tensorflow",
                  "tensorflow_probability", "date")


def _ours_available():
  return programs_systems.TAB_ERROR is None


@pytest.mark.slow  # ~15-30 s each: XLA compilations at two batch sizes
@pytest.mark.parametrize("program", programs_systems.PROGRAMS)
def test_benchmark_runs_every_system(program, tmp_path):
  output = str(tmp_path / "programs.json")
  plot_path = str(tmp_path / "programs.png")
  systems = tuple(programs_systems.DEFAULT_SYSTEMS) + (NOT_A_BACKEND,)
  bench.benchmark(programs=(program,), systems=systems, batch_sizes=(1, 2),
                  repeats=1, seed=0, output=output, plot_path=plot_path,
                  progress=False, ranges=TINY_RANGES, python_loop_cap=2,
                  min_run_sec=0.0, max_call_sec=120.0)

  with open(output) as f:
    payload = json.load(f)
  for key in MACHINE_FIELDS:
    assert key in payload["machine"], key
  assert payload["config"]["input_ranges"][program] == list(
      TINY_RANGES[program])

  records = payload["records"]
  for r in records:
    for key in RECORD_FIELDS:
      assert key in r, (key, r)
    assert r["program"] == program
    assert r["examples_per_sec"] > 0, r
    assert r["first_call_sec"] > 0, r
    assert r["seconds_per_call"] > 0, r
    assert all(t > 0 for t in r["times_sec"]), r
    assert r["correct"], r

  skipped = {s["system"]: s for s in payload["skipped"]}
  assert NOT_A_BACKEND in skipped
  assert "not in tfp_autobatch.BACKENDS" in skipped[NOT_A_BACKEND]["reason"] \
      or not _ours_available()

  expected = [s for s in programs_systems.DEFAULT_SYSTEMS
              if _ours_available() or s.startswith("tfp_reference:")]
  for system in expected:
    sizes = sorted(r["batch_size"] for r in records if r["system"] == system)
    assert sizes == [1, 2], (system, sizes, skipped.get(system))
  for system in programs_systems.DEFAULT_SYSTEMS:
    if system not in expected:
      assert system in skipped, system
  assert os.path.getsize(plot_path) > 0


def test_tables_format():
  records = [
      {"program": "fib", "system": "pc:xla", "batch_size": 4,
       "examples_per_sec": 1000.0, "first_call_sec": 2.0, "correct": True},
      {"program": "fib", "system": "tfp_reference:xla", "batch_size": 4,
       "examples_per_sec": 500.0, "first_call_sec": 1.0, "correct": True},
      {"program": "fib", "system": "python_loop", "batch_size": 4,
       "examples_per_sec": 5.0, "first_call_sec": 0.5, "correct": True,
       "extrapolated": True},
  ]
  table = programs_report.format_table(records)
  assert "pc:xla" in table and "1,000 (2.00s)" in table
  assert "5 (0.50s)*" in table
  ratios = programs_report.format_ratios(records)
  assert "pc:xla / tfp_reference:xla" in ratios and "2.00x" in ratios


def test_command_line_flags(tmp_path, capsys):
  """The absl flags parse and drive the run; unknown systems are skipped."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  output = str(tmp_path / "cli.json")
  fv = bench.define_flags(flags.FlagValues())
  fv(["programs", "--programs=collatz",
      "--backends=tfp_reference:graph,{}".format(NOT_A_BACKEND),
      "--batch_sizes=2,1", "--repeats=1", "--collatz_range=1,10",
      "--min_run_sec=0", "--progress=false", "--output=" + output])
  bench.run_from_flags(fv)
  assert NOT_A_BACKEND in capsys.readouterr().out
  with open(output) as f:
    payload = json.load(f)
  assert [r["batch_size"] for r in payload["records"]] == [1, 2]
  assert all(r["examples_per_sec"] > 0 and r["correct"]
             for r in payload["records"])
  assert payload["config"]["input_ranges"]["collatz"] == [1, 10]


def test_timed_runs_are_interleaved_across_systems(monkeypatch):
  """At each batch size every system is warmed up first, then the timed
  runs go round the systems, one run each per round: a slow stretch of the
  machine lands on all of them, not on one."""
  log = []

  def fake_callable(program, system):
    def call(xs):
      log.append((system, len(xs)))
      return bench.tfp_ref.plain_python(program, xs)
    return call

  monkeypatch.setattr(programs_systems, "make_callable", fake_callable)
  systems = ("pc:xla", "tfp_reference:xla")
  records, skipped = bench.run_benchmarks(
      programs=("collatz",), systems=systems, batch_sizes=(2, 3), repeats=3,
      ranges=TINY_RANGES, progress=False, min_run_sec=0.0,
      max_calls_per_run=1)
  assert not skipped
  for size in (2, 3):
    calls = [system for system, n in log if n == size]
    # Two calls each (first and warm-up), then runs of one call in turn.
    assert calls == ["pc:xla"] * 2 + ["tfp_reference:xla"] * 2 + list(
        systems) * 3, calls
  assert [(r["system"], r["batch_size"], r["timed_runs"]) for r in records] \
      == [(s, n, 3) for n in (2, 3) for s in systems]
  assert all(r["correct"] for r in records)


def test_benchmarks_are_not_installed_as_a_package():
  # They run from a checkout; a top-level `benchmarks` in site-packages
  # could shadow a user's own package of that name.
  import importlib.metadata
  top_level = importlib.metadata.distribution("tfp_autobatch").read_text(
      "top_level.txt")
  assert sorted(top_level.split()) == ["nuts", "tfp_autobatch"]


def test_index_checks_benchmark_times_both_reads(tmp_path):
  # The checked and unchecked walks give the same (checked) answers, and
  # every cell is timed in every round.
  from benchmarks import index_checks   # pylint: disable=import-outside-toplevel
  times = index_checks.benchmark(["pc:xla"], [3], rounds=2, calls=1)
  assert sorted(times) == [("pc:xla", 3, "checked"),
                           ("pc:xla", 3, "unchecked")]
  assert all(len(t) == 2 and min(t) > 0 for t in times.values())
  def sites(fn):
    return [site for f in pipeline.convert_program(fn).functions
            for b in f.blocks for op in b.ops if hasattr(op, "code")
            for site in op.code.subscripts]
  assert len(sites(index_checks.walk_checked)) == 1
  assert not sites(index_checks.walk_unchecked)
