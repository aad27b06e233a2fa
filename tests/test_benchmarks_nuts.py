"""Tests of the NUTS benchmark (`benchmarks/nuts*.py`) and the NUTS demo.

The smoke test runs every system once at a tiny size and checks the JSON;
no timing is asserted.  The problem tests compare the targets with NumPy
(deterministic: false-failure rate 0).
"""
import functools
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import nuts as nuts_bench
from benchmarks import nuts_measure
from benchmarks import nuts_problems
from benchmarks import nuts_report
from benchmarks import nuts_run
from benchmarks import nuts_stan
from benchmarks import nuts_systems

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Tiny problems: 3 dimensions, 20 data points; a step size that keeps
# trajectories short on them.
TINY = dict(num_dims=3, num_data=20, step_size=0.1, max_tree_depth=6)


def _tiny_settings(**overrides):
  """Stepper settings for the tiny problems: one chain unbatched, one
  leapfrog per `limit` call."""
  return nuts_systems.Settings(
      step_size=0.1, max_tree_depth=6, unrolled_leapfrog_steps=1,
      num_trajectories_per_step=1, seed=0, trace_kernel=True,
      unbatched_cap=1, limit_leapfrogs=1)._replace(**overrides)


def _has_pystan():
  try:
    import stan  # pylint: disable=g-import-not-at-top,unused-import
    return True
  except ImportError:
    return False


def test_logistic_regression_matches_numpy():
  problem = nuts_problems.make_problem("logistic_regression", num_dims=3,
                                       num_data=20, seed=1)
  x = np.asarray(problem.stan_data["x"])
  y = np.asarray(problem.stan_data["y"])
  w = np.random.default_rng(0).standard_normal((4, 3))
  logits = w @ x.T
  expected = (np.sum(y * logits - np.logaddexp(0, logits), -1)
              - 0.5 * np.sum(w**2, -1))
  got = problem.target_log_prob(tf.constant(w, tf.float32)).numpy()
  np.testing.assert_allclose(got, expected, rtol=1e-4)
  # One state (no chain dimension) works too, as the kernels need.
  np.testing.assert_allclose(
      problem.target_log_prob(tf.constant(w[0], tf.float32)).numpy(),
      expected[0], rtol=1e-4)
  # Starts: deterministic, the same first rows at any number of chains.
  np.testing.assert_array_equal(problem.initial_state(2),
                                problem.initial_state(5)[:2])
  assert problem.initial_state(2).dtype == np.float32
  assert problem.stan_data["N"] == 20 and problem.stan_data["D"] == 3


def test_correlated_gaussian_matches_numpy():
  problem = nuts_problems.make_problem("correlated_gaussian", num_dims=5)
  precision = np.asarray(problem.stan_data["precision"])
  np.testing.assert_allclose(precision, precision.T, atol=1e-8)
  # Standard deviations log-spaced in [0.1, 1], as documented.
  sds = np.sort(1 / np.sqrt(np.linalg.eigvalsh(precision)))
  np.testing.assert_allclose(sds, np.geomspace(0.1, 1, 5), rtol=1e-6)
  x = problem.initial_state(3).astype(np.float64)
  expected = -0.5 * np.einsum("ni,ij,nj->n", x, precision, x)
  np.testing.assert_allclose(
      problem.target_log_prob(tf.constant(x, tf.float32)).numpy(), expected,
      rtol=1e-4)
  with pytest.raises(ValueError, match="no data"):
    nuts_problems.make_problem("correlated_gaussian", num_data=10)
  with pytest.raises(ValueError, match="unknown problem"):
    nuts_problems.make_problem("eight_schools")


def test_min_ess():
  # Independent draws: the ESS is near the number of draws.  2000 draws of 4
  # chains x 2 dims with a fixed seed: deterministic; the bound holds with
  # a wide margin (false-failure rate under the null < 1e-6).
  draws = np.random.default_rng(3).standard_normal((2000, 4, 2))
  assert 6000 < nuts_measure.min_ess(draws) < 10000
  assert nuts_measure.min_ess(draws[:1]) is None
  assert 1000 < nuts_measure.min_ess(draws[:, :1]) < 3000


