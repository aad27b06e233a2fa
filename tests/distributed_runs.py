"""Sharded NUTS runs for tests/test_distributed.py, each in a process of its
own: TensorFlow fixes its logical devices and cluster when it first starts
them (at the first tensor, not at import), so every configuration needs a
fresh interpreter.

    python tests/distributed_runs.py '{"mode": "mirrored", ...}'

prints one JSON line: the draws (and step sizes) of each run, in global
chain order. The model, kernel and seeds are the same in every mode, so the
test compares the modes' draws with the unsharded run's.
"""
import functools
import json
import os
import resource
import sys
import time

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

import nuts
from nuts import sharding

STEPS = 4
CHAINS_PER_REPLICA = 2
DIMS = 3


def _set_logical_cpus(count):
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * count)


def _target(x):
  """A correlated Gaussian in DIMS dimensions, float64 (so reductions in
  another order round alike)."""
  scales = tf.constant([1., 2., 0.5], tf.float64)
  z = x / scales
  return -0.5 * (tf.reduce_sum(z ** 2, -1) - 0.8 * z[..., 0] * z[..., 1])


def _initial_state(num_chains):
  rng = np.random.default_rng(7)
  return rng.normal(size=[num_chains, DIMS])


def _kernel(axis_name, backend):
  """NUTS under step-size adaptation, averaged over all chains: over every
  replica's when `axis_name` is set."""
  inner = nuts.NoUTurnSampler(_target, 0.4, max_tree_depth=4, backend=backend,
                              experimental_chain_axis_names=axis_name)
  return tfp.mcmc.DualAveragingStepSizeAdaptation(
      inner, num_adaptation_steps=STEPS,
      experimental_reduce_chain_axis_names=axis_name,
      # TF has no native cross-replica max, which TFP's logmeanexp needs.
      reduce_fn=functools.partial(tfp.math.reduce_logmeanexp,
                                  experimental_allow_all_gather=True))


def _seed(step):
  return tf.constant([11, step], tf.int32)


def unsharded(num_chains, backend):
  """The reference: all chains in one batch, no strategy."""
  kernel = _kernel(None, backend)
  state = tf.constant(_initial_state(num_chains))
  results = kernel.bootstrap_results(state)
  step = tf.function(kernel.one_step, autograph=False)
  for i in range(STEPS):
    state, results = step(state, results, _seed(i))
  return {"draws": state.numpy().tolist(),
          "step_size": float(results.new_step_size)}


def sharded(strategy, backend, progress=None):
  """The same chains split over `strategy`'s replicas, one `strategy.run`
  per step (MirroredStrategy on CPUs cannot all-reduce inside a loop, so
  the loop over steps stays outside the replicas)."""
  replicas = strategy.num_replicas_in_sync
  init = _initial_state(replicas * CHAINS_PER_REPLICA)
  kernel = _kernel("chains", backend)

  def local_init(context):
    first = context.replica_id_in_sync_group * CHAINS_PER_REPLICA
    return tf.constant(init[first:first + CHAINS_PER_REPLICA])

  state = strategy.experimental_distribute_values_from_function(local_init)
  results = strategy.run(tf.function(kernel.bootstrap_results,
                                     autograph=False), (state,))
  step = tf.function(kernel.one_step, autograph=False)
  for i in range(STEPS):
    if progress is not None:
      progress(i)
    state, results = strategy.run(step, (state, results, _seed(i)))
  draws = np.concatenate([s.numpy() for s in
                          strategy.experimental_local_results(state)])
  step_sizes = [float(s) for s in strategy.experimental_local_results(
      results.new_step_size)]
  return {"draws": draws.tolist(), "step_size": step_sizes[0],
          "replica_step_sizes": step_sizes}


def mirrored(devices, backend):
  """Sharded runs over MirroredStrategy with each count of logical CPUs in
  `devices`, and the unsharded runs of the same chains."""
  _set_logical_cpus(max(devices))
  cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
  out = {}
  for count in devices:
    strategy = tf.distribute.MirroredStrategy(cpus[:count])
    out[str(count)] = {
        "sharded": sharded(strategy, backend),
        "unsharded": unsharded(count * CHAINS_PER_REPLICA, backend)}
  return out


