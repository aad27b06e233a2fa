"""`windowed_adaptive_nuts(chain_axis_names=...)`: the warm-up and sampling
steps of `nuts.windowed_adaptive_nuts` run on the replicas of the
`tf.distribute` strategy in scope, each replica batching its share of the
chains.

TensorFlow's mirrored strategies all-reduce through `merge_call`, which is
forbidden inside a loop or a nested function (unless the replica function is
XLA-compiled on GPUs), and every step of dual averaging reduces over chains.
So the call stays in the strategy's cross-replica context (its `scope()`)
and runs each step as one `strategy.run` of the adaptation kernel's
`one_step`, like `nuts.replicas.sample_chain`:

* The step size: `tfp.mcmc.DualAveragingStepSizeAdaptation`'s
  `experimental_reduce_chain_axis_names` reduces the acceptance statistic
  over every replica's chains inside each step; every replica holds the
  same step size.
* Each step's state is gathered over the replicas (on one host, the
  replicas' chains concatenated; across hosts, an all-gather in the step), so
  the caller holds every chain, as an unsharded run does: the diagonal
  metric's variances and Stan's step-size heuristic after each metric
  window are computed on all N*C chains' draws. (TFP 0.25's running
  variances and `DiagonalMassMatrixAdaptation` have no option to reduce
  over a replica axis, and a gather keeps the computation the unsharded
  run's.)
* Seeds: the steps of a chunk get the seeds `tfp.mcmc.sample_chain` gives
  its steps from the chunk's seed (read off a kernel that records them),
  and the kernel keys chains by their global index, so the sharded run
  draws what the unsharded run of the same chains draws.
* The kernel results cross each `strategy.run` as their flat tensors
  (`nuts.replicas.FlatResults`): returned whole, the momentum distribution
  they carry was rebuilt at every step.
"""
import functools

import tensorflow as tf
import tensorflow_probability as tfp

from nuts import replicas
from nuts import sharding

__all__ = ["ReplicaSteps", "sharded_settings"]


def sharded_settings(axis_names, nuts_settings, dual_averaging):
  """The kernel's and dual averaging's keywords, reducing over `axis_names`."""
  nuts_settings = dict(nuts_settings,
                       experimental_chain_axis_names=axis_names)
  dual_averaging = dict(dual_averaging,
                        experimental_reduce_chain_axis_names=axis_names)
  # TFP's log-mean-exp reductions take a cross-replica max, which
  # TensorFlow has not: they gather the chains' values instead.
  dual_averaging["reduce_fn"] = functools.partial(
      dual_averaging["reduce_fn"], experimental_allow_all_gather=True)
  return nuts_settings, dual_averaging


def _innermost(results):
  while hasattr(results, "inner_results"):
    results = results.inner_results
  return results


class _SeedRecorder(tfp.mcmc.TransitionKernel):
  """A kernel whose state is the seed its last step was given."""

  @property
  def is_calibrated(self):
    return True

  def one_step(self, current_state, previous_kernel_results, seed=None):
    del current_state, previous_kernel_results
    return tf.convert_to_tensor(seed), ()

  def bootstrap_results(self, init_state):
    del init_state
    return ()


def sample_chain_step_seeds(num_steps, seed):
  """The seeds `tfp.mcmc.sample_chain(num_steps, ..., seed=seed)` gives its
  kernel's steps, `[num_steps, 2]`."""
  return tfp.mcmc.sample_chain(
      num_steps, tf.zeros([2], tf.int32), kernel=_SeedRecorder(),
      trace_fn=None, seed=seed)