@pytest.mark.slow  # one run of every system: ~2-4 min (XLA compilations)
def test_benchmark_runs_every_system(tmp_path):
  output = str(tmp_path / "nuts.json")
  plot_path = str(tmp_path / "nuts.png")
  payload = nuts_bench.benchmark(
      output=output, plot_path=plot_path, problems=("logistic_regression",),
      systems=nuts_systems.SYSTEMS, batch_sizes=(2,), num_results=2,
      num_burnin=2, num_trajectories_per_step=(1,), unbatched_cap=1,
      limit_leapfrogs=4, stan_num_results=5, progress=False, **TINY)
  # The file is a list of records, each with the machine and the run's
  # configuration (skips included).
  with open(output) as f:
    raw = json.load(f)
  assert isinstance(raw, list) and raw
  for r in raw:
    for key in ("cpu_model", "usable_cores", "tensorflow",
                "tensorflow_probability", "date"):
      assert key in r["machine"], key
  saved = nuts_bench.read_json(output)
  assert saved["records"] == json.loads(json.dumps(payload["records"]))

  by_system = {r["system"]: r for r in saved["records"]}
  skipped = {s["system"]: s["reason"] for s in saved["skipped"]}
  expected = set(nuts_systems.SYSTEMS) - (set() if _has_pystan() else
                                          {"stan"})
  assert set(by_system) == expected, skipped
  if not _has_pystan():
    assert skipped == {"stan": nuts_stan.STAN_MISSING}
  else:
    assert not skipped

  for r in saved["records"]:
    for key in nuts_bench.RECORD_KEYS:
      assert key in r, (key, r)
    assert r["problem"] == "logistic_regression" and r["batch_size"] == 2
    assert r["num_trajectories_per_step"] == 1
    for key in ("grads_per_sec", "sec_per_step", "first_call_sec"):
      assert math.isfinite(r[key]) and r[key] > 0, (key, r)
    if r["system"] != "stan":   # Stan's own warm-up: warmup_sec
      # One untimed step after the first call (num_burnin=2), timed apart.
      assert 0 < r["burnin_sec"], r
      if r["system"] != "unbatched":
        # Not folded into the first call. (`unbatched` runs eagerly and
        # compiles nothing, so its first call is one more such step, and
        # on a loaded machine either can take longer.)
        assert r["burnin_sec"] < r["first_call_sec"] + r["timed_sec"], r
    assert 0 < r["utilization"] <= 1, r
    assert r["grads_used"] > 0 and r["grads_computed"] >= r["grads_used"], r
    if r["ess_per_sec"] is not None:   # two draws: ESS may be undefined
      assert math.isfinite(r["ess_per_sec"]) and r["ess_per_sec"] > 0, r
    if r["system"] in ("tfp_reference",) + nuts_systems.LIMITS:
      assert r["accept_rate"] is None, r   # not reported by the system
    else:
      assert 0 <= r["accept_rate"] <= 1, r

  assert by_system["limit"]["utilization"] == 1
  assert by_system["limit"]["grads_used"] == 2 * 4 * 2  # chains x N x steps
  assert by_system["unbatched"]["extrapolated"]  # cap 1 < 2 chains
  assert by_system["unbatched"]["chains_run"] == 1
  assert by_system["tfp_iterative"]["computed_is_estimate"]
  assert not by_system["local:eager"]["computed_is_estimate"]  # exact
  if _has_pystan():
    # Stan warmed up, adapting its step size (with no warm-up Stan sets it
    # to exactly 1, and every transition diverged on the full problem), and
    # only its sampling is timed.
    stan = by_system["stan"]
    assert stan["num_warmup"] > 0 and stan["step_size"] != 1.0, stan
    assert stan["timed_sec"] <= stan["wall_sec"], stan
  assert os.path.getsize(plot_path) > 0


def test_rounds_interleave_the_systems_and_report_the_median_window(
    monkeypatch):
  # Batch size by batch size: every system warms up, then each round times
  # one window of every system in turn, continuing its chains; a system
  # too slow at one size stops there while the others go on.
  calls = []
  make_stepper = nuts_systems.make_stepper

  def logged_stepper(system, problem, settings, init):
    stepper = make_stepper(system, problem, settings, init)
    run_steps = stepper.run_steps

    def logged(first, n):
      calls.append((system, len(init), first))
      return run_steps(first, n)
    stepper.run_steps = logged
    return stepper
  monkeypatch.setattr(nuts_systems, "make_stepper", logged_stepper)
  records, skipped = nuts_run.run_benchmarks(
      systems=("tfp_iterative", "limit"), batch_sizes=(1, 2), num_results=2,
      num_burnin=1, rounds=3, limit_leapfrogs=2, max_step_sec=1e-9,
      progress=False, **TINY)

  # Too slow for max_step_sec: both stop after batch size 1.
  assert [(s["system"], s["batch_size"]) for s in skipped] == [
      ("tfp_iterative", 2), ("limit", 2)]
  assert calls == (
      [("tfp_iterative", 1, 0), ("limit", 1, 0)]          # warm-up
      + [(system, 1, first) for window in range(3)        # the rounds
         for system in ("tfp_iterative", "limit")
         for first in (1 + 2 * window, 2 + 2 * window)])
  assert len(records) == 2
  for r in records:
    assert r["rounds"] == 3 and r["num_results"] == 2, r
    assert len(r["round_grads_per_sec"]) == 3, r
    assert r["grads_per_sec"] == sorted(r["round_grads_per_sec"])[1], r
    assert 0 < r["sec_per_step"] * 2 * 3 < 3 * r["timed_sec"], r
  by_system = {r["system"]: r for r in records}
  # Six timed limit calls of 2 leapfrogs for 1 chain.
  assert by_system["limit"]["grads_used"] == 6 * 2
  assert "the median of 3 timed rounds" in nuts_report.format_table(records)


