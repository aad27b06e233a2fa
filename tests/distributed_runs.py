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
from nuts import replicas as replicas_lib
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


SEED = [11, 12]


def unsharded(num_chains, backend):
  """The reference: all chains in one batch, no strategy, the step seeds
  `nuts.replicas.sample_chain` gives every replica."""
  kernel = _kernel(None, backend)
  state = tf.constant(_initial_state(num_chains))
  results = kernel.bootstrap_results(state)
  step = tf.function(kernel.one_step, autograph=False)
  for seed in tfp.random.split_seed(SEED, STEPS):
    state, results = step(state, results, seed)
  return {"draws": state.numpy().tolist(),
          "step_size": float(results.new_step_size)}


def sharded(strategy, backend, steps=STEPS, previous=None):
  """The same chains split over `strategy`'s replicas, run by
  `nuts.replicas.sample_chain` (one `strategy.run` per step); with
  `previous` (an earlier call's `ShardedRun`), `steps` more steps from
  there. Returns a JSON-able summary and the `ShardedRun`."""
  replicas = strategy.num_replicas_in_sync
  init = _initial_state(replicas * CHAINS_PER_REPLICA)
  kernel = _kernel("chains", backend)

  def local_init(context):
    first = context.replica_id_in_sync_group * CHAINS_PER_REPLICA
    return tf.constant(init[first:first + CHAINS_PER_REPLICA])
  run = replicas_lib.sample_chain(
      strategy, steps, local_init if previous is None else previous.final_state,
      kernel, seed=SEED, trace_fn=lambda _, r: r.new_step_size,
      previous_kernel_results=(None if previous is None
                               else previous.final_kernel_results))
  step_sizes = [float(s) for s in strategy.experimental_local_results(
      run.final_kernel_results.new_step_size)]
  return {"draws": run.states[-1].numpy().tolist(),
          "step_size": step_sizes[0], "replica_step_sizes": step_sizes,
          "traced_step_sizes": run.trace.numpy().tolist()}, run


def mirrored(devices, backend):
  """Sharded runs over MirroredStrategy with each count of logical CPUs in
  `devices`, and the unsharded runs of the same chains."""
  _set_logical_cpus(max(devices))
  cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
  out = {}
  for count in devices:
    strategy = tf.distribute.MirroredStrategy(cpus[:count])
    out[str(count)] = {
        "sharded": sharded(strategy, backend)[0],
        "unsharded": unsharded(count * CHAINS_PER_REPLICA, backend)}
  return out


def worker(ports, index, backend, timeout_seconds, done_dir,
           die_at_step=None, reference=False, windowed=False):
  """One worker of a two-process MultiWorkerMirroredStrategy on localhost.
  With `die_at_step`, worker 1 exits abruptly before that step; with
  `reference`, the worker also runs the unsharded chains afterwards (its
  program is converted already). A worker that finishes waits for the
  others (files in `done_dir`) before it exits: a peer that leaves while
  another still reads the last all-reduce resets its connection. With
  `windowed`, `nuts.windowed_adaptive_nuts` with `chain_axis_names` (20
  warm-up steps, 2 draws) instead of the kernel's run."""
  os.environ["TF_CONFIG"] = json.dumps({
      "cluster": {"worker": [f"localhost:{p}" for p in ports]},
      "task": {"type": "worker", "index": index}})
  strategy = tf.distribute.MultiWorkerMirroredStrategy(
      communication_options=tf.distribute.experimental.CommunicationOptions(
          timeout_seconds=timeout_seconds))

  start = time.time()
  if windowed:
    settings = dict(backend=backend, num_adaptation_steps=20, n_draws=2,
                    n_chains=strategy.num_replicas_in_sync
                    * CHAINS_PER_REPLICA)
    with strategy.scope():
      out = {"sharded": _windowed(chain_axis_names="chains", **settings)}
    out["seconds"] = time.time() - start
    if reference:
      out["unsharded"] = _windowed(**settings)
    with open(os.path.join(done_dir, str(index)), "w"):
      pass
    while len(os.listdir(done_dir)) < len(ports):
      time.sleep(0.2)
    return out
  try:
    if die_at_step is None:
      out, _ = sharded(strategy, backend)
    else:
      _, run = sharded(strategy, backend, steps=die_at_step)
      if index == 1:
        os._exit(3)   # pylint: disable=protected-access
      out, _ = sharded(strategy, backend, previous=run)
  except replicas_lib.ReplicaLostError as e:
    return {"error": type(e).__name__, "message": str(e)[:1000],
            "seconds": time.time() - start}
  out["seconds"] = time.time() - start
  if reference:
    out["unsharded"] = unsharded(
        strategy.num_replicas_in_sync * CHAINS_PER_REPLICA, backend)
  with open(os.path.join(done_dir, str(index)), "w"):
    pass
  while len(os.listdir(done_dir)) < len(ports):
    time.sleep(0.2)
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
    for seed in tfp.random.split_seed(SEED, STEPS):
      state, results = kernel.one_step(state, results, seed=seed)
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
                           seed=SEED)[0]
  try:
    strategy.run(run)
  except RuntimeError as e:
    return type(e).__name__ + ": " + str(e)[:200]
  return None