class ReplicaSteps:
  """Runs a `_WindowedRun`'s bootstraps and chunks on `strategy`'s
  replicas; what it hands back holds every chain."""

  def __init__(self, strategy, num_chains):
    self.strategy = strategy
    self.local_chains = num_chains // strategy.num_replicas_in_sync
    # With several workers, each step gathers the chains inside the
    # replicas' graph (one all-gather); on one host the caller concatenates
    # its replicas' chains.
    self._across_hosts = (len(strategy.extended.worker_devices)
                          < strategy.num_replicas_in_sync)
    self._state = None      # distributed: each replica's chains
    self._results = None    # distributed, flat (`self._flat`)
    self._flat = replicas.FlatResults()
    self._compiled = {}

  @classmethod
  def for_call(cls, axis_names, chain_shape):
    """Checks the call can shard its chains; the steps of the strategy in
    scope."""
    sharding.canonical_axis_names(axis_names, "chain_axis_names")
    if not tf.executing_eagerly():
      raise ValueError(
          "nuts.windowed_adaptive_nuts with chain_axis_names runs each step "
          "as one strategy.run: call it eagerly (not inside a tf.function), "
          "under `with strategy.scope():`")
    if not tf.distribute.has_strategy():
      raise ValueError(
          "chain_axis_names splits the chains over the replicas of a "
          "tf.distribute strategy: call nuts.windowed_adaptive_nuts under "
          "`with strategy.scope():` (or leave chain_axis_names None)")
    if not tf.distribute.in_cross_replica_context():
      raise ValueError(
          "nuts.windowed_adaptive_nuts with chain_axis_names is called in "
          "the strategy's cross-replica context (`with strategy.scope():`), "
          "not inside strategy.run: TensorFlow's mirrored strategies cannot "
          "all-reduce inside the warm-up's loops, so it runs every step as "
          "one strategy.run itself")
    strategy = tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    if len(chain_shape) != 1 or chain_shape[0] % replicas:
      raise ValueError(
          f"n_chains={chain_shape} cannot be split evenly over {replicas} "
          "replicas: with chain_axis_names, n_chains is the number of all "
          "chains (one int), a multiple of strategy.num_replicas_in_sync")
    return cls(strategy, chain_shape[0])

  # -- what runs on each replica ---------------------------------------------

  def _local_chains(self, state):
    context = tf.distribute.get_replica_context()
    first = context.replica_id_in_sync_group * self.local_chains
    return [x[first:first + self.local_chains] for x in state]

  def _replica_bootstrap(self, run, state, step_size, precisions,
                         num_adaptation_steps):
    state = self._local_chains(state)
    results = run._bootstrap(   # pylint: disable=protected-access
        state, step_size, precisions, num_adaptation_steps)
    return state, self._flat.flatten(results)

  def _replica_step(self, run, state, results, precisions,
                    num_adaptation_steps, is_adapting, seed):
    results = self._flat.pack(results)
    kernel = run._kernel(   # pylint: disable=protected-access
        _innermost(results).step_size, precisions, state,
        num_adaptation_steps)
    state, results = kernel.one_step(state, results, seed=seed)
    trace = (() if run.trace_fn is None else
             run.trace_fn(state, run.model.bijector, is_adapting, results))
    shown = (state, trace)
    if self._across_hosts:
      shown = self._all_gather(shown)
    return state, shown, self._flat.flatten(results)

  def _is_per_chain(self, x):
    return bool(x.shape.rank) and x.shape[0] == self.local_chains

  def _all_gather(self, value):
    """Per-chain leaves gathered over every replica (replica order), in one
    all-gather; booleans travel as int32 (collectives take no booleans)."""
    leaves = tf.nest.flatten(value)
    picked = [i for i, x in enumerate(leaves) if self._is_per_chain(x)]
    if not picked:
      return value
    sent = [tf.cast(leaves[i], tf.int32) if leaves[i].dtype == tf.bool
            else leaves[i] for i in picked]
    gathered = tf.distribute.get_replica_context().all_gather(sent, axis=0)
    for i, x in zip(picked, gathered):
      leaves[i] = tf.cast(x, tf.bool) if leaves[i].dtype == tf.bool else x
    return tf.nest.pack_sequence_as(value, leaves)

  # -- the caller's side -----------------------------------------------------

  def _run(self, name, run, *args):
    if name not in self._compiled:
      self._compiled[name] = tf.function(
          functools.partial(getattr(self, name), run), autograph=False)
    what = "windowed_adaptive_nuts' " + name.replace("_replica_", "")
    return replicas.run_on_replicas(self.strategy, self._compiled[name],
                                    args, what)

  def _gather(self, value):
    """A step's values holding every chain: per-chain leaves (leading
    dimension the replica's chains) of this host's replicas concatenated in
    replica order, or gathered in the step across hosts; others (reduced
    statistics, the same on every replica) from the first local replica."""
    if self._across_hosts:
      return self._first(value)
    return replicas.local_chains(self.strategy, value, self._is_per_chain)

  def _first_results(self):
    return self._flat.pack(self._first(self._results))

  def _first(self, value):
    return tf.nest.map_structure(
        lambda x: self.strategy.experimental_local_results(x)[0], value)

  def call(self, run, name, *args):
    """`run._call(name, *args)` on the replicas: `_bootstrap` starts each
    replica from its share of the given chains; `_chunk` continues from
    the replicas' own state and results (the ones given, the first
    replica's, only stand for them)."""
    if name == "_bootstrap":
      state, step_size, precisions, num_adaptation_steps = args
      self._state, self._results = self._run(
          "_replica_bootstrap", run, state, step_size, precisions,
          num_adaptation_steps)
      return self._first_results()
    num_steps, _, _, precisions, num_adaptation_steps, is_adapting, seed = args
    states, traces = [], []
    for step_seed in tf.unstack(sample_chain_step_seeds(num_steps, seed)):
      self._state, shown, self._results = self._run(
          "_replica_step", run, self._state, self._results, precisions,
          num_adaptation_steps, is_adapting, step_seed)
      state, trace = self._gather(shown)
      states.append(state)
      traces.append(trace)
    return (tf.nest.map_structure(_stack, *states),
            tf.nest.map_structure(_stack, *traces),
            self._first_results())


def _stack(*steps):
  return tf.stack(steps, 0)