def test_too_slow_system_stops_while_the_others_go_on(monkeypatch):
  slow = nuts_systems.make_stepper

  def slowed(system, problem, settings, init):
    stepper = slow(system, problem, settings, init)
    if system == "limit":
      run_steps = stepper.run_steps

      def sleepy(first, n):
        time.sleep(0.3)   # a step of 0.3 s; the iterative kernel's: ~1 ms
        return run_steps(first, n)
      stepper.run_steps = sleepy
    return stepper
  monkeypatch.setattr(nuts_systems, "make_stepper", slowed)
  records, skipped = nuts_run.run_benchmarks(
      systems=("tfp_iterative", "limit"), batch_sizes=(1, 2, 3),
      num_results=1, num_burnin=0, limit_leapfrogs=1, max_step_sec=0.2,
      progress=False, **TINY)
  assert [(s["system"], s["batch_size"]) for s in skipped] == [
      ("limit", 2)], skipped
  assert sorted((r["system"], r["batch_size"]) for r in records) == [
      ("limit", 1), ("tfp_iterative", 1), ("tfp_iterative", 2),
      ("tfp_iterative", 3)]


def test_our_step_counts_every_chains_leapfrogs_and_seeds_like_a_tensor():
  """A step of ours reports the leapfrogs of all its chains (summed from
  the kernel results after the step) and is seeded with `[seed, i]`, the
  seed a step inside one compiled call gets."""
  problem = nuts_problems.make_problem("correlated_gaussian", num_dims=3)
  init = problem.initial_state(3)
  settings = _tiny_settings()
  stepper = nuts_systems.make_stepper("pc:graph", problem, settings, init)
  outcome = stepper.step(0)
  results = stepper._carry[1]
  leapfrogs = results.leapfrogs_taken.numpy()
  assert leapfrogs.shape == (3,)
  assert outcome.grads_used == leapfrogs.sum() > leapfrogs.max()
  assert outcome.grads_computed == int(results.num_grads_computed)
  for i in (4, tf.constant(4)):
    np.testing.assert_array_equal(nuts_systems._seed(settings, i),
                                  [settings.seed, 4])


@pytest.mark.slow  # pc:xla compiled twice at a tiny size: ~1 min
def test_steps_in_one_call_are_the_steps_of_one_call_each():
  # `--steps_per_call`: a kernel's steps in one compiled tf.while_loop give
  # the same draws and counts as one call per step, with the same seeds.
  problem = nuts_problems.make_problem("correlated_gaussian", num_dims=3)
  init = problem.initial_state(2)
  for system in ("pc:xla", "tfp_iterative"):
    outcomes = {}
    for per_call in (1, 3):
      settings = _tiny_settings(steps_per_call=per_call)
      stepper = nuts_systems.make_stepper(system, problem, settings, init)
      assert stepper.steps_per_call == per_call
      outcomes[per_call] = [
          out for first in range(0, 6, per_call)
          for out in stepper.run_steps(first, per_call)]
      if per_call == 1:
        continue
      with pytest.raises(ValueError, match="3 steps per call"):
        stepper.run_steps(6, 1)
    one, chained = outcomes[1], outcomes[3]
    assert len(one) == len(chained) == 6
    for a, b in zip(one, chained):
      np.testing.assert_allclose(a.state, b.state, rtol=1e-5, atol=1e-6)
      assert (a.grads_used, a.grads_computed) == (
          b.grads_used, b.grads_computed), system
      np.testing.assert_allclose(a.accept_stat, b.accept_stat, rtol=1e-5)
    # The chains moved.
    assert not np.allclose(one[0].state, one[5].state)


def test_steps_per_call_must_divide_the_steps_and_needs_tracing():
  run = functools.partial(nuts_run.run_benchmarks, systems=("limit",),
                          batch_sizes=(1,), progress=False, **TINY)
  with pytest.raises(ValueError, match="divide --num_results"):
    run(num_results=5, num_burnin=4, steps_per_call=2)
  with pytest.raises(ValueError, match="divide --num_results"):
    run(num_results=4, num_burnin=3, steps_per_call=2)
  with pytest.raises(ValueError, match="needs --trace_kernel"):
    run(num_results=4, num_burnin=4, steps_per_call=2, trace_kernel=False)