def _windowed_model():
  """mu ~ N(0, 1), sigma ~ HalfNormal(1), 6 observations y ~ N(mu, sigma),
  in float64 (a constrained variable, so the bijector is in the run)."""
  tfd = tfp.distributions
  one = tf.constant(1., tf.float64)
  return tfd.JointDistributionNamed(dict(
      mu=tfd.Normal(0. * one, one),
      sigma=tfd.HalfNormal(one),
      y=lambda mu, sigma: tfd.Independent(tfd.Normal(
          mu[..., None] * tf.ones([6], tf.float64), sigma[..., None]), 1)))


WINDOWED_Y = [0.3, 1.1, -0.4, 2.0, 0.9, 1.5]


def _windowed(backend, num_adaptation_steps, n_draws, n_chains,
              chain_axis_names=None):
  draws, trace = nuts.windowed_adaptive_nuts(
      n_draws, _windowed_model(), n_chains=n_chains,
      num_adaptation_steps=num_adaptation_steps, max_tree_depth=4,
      chunk_size=7, backend=backend, seed=SEED, progress_bar=False,
      chain_axis_names=chain_axis_names,
      y=tf.constant(WINDOWED_Y, tf.float64))
  return {"mu": draws["mu"].numpy().tolist(),
          "sigma": draws["sigma"].numpy().tolist(),
          "step_size": trace["step_size"].numpy().tolist(),
          "variance_scaling": [v.numpy().tolist()
                               for v in trace["variance_scaling"]],
          "target_log_prob": trace["target_log_prob"].numpy().tolist()}


def windowed_mirrored(devices, backend, num_adaptation_steps=30, n_draws=5):
  """`nuts.windowed_adaptive_nuts` over MirroredStrategy on `devices`
  logical CPUs (CHAINS_PER_REPLICA chains each) under `chain_axis_names`,
  and the same call unsharded; and the errors of calls it refuses."""
  _set_logical_cpus(devices)
  strategy = tf.distribute.MirroredStrategy(
      [d.name for d in tf.config.list_logical_devices("CPU")])
  n_chains = devices * CHAINS_PER_REPLICA
  settings = dict(backend=backend, num_adaptation_steps=num_adaptation_steps,
                  n_draws=n_draws, n_chains=n_chains)
  start = time.time()
  with strategy.scope():
    out = {"sharded": _windowed(chain_axis_names="chains", **settings)}
  out["sharded_seconds"] = time.time() - start
  out["unsharded"] = _windowed(**settings)
  errors = {}
  for where, call in (
      ("no_strategy", lambda: _windowed(chain_axis_names="chains",
                                        **settings)),
      ("uneven", lambda: _windowed(chain_axis_names="chains",
                                   **dict(settings, n_chains=n_chains + 1))),
      ("in_run", lambda: strategy.run(lambda: _windowed(
          chain_axis_names="chains", **settings)))):
    try:
      if where == "uneven":
        with strategy.scope():
          call()
      else:
        call()
      errors[where] = None
    except ValueError as e:
      errors[where] = str(e)
  out["errors"] = errors
  return out


if __name__ == "__main__":
  args = json.loads(sys.argv[1])
  mode = args.pop("mode")
  result = {"mirrored": mirrored, "worker": worker, "unsharded": unsharded,
            "data_mirrored": data_mirrored,
            "windowed_mirrored": windowed_mirrored}[mode](**args)
  if isinstance(result, dict):
    result["cpu_sec"] = resource.getrusage(resource.RUSAGE_SELF).ru_utime
  print(json.dumps(result))
  sys.stdout.flush()
  if mode == "worker":
    # MultiWorkerMirroredStrategy's servers keep the process alive.
    os._exit(0)   # pylint: disable=protected-access
