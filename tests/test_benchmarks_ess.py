"""Smoke tests of the ESS benchmark (`python -m benchmarks.ess`) at tiny size.

No timing or speed is asserted: that it runs both systems through one
harness and writes every field; that the models evaluate and carry ground
truth; and that the measurements are right on draws with known answers.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from benchmarks import ess_first_call
from benchmarks import ess_harness
from benchmarks import ess_models
from benchmarks import ess_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow   # XLA compiles both kernels: ~30 s on 2 idle cores
def test_tiny_benchmark_writes_every_field(tmp_path):
  output, plot = tmp_path / "ess.json", tmp_path / "ess.png"
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  subprocess.run(
      [sys.executable, "-m", "benchmarks.ess", "--quick",
       "--models=correlated_gaussian", "--num_warmup=10", "--num_draws=10",
       "--max_tree_depth=4", "--bucket_float_ops_per_row=0",
       f"--output={output}", f"--plot={plot}"],
      cwd=ROOT, env=env, check=True, timeout=600)
  payload = json.loads(output.read_text())
  assert payload["settings"]["chains"] == ["2"]
  assert payload["settings"]["bucket_float_ops_per_row"] == 0
  records = payload["records"]
  assert [r["system"] for r in records] == ["tfp", "pc:xla"]
  for record in records:
    assert record["num_chains"] == 2 and record["model"] == (
        "correlated_gaussian")
    assert len(record["rounds"]) == 1
    median = record["median"]
    assert set(median) == set(ess_report.ROUND_FIELDS)
    for field in ("first_call_s", "warmup_s", "sampling_s", "min_ess_bulk",
                  "min_ess_per_s", "median_ess_per_s", "max_rhat",
                  "leapfrogs_per_draw", "max_error_mcse", "step_size"):
      assert median[field] > 0, field
    assert median["divergences"] >= 0
  assert plot.stat().st_size > 0


@pytest.mark.nightly   # compiles our kernel on 2 replicas: ~80 s loaded
def test_replicas_flag_shards_our_chains(tmp_path):
  output = tmp_path / "ess.json"
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  subprocess.run(
      [sys.executable, "-m", "benchmarks.ess", "--replicas=2",
       "--systems=pc:xla", "--models=correlated_gaussian", "--chains=4",
       "--num_warmup=4", "--num_draws=6", "--steps_per_call=2",
       "--rounds=1", "--max_tree_depth=3", f"--output={output}", "--plot="],
      cwd=ROOT, env=env, check=True, timeout=600)
  payload = json.loads(output.read_text())
  assert payload["settings"]["replicas"] == 2
  (record,) = payload["records"]
  assert record["replicas"] == 2
  assert record["label"] == "pc:xla on 2 replicas"
  median = record["median"]
  for field in ("sampling_s", "min_ess_bulk", "leapfrogs_per_draw",
                "step_size"):
    assert median[field] > 0, field


@pytest.mark.slow   # a fresh interpreter imports TensorFlow
def test_replicas_flag_refuses_tfp_and_uneven_chains():
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  refused = subprocess.run(
      [sys.executable, "-m", "benchmarks.ess", "--replicas=2",
       "--systems=tfp,pc:xla", "--chains=4", "--output=", "--plot="],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert refused.returncode != 0
  assert "leave 'tfp' out of --systems" in refused.stderr
  uneven = subprocess.run(
      [sys.executable, "-m", "benchmarks.ess", "--replicas=2",
       "--systems=pc:xla", "--chains=3", "--output=", "--plot="],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert uneven.returncode != 0
  assert "cannot be split evenly over --replicas=2" in uneven.stderr


def test_every_model_has_a_finite_target_and_ground_truth():
  for name in ("eight_schools", "correlated_gaussian"):
    model = ess_models.make_model(name)
    init = ess_models.initial_state(model, 3, 0)
    assert init.shape == (3, model.num_dims) and np.all(np.abs(init) <= 2)
    np.testing.assert_array_equal(init, ess_models.initial_state(model, 3, 0))
    log_prob = model.target_log_prob(tf.constant(init))
    assert log_prob.shape == (3,) and np.all(np.isfinite(log_prob))
    truth = model.to_truth(tf.constant(init)).numpy()
    assert truth.shape[-1] == model.truth_mean.shape[0]
    assert model.truth_sd.shape == model.truth_mean.shape
    assert np.all(model.truth_sd > 0)
  assert set(ess_models.GYM_MODELS) <= set(ess_models.MODELS)
  assert len(ess_models.GYM_MODELS) >= 6


def test_metrics_of_independent_draws_with_known_answers():
  rng = np.random.default_rng(0)
  chains, draws, dims = 4, 500, 3
  truth = rng.standard_normal((chains, draws, dims))
  run = ess_harness.RunResult(
      first_call_s=3., repeat_s=1., warmup_s=1., sampling_s=2.,
      draws=truth, leapfrogs=np.full((draws, chains), 7),
      divergences=np.zeros((draws, chains), bool), step_size=0.5)
  numbers = ess_report.metrics(run, truth, np.zeros(dims), np.zeros(dims))
  # Independent draws: ESS near chains * draws (2000), so ESS/s near 1000.
  assert 1500 < numbers["min_ess_bulk"] <= numbers["median_ess_bulk"] < 2600
  assert numbers["median_ess_per_s"] == pytest.approx(
      numbers["median_ess_bulk"] / 2.)
  assert numbers["compile_s"] == 2. and numbers["leapfrogs_per_draw"] == 7.
  assert numbers["max_rhat"] < 1.01
  # Three |N(0, 1)|: above 4.5 with probability < 3e-5.
  assert numbers["max_error_mcse"] < 4.5
  shifted = ess_report.metrics(run, truth, np.full(dims, 0.5), np.zeros(dims))
  assert shifted["max_error_mcse"] > 10
  assert ess_report.aggregate([numbers, shifted])["max_error_mcse"] == (
      pytest.approx((numbers["max_error_mcse"] + shifted["max_error_mcse"])
                    / 2))


def test_first_call_profile_sums_events_by_name_over_threads():
  # `benchmarks.ess_first_call` reads XLA's compiler passes from the
  # profiler's XSpace: seconds per name, summed over planes and threads,
  # an instance's detail after ':' dropped.
  space = xplane_pb2.XSpace()
  for durations in ([2.0, 0.5], [1.0]):
    plane = space.planes.add()
    plane.event_metadata[1].name = "simplify-while-loops"
    plane.event_metadata[2].name = "FusionCompiler:fusion.3"
    line = plane.lines.add()
    for i, seconds in enumerate(durations):
      event = line.events.add()
      event.metadata_id = 1 + i % 2
      event.duration_ps = int(seconds * 1e12)
  assert ess_first_call.event_seconds(space) == {
      "simplify-while-loops": (3.0, 2), "FusionCompiler": (0.5, 1)}


def test_gym_models_sweep_runs_a_model_with_both_kernels_or_says_why_not():
  from benchmarks import gym_models
  names = gym_models.gym_targets()
  assert {"Banana", "IllConditionedGaussian", "EightSchools"} <= set(names)
  assert not {"Model", "BayesianModel", "VectorModel"} & set(names)
  record = gym_models.run_one("Banana", chains=2, num_warmup=10,
                              num_draws=10, systems=("tfp", "pc:graph"))
  assert record["num_dims"] == 2
  for system in ("tfp", "pc:graph"):
    assert record[system]["finite"], record
    assert record[system]["max_error_in_sd"] >= 0
    assert record[system]["first_call_s"] > 0
  assert "Banana (2-d): tfp first call" in gym_models.summary(record)
  # A target that needs constructor arguments is skipped, with the reason,
  # also through the process that runs each model.
  skipped, = gym_models.run_all(["LogisticRegression"], chains=2,
                                num_warmup=10, num_draws=10, timeout_s=300)
  assert skipped["model"] == "LogisticRegression"
  assert "TypeError" in skipped["skipped"]
  assert gym_models.summary(skipped).startswith("LogisticRegression: skipped")