def worker(ports, index, backend, timeout_seconds, die_at_step=None,
           reference=False):
  """One worker of a two-process MultiWorkerMirroredStrategy on localhost.
  With `die_at_step`, worker 1 exits abruptly before that step; with
  `reference`, the worker also runs the unsharded chains afterwards (its
  program is converted already)."""
  os.environ["TF_CONFIG"] = json.dumps({
      "cluster": {"worker": [f"localhost:{p}" for p in ports]},
      "task": {"type": "worker", "index": index}})
  strategy = tf.distribute.MultiWorkerMirroredStrategy(
      communication_options=tf.distribute.experimental.CommunicationOptions(
          timeout_seconds=timeout_seconds))

  def progress(step):
    if die_at_step is not None and index == 1 and step == die_at_step:
      os._exit(3)   # pylint: disable=protected-access
  start = time.time()
  try:
    out = sharded(strategy, backend, progress)
  except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
          tf.errors.CancelledError, tf.errors.InternalError,
          tf.errors.AbortedError) as e:
    return {"error": type(e).__name__, "message": str(e)[:500],
            "seconds": time.time() - start}
  out["seconds"] = time.time() - start
  if reference:
    out["unsharded"] = unsharded(
        strategy.num_replicas_in_sync * CHAINS_PER_REPLICA, backend)
  return out


def _data_model():
  """mu ~ N(0, 1) and 8 observations y ~ N(mu, 1) in float64, each of two
  replicas holding 4 of them: a `Sharded` term, whose log density and
  gradients are summed over the replicas."""
  tfd = tfp.distributions

  def likelihood(mu):
    return tfp.experimental.distribute.Sharded(tfd.Independent(tfd.Normal(
        mu[..., None] * tf.ones([4], tf.float64),
        tf.constant(1., tf.float64)), 1), shard_axis_name="data")
  return tfp.experimental.distribute.JointDistributionSequential(
      [tfd.Normal(tf.constant(0., tf.float64), 1.), likelihood])


DATA = [0.3, 1.1, -0.4, 2.0, 0.9, 1.5, 0.2, 1.7]
DATA_CHAINS = [0.1, -0.3, 0.5]


def data_sharded(strategy, backend):
  """NUTS on the data model, the data split over two replicas and every
  replica running the same chains; returns each replica's draws."""
  model = _data_model()
  data = tf.reshape(tf.constant(DATA, tf.float64), [2, 4])
  init = tf.constant(DATA_CHAINS, tf.float64)

  @tf.function(autograph=False)
  def run():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    local = tf.gather(data, replica)
    kernel = nuts.NoUTurnSampler(lambda mu: model.log_prob([mu, local]),
                                 0.5, max_tree_depth=4, backend=backend)
    state, results = init, kernel.bootstrap_results(init)
    for i in range(STEPS):
      state, results = kernel.one_step(state, results, seed=_seed(i))
    return state
  return [s.numpy().tolist()
          for s in strategy.experimental_local_results(strategy.run(run))]


def data_mirrored(backend):
  """`data_sharded` over MirroredStrategy on two logical CPUs: the error."""
  _set_logical_cpus(2)
  strategy = tf.distribute.MirroredStrategy(
      [d.name for d in tf.config.list_logical_devices("CPU")])
  out = {"error": None}
  try:
    data_sharded(strategy, backend)
  except sharding.CollectiveError as e:
    out = {"error": type(e).__name__, "message": str(e)}
  out["tfp_error"] = _tfp_nuts_data_sharded(strategy)
  return out


def _tfp_nuts_data_sharded(strategy):
  """The name of the error `tfp.mcmc.NoUTurnSampler` raises on the same
  data-sharded model under `strategy` (None if it runs)."""
  model = _data_model()
  data = tf.reshape(tf.constant(DATA, tf.float64), [2, 4])
  init = tf.constant(DATA_CHAINS, tf.float64)

  @tf.function(autograph=False)
  def run():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    local = tf.gather(data, replica)
    kernel = tfp.mcmc.NoUTurnSampler(
        lambda mu: model.log_prob([mu, local]), 0.5, max_tree_depth=4)
    return kernel.one_step(init, kernel.bootstrap_results(init),
                           seed=_seed(0))[0]
  try:
    strategy.run(run)
  except RuntimeError as e:
    return type(e).__name__ + ": " + str(e)[:200]
  return None


if __name__ == "__main__":
  args = json.loads(sys.argv[1])
  mode = args.pop("mode")
  result = {"mirrored": mirrored, "worker": worker, "unsharded": unsharded,
            "data_mirrored": data_mirrored}[mode](**args)
  if isinstance(result, dict):
    result["cpu_sec"] = resource.getrusage(resource.RUSAGE_SELF).ru_utime
  print(json.dumps(result))
  sys.stdout.flush()
  if mode == "worker":
    # MultiWorkerMirroredStrategy's servers keep the process alive.
    os._exit(0)   # pylint: disable=protected-access
