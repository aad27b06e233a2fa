"""NUTS chains split over the replicas of `tf.distribute` strategies, built on
one machine as a cluster is: logical CPU devices for MirroredStrategy, two
worker processes on localhost for MultiWorkerMirroredStrategy. Each
configuration runs in processes of its own (`tests/distributed_runs.py`).
"""
import json
import os
import socket
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import nuts
from nuts import replicas
from nuts import sharding
from nuts import windowed_replicas

_RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "distributed_runs.py")
_ROOT = os.path.dirname(os.path.dirname(_RUNS))


def _env():
  path = os.environ.get("PYTHONPATH")
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
              PYTHONPATH=_ROOT + (os.pathsep + path if path else ""))


def _start(args):
  return subprocess.Popen([sys.executable, _RUNS, json.dumps(args)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=_env())


def _result(process, timeout):
  try:
    out, err = process.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    process.kill()
    process.communicate()
    raise
  assert process.returncode == 0, err[-3000:]
  return json.loads(out.strip().splitlines()[-1])


def _free_ports(count):
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("localhost", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def _assert_same_chains(sharded, unsharded):
  # Exactly the same trajectories; the step size's average over chains is
  # summed in another order across replicas, hence a float64 tolerance.
  np.testing.assert_allclose(sharded["draws"], unsharded["draws"],
                             rtol=1e-9, atol=1e-12)
  np.testing.assert_allclose(sharded["step_size"], unsharded["step_size"],
                             rtol=1e-12)


def _mirrored(devices, backend="pc:graph"):
  run = _start({"mode": "mirrored", "devices": [devices],
                "backend": backend})
  out = _result(run, timeout=900)[str(devices)]
  _assert_same_chains(out["sharded"], out["unsharded"])
  # Every replica adapted the one step size of all chains.
  assert len(set(out["sharded"]["replica_step_sizes"])) == 1


@pytest.mark.slow
def test_mirrored_two_cpus_equals_unsharded():
  _mirrored(2)


@pytest.mark.nightly
def test_mirrored_four_cpus_equals_unsharded():
  _mirrored(4)


@pytest.mark.nightly
def test_mirrored_two_cpus_pc_xla_equals_unsharded():
  # The XLA-compiled step, traced once and shared by the replicas (each
  # passes its own first chain's index), inside strategy.run's graph.
  _mirrored(2, backend="pc:xla")


def _workers(done_dir, die_at_step=None, timeout_seconds=600,
             windowed=False):
  # A collective's timeout counts from when one worker reaches it: on a
  # loaded machine a peer may trace its step a minute or more later.
  ports = _free_ports(2)
  return [_start({"mode": "worker", "ports": ports, "index": i,
                  "backend": "pc:graph", "timeout_seconds": timeout_seconds,
                  "done_dir": str(done_dir),
                  "die_at_step": die_at_step, "windowed": windowed,
                  "reference": i == 0 and die_at_step is None})
          for i in range(2)]


@pytest.mark.slow
def test_multi_worker_two_processes_equals_unsharded(tmp_path):
  workers = _workers(tmp_path)
  try:
    outs = [_result(w, timeout=900) for w in workers]
  finally:
    for p in workers:
      if p.poll() is None:
        p.kill()
  for out in outs:
    assert "error" not in out, out
  unsharded = outs[0]["unsharded"]   # worker 0 ran it after its share
  # Each worker holds one replica; worker i's draws are chains 2i, 2i+1.
  draws = np.concatenate([out["draws"] for out in outs])
  _assert_same_chains({"draws": draws, "step_size": outs[0]["step_size"]},
                      unsharded)
  assert outs[0]["step_size"] == outs[1]["step_size"]


@pytest.mark.slow
def test_multi_worker_dead_peer_is_an_error_not_a_hang(tmp_path):
  # Worker 1 exits after step 2; worker 0's next all-reduce fails (its
  # peer's connection reset, the strategy's communication timeout, or its
  # peer health check), and nuts.replicas.sample_chain says so, well
  # before the test's own watchdog.
  workers = _workers(tmp_path, die_at_step=2, timeout_seconds=120)
  try:
    out = _result(workers[0], timeout=600)
    workers[1].wait(timeout=60)
  finally:
    for p in workers:
      if p.poll() is None:
        p.kill()
  assert workers[1].returncode == 3
  assert out.get("error") == "ReplicaLostError", out
  assert "did not take part" in out["message"]


@pytest.mark.slow
def test_data_sharded_target_is_refused_as_tfp_nuts_fails():
  # A Sharded likelihood all-reduces inside the target, which the kernel
  # calls inside its batched program's loop: MirroredStrategy on CPUs
  # cannot, and TFP's own NUTS fails there too (with TensorFlow's
  # merge_call message); ours says what to do instead.
  out = _result(_start({"mode": "data_mirrored", "backend": "pc:graph"}),
                timeout=900)
  assert out["error"] == "CollectiveError", out
  assert "experimental_chain_axis_names" in out["message"]
  assert "merge_call" in out["tfp_error"], out


def _windowed_mirrored(backend, **settings):
  out = _result(_start(dict(mode="windowed_mirrored", devices=2,
                            backend=backend, **settings)), timeout=900)
  sharded, unsharded = out["sharded"], out["unsharded"]
  # The same draws, step sizes and metric (its variances summed over the
  # chains in another order: a float64 tolerance).
  for key in ("mu", "sigma", "step_size", "target_log_prob"):
    np.testing.assert_allclose(sharded[key], unsharded[key], rtol=1e-9,
                               atol=1e-12, err_msg=key)
  for part, ref in zip(sharded["variance_scaling"],
                       unsharded["variance_scaling"]):
    np.testing.assert_allclose(part, ref, rtol=1e-9)
  # The metric window did adapt the metric (it is not the initial ones).
  assert not np.allclose(sharded["variance_scaling"][0], 1.)
  return out


@pytest.mark.slow
def test_windowed_adaptive_nuts_mirrored_two_cpus_equals_unsharded():
  # 20 warm-up steps: a fast window, a metric window, Stan's step-size
  # heuristic for the new metric and a last fast window, then 2 draws;
  # 2 chains on each of 2 replicas against the same 4 chains in one batch.
  out = _windowed_mirrored("pc:graph", num_adaptation_steps=20, n_draws=2)
  errors = out["errors"]
  assert "strategy.scope()" in errors["no_strategy"]
  assert "split evenly over 2 replicas" in errors["uneven"]
  assert "not inside strategy.run" in errors["in_run"]


@pytest.mark.nightly
def test_windowed_adaptive_nuts_mirrored_pc_xla_equals_unsharded():
  # The default backend: its compiled step shared by the replicas.
  _windowed_mirrored("pc:xla", num_adaptation_steps=20, n_draws=2)


@pytest.mark.nightly
def test_windowed_adaptive_nuts_two_workers_equals_unsharded(tmp_path):
  # Each worker holds one replica of 2 chains; the states and traces are
  # gathered across the processes, so each worker returns all 4 chains.
  workers = _workers(tmp_path, windowed=True)
  try:
    outs = [_result(w, timeout=1500) for w in workers]
  finally:
    for p in workers:
      if p.poll() is None:
        p.kill()
  unsharded = outs[0]["unsharded"]
  for out in outs:
    for key in ("mu", "sigma", "step_size", "target_log_prob"):
      np.testing.assert_allclose(out["sharded"][key], unsharded[key],
                                 rtol=1e-9, atol=1e-12, err_msg=key)


# -- the kernel's arguments, in this process ----------------------------------


def _normal(x):
  return -0.5 * tf.reduce_sum(x ** 2, -1)


def test_shard_axis_names_are_parameters_as_in_tfp():
  kernel = nuts.NoUTurnSampler(_normal, 0.5)
  assert kernel.experimental_shard_axis_names is None
  same = kernel.experimental_with_shard_axes([None])
  assert same.experimental_shard_axis_names == [None]
  assert same.parameters["experimental_shard_axis_names"] == [None]
  chained = nuts.NoUTurnSampler(_normal, 0.5,
                                experimental_chain_axis_names="chains")
  assert chained.experimental_chain_axis_names == ("chains",)
  assert chained.copy().experimental_chain_axis_names == ("chains",)


def test_sharded_state_parts_are_refused_clearly():
  with pytest.raises(NotImplementedError, match="sharded state parts"):
    nuts.NoUTurnSampler(_normal, 0.5, experimental_shard_axis_names=["data"])
  with pytest.raises(NotImplementedError, match="sharded state parts"):
    nuts.NoUTurnSampler(_normal, 0.5).experimental_with_shard_axes(
        [None, "data"])
  with pytest.raises(ValueError, match="one replica axis"):
    nuts.NoUTurnSampler(_normal, 0.5,
                        experimental_chain_axis_names=["a", "b"])


def test_chain_offsets_outside_strategies_are_zero():
  # The default replica context is one replica: with names or without,
  # chain i is global chain i (the kernel then draws as without names).
  assert sharding.chain_offset((), 5) == 0
  assert int(sharding.chain_offset(("chains",), 5)) == 0
  with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
    with pytest.raises(ValueError, match="strategy.run"):
      sharding.chain_offset(("chains",), 5)


def test_reduce_over_chains_without_replicas_is_local():
  total, count = sharding.reduce_over_chains(tf.constant(3.), 2., ("c",))
  assert float(total) == 3. and float(count) == 2.


class _PeerGone:
  """A strategy whose replicas' all-reduce fails as when a peer has died."""
  num_replicas_in_sync = 2
  extended = types.SimpleNamespace(worker_devices=("cpu:0", "cpu:1"))

  def run(self, fn, args):
    del fn, args
    raise tf.errors.UnavailableError(None, None, "Connection reset by peer")

  def experimental_distribute_values_from_function(self, fn):
    del fn
    return tf.zeros([2, 1])


def test_sample_chain_names_the_step_a_peer_was_lost_at():
  kernel = nuts.NoUTurnSampler(_normal, 0.5)
  with pytest.raises(replicas.ReplicaLostError,
                     match="bootstrap_results of a sharded run.*did not "
                     "take part.*Connection reset by peer"):
    replicas.sample_chain(_PeerGone(), 3, lambda context: None, kernel,
                          seed=(1, 2))


def test_windowed_steps_name_a_lost_peer():
  # windowed_adaptive_nuts(chain_axis_names=) ran its steps with
  # strategy.run directly: TensorFlow's error, where sample_chain's says
  # a replica was lost.
  steps = windowed_replicas.ReplicaSteps(_PeerGone(), num_chains=4)
  with pytest.raises(replicas.ReplicaLostError,
                     match="windowed_adaptive_nuts' bootstrap of a sharded "
                     "run.*did not take part.*Connection reset by peer"):
    steps.call(None, "_bootstrap", tf.zeros([4, 1]), 0.5, None, 10)


def _windowed_model():
  tfd = tfp.distributions
  return tfd.JointDistributionNamed(dict(
      x=tfd.Normal(0., 1.), y=lambda x: tfd.Normal(x, 1.)))


def test_windowed_chain_axis_names_needs_a_strategy_in_scope():
  with pytest.raises(ValueError, match="strategy.scope()"):
    nuts.windowed_adaptive_nuts(2, _windowed_model(), n_chains=2,
                                num_adaptation_steps=0,
                                chain_axis_names="chains", y=1.)


def test_windowed_chain_axis_names_is_called_eagerly():
  @tf.function(autograph=False)
  def run():
    return nuts.windowed_adaptive_nuts(2, _windowed_model(), n_chains=2,
                                       num_adaptation_steps=0,
                                       chain_axis_names="chains", y=1.)
  with pytest.raises(ValueError, match="call it eagerly"):
    run()


def test_sample_chain_steps_do_not_rebuild_the_results_momentum_distribution(
    constructions):
  # One strategy.run per step: the step's tf.function, called eagerly,
  # rebuilt every composite it returned, the momentum distribution the
  # kernel results carry among them. The results now cross strategy.run
  # as their flat tensors: the distribution is built when a call starts
  # or ends, not at every step. (A TFP distribution of the user's: the
  # default metric is rebuilt without TFP's constructors.)
  kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
      nuts.NoUTurnSampler(_normal, 0.5, max_tree_depth=3,
                          backend="pc:graph",
                          momentum_distribution=tfp.distributions
                          .MultivariateNormalDiag(scale_diag=[1., 1.])),
      num_adaptation_steps=5)
  strategy = tf.distribute.get_strategy()
  run = replicas.sample_chain(strategy, 2, lambda _: tf.zeros([3, 2]),
                              kernel, seed=(1, 2))
  built = constructions(tfp.distributions.BatchBroadcast)
  def built_in(steps):
    del built[:]
    more = replicas.sample_chain(
        strategy, steps, run.final_state, kernel, seed=(3, 4),
        previous_kernel_results=run.final_kernel_results)
    assert more.states.shape == (steps, 3, 2)
    return len(built)
  built_in(2)   # traces the continuing call's functions
  assert built_in(12) == built_in(2) > 0