def test_a_benchmark_with_steps_per_call_records_them():
  # Eager systems and the limits run one step per call and say so.
  records, skipped = nuts_run.run_benchmarks(
      systems=("tfp_iterative", "local:eager", "limit"), batch_sizes=(2,),
      num_results=4, num_burnin=2, steps_per_call=2, limit_leapfrogs=2,
      progress=False, **TINY)
  assert not skipped
  by_system = {r["system"]: r for r in records}
  assert by_system["tfp_iterative"]["steps_per_call"] == 2
  assert by_system["local:eager"]["steps_per_call"] == 1
  assert "one step per call" in by_system["local:eager"]["note"]
  assert by_system["limit"]["steps_per_call"] == 1
  for r in records:
    assert r["num_results"] == 4 and r["grads_used"] > 0, r
  assert nuts_report.format_steps_per_call(records) == (
      "steps per compiled call: tfp_iterative 2; the others one per call")
  assert nuts_report.format_steps_per_call(
      [dict(r, steps_per_call=1) for r in records]) == ""


def test_limit_logp_computes_the_log_density_that_limit_leaves_out():
  problem = nuts_problems.make_problem("correlated_gaussian", num_dims=3)
  settings = _tiny_settings()
  init = problem.initial_state(2)
  totals = {}
  for system in nuts_systems.LIMITS:
    stepper = nuts_systems.make_stepper(system, problem, settings, init)
    q, grad = stepper._carry   # pylint: disable=protected-access
    q, _, totals[system] = stepper._leapfrogs(   # pylint: disable=protected-access
        q, grad, tf.constant([0, 1]))
  np.testing.assert_array_equal(totals["limit"], [0, 0])
  # One leapfrog: the sum is the log density at its end point.
  np.testing.assert_allclose(totals["limit_logp"], problem.target_log_prob(q),
                             rtol=1e-5)


@pytest.mark.slow  # builds Stan's tiny model: C++ compilation (~1 min)
@pytest.mark.skipif(not _has_pystan(), reason="pystan is not installed")
def test_stan_warms_up_and_times_only_its_sampling():
  # Stan's runs are not seeded (see `nuts_stan.Stan`), so this is
  # random, but after a 200-iteration warm-up on the 3-d problem the mean
  # acceptance of 50 draws is near Stan's target 0.8 and divergences do
  # not happen: the bounds have wide margins.  Without warm-up (the old
  # failure) the step size was 1.0 and the acceptance 0.08 here.
  records, skipped = nuts_run.run_benchmarks(
      systems=("stan",), batch_sizes=(1, 4), stan_num_results=50,
      stan_num_warmup=200, progress=False, **TINY)
  assert not skipped, skipped
  assert [r["batch_size"] for r in records] == [1, 4]
  assert records[1]["extrapolated"] and not records[0]["extrapolated"]
  for r in records:
    assert r["num_warmup"] == 200 and r["num_results"] == 50, r
    assert 0.5 < r["accept_rate"] < 1, r
    assert r["divergences"] == 0, r
    assert r["initial_step_size"] == TINY["step_size"], r
    assert math.isfinite(r["step_size"]) and r["step_size"] > 0, r
    assert r["step_size"] not in (1.0, TINY["step_size"]), r   # adapted
    # Gradients: the sampling draws' leapfrog steps, at least one each.
    assert r["grads_used"] == r["grads_computed"] >= 50, r
    assert r["grads_per_sec"] == r["grads_used"] / r["timed_sec"], r
    # Timed by Stan's sampling clock (at least its 1 ms tick), not the
    # whole call (warm-up and pystan's round trips).
    assert nuts_measure.STAN_CLOCK_TICK_SEC <= r["timed_sec"] <= r["wall_sec"]
    assert 0 <= r["warmup_sec"] <= r["wall_sec"], r


def test_stan_clock_is_read_from_its_output():
  # The lines as Stan 2.3x in pystan 3.10 writes them (logger topic).
  outputs = (
      b'{"version":1,"topic":"logger","values":["info: Elapsed Time: '
      b'2.344 seconds (Warm-up)"]}\n'
      b'{"version":1,"topic":"logger","values":["info:               '
      b'2.064 seconds (Sampling)"]}\n'
      b'{"version":1,"topic":"logger","values":["info:               '
      b'4.408 seconds (Total)"]}\n',)
  assert nuts_stan.stan_elapsed(outputs) == (2.344, 2.064)
  with pytest.raises(RuntimeError, match="Elapsed Time"):
    nuts_stan.stan_elapsed((b"no timing here",))


def test_stan_needs_warm_up():
  with pytest.raises(ValueError, match="stan_num_warmup"):
    nuts_run.run_benchmarks(systems=("stan",), batch_sizes=(1,),
                            stan_num_warmup=0, progress=False, **TINY)


def test_stan_is_skipped_with_a_clear_message_without_pystan(monkeypatch):
  monkeypatch.setitem(sys.modules, "stan", None)   # `import stan` fails
  records, skipped = nuts_run.run_benchmarks(
      systems=("stan",), batch_sizes=(1,), progress=False, **TINY)
  assert records == []
  assert [s["reason"] for s in skipped] == [nuts_stan.STAN_MISSING]
  assert "pip install" in nuts_stan.STAN_MISSING


def _records():
  base = dict(problem="logistic_regression", utilization=1.0,
              sec_per_step=0.1, first_call_sec=1.0, accept_rate=0.9,
              ess_per_sec=5.0, num_trajectories_per_step=1)
  return [
      dict(base, system="pc:xla", batch_size=4, grads_per_sec=3000.0),
      dict(base, system="tfp_reference", batch_size=4, grads_per_sec=1500.0),
      dict(base, system="pc:xla", batch_size=4, grads_per_sec=2000.0,
           num_trajectories_per_step=10, utilization=0.8),
      dict(base, system="limit", batch_size=4, grads_per_sec=6000.0,
           accept_rate=None, ess_per_sec=None),
      dict(base, system="unbatched", batch_size=4, grads_per_sec=30.0,
           extrapolated=True),
  ]


def test_reporting(tmp_path):
  records = _records()
  table = nuts_report.format_table(records)
  assert "3,000 (1.00)" in table and "30 (1.00)*" in table
  assert "pc:xla k=10" in table and "2,000 (0.80)" in table
  details = nuts_report.format_details(records)
  assert "limit" in details and " - " in details
  ratios = nuts_report.format_ratios(records)
  assert "/ tfp_reference" in ratios and "2.00x" in ratios
  assert "0.50x" in ratios   # pc:xla over limit
  targets = nuts_report.format_targets(records)
  assert targets == [
      "  pc:xla >= 1.5x tfp_reference from 1 chains: met (4 chains 2.00x)",
      "  pc:xla k=10 >= 1.5x tfp_reference from 1 chains: NOT met "
      "(4 chains 1.33x)"]
  # Each of our settings is held against the peer's best setting.
  fused_peer = dict(records[1], num_trajectories_per_step=10)
  assert nuts_report.format_targets(
      records + [dict(fused_peer, grads_per_sec=1000.0)]) == targets
  assert nuts_report.format_targets(
      records + [dict(fused_peer, grads_per_sec=2500.0)])[0].endswith(
          "NOT met (4 chains 1.20x)")
  assert "NOT met (4 chains 0.50x)" in nuts_report.format_targets(
      records, targets=(("limit", 0.6, 4),))[0]
  # A ratio that two decimals would round onto the target gets three.
  close = [dict(r, grads_per_sec=3000.0 / 0.5987) if r["system"] == "limit"
           else r for r in records]
  assert "NOT met (4 chains 0.599x)" in nuts_report.format_targets(
      close, targets=(("limit", 0.6, 4),))[0]
  path = str(tmp_path / "plot.png")
  nuts_report.plot(records, path)
  assert os.path.getsize(path) > 0


def test_command_line_and_replot(tmp_path, capsys):
  """The absl flags drive a run; --from_json re-reports and re-plots it."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  output = str(tmp_path / "cli.json")
  fv = nuts_bench.define_flags(flags.FlagValues())
  fv(["nuts", "--systems=limit", "--batch_sizes=2,1", "--num_results=2",
      "--num_dims=3", "--num_data=20", "--limit_leapfrogs=3", "--rounds=2",
      "--progress=false", "--output=" + output])
  nuts_bench.run_from_flags(fv)
  payload = nuts_bench.read_json(output)
  assert [r["batch_size"] for r in payload["records"]] == [1, 2]
  assert [r["rounds"] for r in payload["records"]] == [2, 2]
  assert payload["config"]["step_size"] is None
  assert all(r["step_size"] == 0.012 for r in payload["records"])

  plot_path = str(tmp_path / "replot.png")
  fv = nuts_bench.define_flags(flags.FlagValues())
  fv(["nuts", "--from_json=" + output, "--plot=" + plot_path])
  capsys.readouterr()
  nuts_bench.run_from_flags(fv)
  assert "limit" in capsys.readouterr().out
  assert os.path.getsize(plot_path) > 0

  with pytest.raises(ValueError, match="unknown system"):
    nuts_run.run_benchmarks(systems=("pc:nope",), progress=False)


@pytest.mark.slow  # a subprocess: TensorFlow import and one XLA compile
def test_demo_passes_flags_through(tmp_path):
  output = str(tmp_path / "demo.json")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.demo", "--noess", "--systems=limit",
       "--batch_sizes=2", "--num_results=2", "--num_dims=3", "--num_data=20",
       "--progress=false", "--output=" + output, "--plot="],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
      check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "demo finished" in result.stdout
  with open(output) as f:
    records = json.load(f)
  assert [(r["system"], r["batch_size"]) for r in records] == [("limit", 2)]


def test_vm_steps_benchmark_counts_steps_of_one_fixed_transition():
  from benchmarks import nuts_vm_steps
  problem = nuts_problems.make_problem("correlated_gaussian", num_dims=3)
  record = nuts_vm_steps.measure(problem, chains=2, num_trajectories=1,
                                 repeats=2, backend="pc:graph", warmup=1)
  assert record["warmup"] == 1
  assert record["vm_steps"] > 0 and record["leapfrogs"] > 0
  # Each leapfrog is in a leaf step, and one leaf step serves both chains.
  assert record["vm_steps"] >= record["leapfrogs"] / 2
  # Every leapfrog of every chain is one chain's row in one model call.
  calls = {int(k): n for k, n in record["chains_per_model_call"].items()}
  assert sum(k * n for k, n in calls.items()) == record["leapfrogs"]
  assert record["model_calls"] == sum(n for k, n in calls.items() if k)
  assert set(calls) <= {0, 1, 2}
  assert 0 < record["min_sec"] <= record["median_sec"]
  # The ops of the VM's loops and blocks, which are functions of their own,
  # are counted with the step's.
  transition = nuts_vm_steps.fixed_transition(problem, 2, 1, "pc:graph")
  transition.run()
  outer = len(transition.concrete().graph.as_graph_def().node)
  assert record["traced_ops"] > 3 * outer > 0
  assert record["us_per_vm_step"] == pytest.approx(
      record["median_sec"] / record["vm_steps"] * 1e6)


def test_vm_steps_benchmark_times_the_same_transition_with_chains_unknown():
  """--chains_known_at_trace=false traces the step for any number of
  chains (pc:xla's batch-size-agnostic trace): the same transition."""
  from benchmarks import nuts_vm_steps
  problem = nuts_problems.make_problem("correlated_gaussian", num_dims=3)
  known, unknown = (
      nuts_vm_steps.measure(problem, chains=2, num_trajectories=1, repeats=1,
                            backend="pc:xla", warmup=0,
                            chains_known_at_trace=known)
      for known in (True, False))
  assert (known["chains_known_at_trace"],
          unknown["chains_known_at_trace"]) == (True, False)
  assert known["leapfrogs"] == unknown["leapfrogs"] > 0
  assert known["vm_steps"] == unknown["vm_steps"]


def test_vm_steps_benchmark_times_the_same_transition_compiled_whole():
  """--jit_compile traces the transition in a jit_compile tf.function (as
  users are advised to run sample_chain): the same transition."""
  from benchmarks import nuts_vm_steps
  problem = nuts_problems.make_problem("correlated_gaussian", num_dims=3)
  plain, whole = (
      nuts_vm_steps.measure(problem, chains=2, num_trajectories=1, repeats=1,
                            backend="pc:xla", warmup=0, jit_compile=jit)
      for jit in (False, True))
  assert (plain["jit_compile"], whole["jit_compile"]) == (False, True)
  assert plain["leapfrogs"] == whole["leapfrogs"] > 0
  assert plain["vm_steps"] == whole["vm_steps"]
  transition = nuts_vm_steps.fixed_transition(problem, 2, 1, "pc:xla",
                                              jit_compile=True)
  np.testing.assert_allclose(transition.run().target_log_prob,
                             transition.run_eagerly().target_log_prob,
                             rtol=1e-5)


def test_vm_steps_benchmark_takes_an_ess_model_and_times_tfp_beside(
    capsys):
  """--model takes an ESS benchmark model from its starts and --step_size
  sets the step; --tfp adds tfp.mcmc.NoUTurnSampler's transition from the
  same state, compared per lockstep leapfrog (its trajectories are not
  ours)."""
  from absl import flags
  from benchmarks import ess_models
  from benchmarks import nuts_vm_steps
  fv = flags.FlagValues()
  nuts_vm_steps.define_flags(fv)
  fv(["prog", "--model=eight_schools", "--step_size=0.25",
      "--batch_sizes=2", "--repeats=1", "--warmup=0", "--backend=pc:graph",
      "--tfp"])
  ours, theirs = nuts_vm_steps.run_from_flags(fv)
  model = ess_models.make_model("eight_schools")
  assert (ours["problem"], ours["num_dims"]) == ("eight_schools",
                                                 model.num_dims)
  assert (ours["backend"], theirs["backend"]) == ("pc:graph", "tfp")
  for record in (ours, theirs):
    assert record["batch_size"] == 2
    assert 0 < record["max_leapfrogs"] <= record["leapfrogs"]
    assert record["us_per_max_leapfrog"] == pytest.approx(
        record["median_sec"] / record["max_leapfrogs"] * 1e6)
  assert "vm_steps" not in theirs
  assert "ours / TFP's" in capsys.readouterr().out
  problem = nuts_vm_steps.problem_from_flags(fv)
  assert problem.step_size == 0.25
  np.testing.assert_array_equal(problem.initial_state(3),
                                ess_models.initial_state(model, 3, 0))
  fv.num_dims = 4
  with pytest.raises(ValueError, match="has its own size"):
    nuts_vm_steps.problem_from_flags(fv)


def test_profile_charges_every_kernel_to_a_block_the_loop_or_around(
    tmp_path, capsys):
  """benchmarks.nuts_profile (driven by its flags): the profiled kernels
  are charged to the VM's blocks by their place in the compiled HLO, and
  what it reports agrees with the run statistics of the same transition."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from benchmarks import nuts_profile
  output = str(tmp_path / "profile.json")
  fv = nuts_profile.define_flags(flags.FlagValues())
  fv(["nuts_profile", "--num_dims=3", "--batch_size=2", "--warmup=0",
      "--repeats=2", "--top=5", "--output=" + output])
  returned = nuts_profile.run_from_flags(fv)
  text = capsys.readouterr().out
  with open(output) as f:
    record = json.load(f)["record"]
  assert record["kernels"] == returned["kernels"]
  assert (record["problem"], record["batch_size"]) == (
      "correlated_gaussian", 2)
  labels = set(record["blocks"])
  model_blocks = set(record["model_blocks"])
  assert len(labels) == len(record["blocks"]) > len(model_blocks) > 0
  places = {p["place"]: p for p in record["places"]}
  assert set(places) <= labels | {nuts_profile.VM_LOOP,
                                  nuts_profile.AROUND_VM}
  # The blocks' kernels, the loop's (register and stack writes, the
  # schedule) and the model's, each found where it runs.
  assert places[nuts_profile.VM_LOOP]["executions"] == record["vm_steps"]
  assert places[nuts_profile.VM_LOOP]["us_per_transition"] > 0
  assert model_blocks and model_blocks <= set(places)
  # Kernel time lands on exactly the blocks that ran (a branch off by one
  # would charge blocks that never ran), as often as they ran.
  ran = {label: n for label, n in record["block_executions"].items() if n}
  assert sum(ran.values()) == record["vm_steps"]
  assert {p: v["executions"] for p, v in places.items()
          if p in labels} == ran
  assert record["kernel_ms_per_transition"] * 1e3 == pytest.approx(
      sum(k["us_per_transition"] for k in record["kernels"]))
  assert {k["place"] for k in record["kernels"]} == set(places)
  assert f"{record['vm_steps']} VM steps" in text
  assert nuts_profile.VM_LOOP in text and "wrote " + output in text
  # The report lists the --top costliest kernels, the costliest first.
  listed = [line.split()[0] for line in
            text.split("\nkernel ", 1)[1].splitlines()[1:]
            if line.strip() and not line.startswith("wrote ")]
  assert listed == [k["name"] for k in record["kernels"][:5]]


def test_fixed_costs_loop_calls_the_model_once_per_leapfrog_like_update():
  """benchmarks.nuts_fixed_costs times `calls` model calls in one compiled
  loop: each call is on the state the previous gradient moved (so XLA
  cannot hoist it), and the log densities summed are those of the same
  updates made one call at a time."""
  from benchmarks import nuts_fixed_costs
  problem = nuts_problems.make_problem("logistic_regression", num_dims=3,
                                       num_data=20)
  q0 = tf.constant(problem.initial_state(2))
  q, total = nuts_fixed_costs.gradient_loop(problem, calls=4)(q0)
  expected_q, expected_total = q0, tf.zeros([2])
  for _ in range(4):
    logp, grad = nuts_systems.value_and_gradient(problem.target_log_prob,
                                                 expected_q)
    expected_q += nuts_fixed_costs._STEP * grad
    expected_total += logp
  np.testing.assert_allclose(q, expected_q, rtol=1e-5)
  np.testing.assert_allclose(total, expected_total, rtol=1e-5)
  assert not np.allclose(q, q0)
  with pytest.raises(ValueError, match="calls must be at least 1"):
    nuts_fixed_costs.measure_gradient(problem, rows=1, calls=0, warmup=0,
                                      repeats=1)


def test_fixed_costs_benchmark_records_gradient_and_call_per_row_count(
    tmp_path, capsys):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from benchmarks import nuts_fixed_costs
  output = str(tmp_path / "fixed.json")
  fv = nuts_fixed_costs.define_flags(flags.FlagValues())
  fv(["nuts_fixed_costs", "--num_dims=3", "--num_data=20", "--rows=1,3",
      "--calls=5", "--warmup=0", "--repeats=2", "--output=" + output])
  returned = nuts_fixed_costs.run_from_flags(fv)
  with open(output) as f:
    records = json.load(f)["records"]
  assert records == returned
  assert [(r["cost"], r.get("rows", r.get("chains"))) for r in records] == [
      ("gradient", 1), ("call", 1), ("gradient", 3), ("call", 3)]
  for r in records:
    assert 0 < r["min_ms_per_call"] <= r["median_ms_per_call"]
  # The call carries the state and every field of the kernel results.
  import nuts  # pylint: disable=g-import-not-at-top
  problem = nuts_problems.make_problem("logistic_regression", num_dims=3,
                                       num_data=20)
  state = tf.constant(problem.initial_state(1))
  results = nuts.NoUTurnSampler(problem.target_log_prob,
                                0.1).bootstrap_results(state)
  assert records[1]["tensors_in"] == len(tf.nest.flatten((state, results)))
  assert "rows=3: gradient" in capsys.readouterr().out


def test_results_record_the_machine_before_creating_their_file(
    tmp_path, monkeypatch):
  """The machine's description (with the git commit, "+dirty" when the
  tree has untracked files) is taken before the results file exists."""
  from benchmarks import machine as machine_lib
  from benchmarks import nuts_vm_steps
  path = tmp_path / "results.json"
  seen = []
  monkeypatch.setattr(machine_lib, "machine_info",
                      lambda: seen.append(path.exists()) or {"git": "x"})
  nuts_vm_steps.write_results(str(path), records=[1])
  assert seen == [False]
  with open(path) as f:
    assert json.load(f) == {"machine": {"git": "x"}, "records": [1]}


@pytest.mark.slow  # a subprocess: TensorFlow import and an XLA compile
def test_demo_prints_no_tensorflow_warnings(tmp_path):
  """`make demo`'s output is the benchmark's own: no TensorFlow start-up or
  logging lines, no peers' warnings (TFP's complex128 cast in its ESS
  estimator, deprecations) and no progress bars when not on a terminal.
  It leads with the ESS/s part (here a tiny run of our kernel only)."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  ess_output = str(tmp_path / "ess.json")
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.demo",
       "--ess_args=--quick --systems=pc:xla --output=" + ess_output
       + " --plot=",
       "--systems=pc:xla", "--batch_sizes=2",
       "--num_trajectories_per_step=1", "--num_results=2", "--num_burnin=1",
       "--rounds=1", "--num_dims=3", "--num_data=20",
       "--output=" + str(tmp_path / "demo.json"), "--plot="],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
      check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "demo finished" in result.stdout
  assert (result.stdout.index("Part 1: effective samples per second")
          < result.stdout.index("Part 2: gradients per second"))
  with open(ess_output) as f:
    assert [r["system"] for r in json.load(f)["records"]] == ["pc:xla"]
  output = result.stdout + result.stderr
  for noise in ("WARNING", "casting", "deprecat", "oneDNN", "cuda",
                "Ignoring Assert", "it/s", "step/s"):
    assert noise.lower() not in output.lower(), (noise, output)


def test_constant_work_benchmark_compares_two_targets_of_one_density():
  # The rewritten target is the model's density up to a constant, and
  # each target gets a record of ours and one of TFP's kernel.
  from benchmarks import constant_work
  targets = constant_work.problems(num_dims=3, step_size=0.3)
  x = tf.constant(np.random.default_rng(0).standard_normal((5, 3)),
                  tf.float32)
  difference = (targets["model"].target_log_prob(x)
                - targets["inverse factor"].target_log_prob(x)).numpy()
  np.testing.assert_allclose(difference, difference[0], rtol=1e-5)
  records = constant_work.measure(num_dims=3, chains=[2], step_size=0.3,
                                  repeats=1, warmup=0, backend="pc:graph",
                                  jit_compile=False)
  assert [(r["target"], r["backend"]) for r in records] == [
      ("model", "pc:graph"), ("model", "tfp"),
      ("inverse factor", "pc:graph"), ("inverse factor", "tfp")]
  assert all(r["batch_size"] == 2 and r["us_per_max_leapfrog"] > 0
             for r in records)
