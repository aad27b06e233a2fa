"""`sample_chain` over the replicas of a `tf.distribute` strategy.

TensorFlow's mirrored strategies all-reduce through `merge_call`, which is
forbidden inside a loop or a nested function (unless the replica function is
XLA-compiled on GPUs), so an adaptation kernel that reduces over all
replicas' chains cannot run inside `tfp.mcmc.sample_chain` under
`strategy.run`. This driver keeps the loop over steps outside the replicas:
one `strategy.run` of the kernel's compiled `one_step` per step, every
replica given the same step seed (the kernel tells chains apart by their
global index, `experimental_chain_axis_names`). The kernel results cross
each `strategy.run` as their flat tensors (`FlatResults`). A step whose
all-reduce fails because a peer died or stopped answering (within the
strategy's `CommunicationOptions(timeout_seconds=...)`) raises
`ReplicaLostError` naming the step.
"""
import collections
import functools
import weakref

import tensorflow as tf
import tensorflow_probability as tfp

__all__ = ["sample_chain", "ShardedRun", "ReplicaLostError", "FlatResults"]

ShardedRun = collections.namedtuple("ShardedRun", [
    "states",                  # [num_results, chains, ...]: this process's
                               # replicas' chains, in replica order
    "trace",                   # trace_fn's results alike, or None
    "final_state",             # distributed: to continue the run
    "final_kernel_results",    # distributed
])

# What a collective raises when a peer is gone: its connection reset
# (Unavailable), the communication timeout (DeadlineExceeded), or the
# strategy's health check aborting the collectives (Aborted, Cancelled).
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                tf.errors.AbortedError, tf.errors.CancelledError)


class ReplicaLostError(RuntimeError):
  """A replica stopped answering during a sharded run."""


def sample_chain(strategy, num_results, current_state, kernel, seed,
                 trace_fn=None, previous_kernel_results=None):
  """Runs `kernel` for `num_results` steps on each replica's chains.

  Args:
    strategy: a `tf.distribute.Strategy`.
    num_results: steps to run (every step's state is kept).
    current_state: the chains' state, a distributed value, or a function
      `context -> this replica's state` (as
      `strategy.experimental_distribute_values_from_function` takes).
    kernel: a `tfp.mcmc.TransitionKernel` whose chain reductions name the
      replica axis (`nuts.NoUTurnSampler(...,
      experimental_chain_axis_names=...)` under, e.g.,
      `DualAveragingStepSizeAdaptation(...,
      experimental_reduce_chain_axis_names=...)`).
    seed: the run's seed; step i uses the i-th of
      `tfp.random.split_seed(seed, num_results)` on every replica.
    trace_fn: optional `trace_fn(state, kernel_results)`, run on each
      replica after each step.
    previous_kernel_results: distributed kernel results to continue from;
      by default the kernel's `bootstrap_results` on each replica.

  Returns:
    A `ShardedRun`: `states` of shape `[num_results, chains, ...]` holding
    this process's replicas' chains concatenated in replica order (on one
    host, all chains; with several workers, this worker's), `trace`
    likewise (None without `trace_fn`), and the distributed final state and
    kernel results, which a further call continues from.

  Raises:
    ReplicaLostError: a step's cross-replica reduction failed because a
      peer died or did not answer in time.
  """
  if callable(current_state):
    current_state = strategy.experimental_distribute_values_from_function(
        current_state)
  state = current_state
  bootstrap, step, flatten, pack = _compiled(kernel, trace_fn)
  if previous_kernel_results is None:
    results = run_on_replicas(strategy, bootstrap, (state,),
                              "bootstrap_results")
  else:
    results = run_on_replicas(strategy, flatten, (previous_kernel_results,),
                              "reading previous_kernel_results")
  seeds = tfp.random.split_seed(tfp.random.sanitize_seed(seed), num_results)
  states, traces = [], []
  for i in range(num_results):
    state, results, trace = run_on_replicas(
        strategy, step, (state, results, seeds[i]),
        f"step {i + 1} of {num_results}")
    states.append(local_chains(strategy, state))
    traces.append(local_chains(strategy, trace))
  stack = lambda *xs: tf.stack(xs, 0)   # pylint: disable=unnecessary-lambda-assignment
  states = tf.nest.map_structure(stack, *states) if states else []
  traces = (tf.nest.map_structure(stack, *traces)
            if trace_fn is not None and traces else None)
  return ShardedRun(states, traces, state,
                    run_on_replicas(strategy, pack, tuple(results),
                                    "the final kernel results"))


class FlatResults:
  """Kernel results crossing `strategy.run` as the flat list of their
  tensors (`tf.nest.flatten(..., expand_composites=True)`), rebuilt inside
  the replica functions, where only their trace builds the structure.

  A `tf.function` called eagerly rebuilds every composite it returns at
  each call: the momentum distribution our kernel results carry (TFP
  distributions and bijectors, built anew through their constructors)
  costs more than a step on a cheap target, and a driver that runs one
  `strategy.run` per step paid it at every step. `flatten` (inside a
  replica function) gives the flat list and remembers the structure;
  `pack` rebuilds the structure of a flat list `flatten` gave, by the
  list's dtypes and static shapes.
  """

  def __init__(self):
    self._structures = []   # (dtypes, shapes, structure), latest first

  def flatten(self, results):
    flat = tf.nest.flatten(results, expand_composites=True)
    self._structures.insert(0, ([x.dtype for x in flat],
                                [x.shape for x in flat], results))
    return flat

  def pack(self, flat):
    """The structure of `flat`: the latest one `flatten` gave for the same
    dtypes and compatible static shapes (a trace may know fewer
    dimensions than the tensors it later gets)."""
    flat = list(flat)
    for dtypes, shapes, structure in self._structures:
      if (dtypes == [x.dtype for x in flat]
          and all(s.is_compatible_with(x.shape)
                  for s, x in zip(shapes, flat))):
        return tf.nest.pack_sequence_as(structure, flat,
                                        expand_composites=True)
    raise ValueError("these kernel results were not flattened by this "
                     "FlatResults")


# The compiled bootstrap and step of each kernel and trace_fn: a later call
# with the same ones (a run continued in parts) does not trace them again.
_COMPILED = weakref.WeakKeyDictionary()


def _compiled(kernel, trace_fn):
  """`(bootstrap, step, flatten, pack)`: the compiled replica functions
  of `kernel` and `trace_fn`, the results crossing them as one
  `FlatResults` flattens them."""
  per_trace = _COMPILED.setdefault(kernel, {})
  if trace_fn not in per_trace:
    # Weakly: the cache's values must not keep their key alive.
    kernel_ref = weakref.ref(kernel)
    flat_results = FlatResults()

    def bootstrap_fn(state):
      return flat_results.flatten(kernel_ref().bootstrap_results(state))

    def step_fn(state, flat, step_seed):
      state, results = kernel_ref().one_step(
          state, flat_results.pack(flat), seed=step_seed)
      trace = () if trace_fn is None else trace_fn(state, results)
      return state, flat_results.flatten(results), trace

    def pack_fn(*flat):
      return flat_results.pack(flat)
    compiled = functools.partial(tf.function, autograph=False)
    per_trace[trace_fn] = (compiled(bootstrap_fn), compiled(step_fn),
                           compiled(flat_results.flatten), compiled(pack_fn))
  return per_trace[trace_fn]


def run_on_replicas(strategy, fn, args, what):
  """`strategy.run(fn, args)`; a peer lost in its collectives is a
  `ReplicaLostError` naming `what` ran."""
  try:
    return strategy.run(fn, args)
  except _PEER_ERRORS as e:
    raise ReplicaLostError(
        f"{what} of a sharded run failed: a replica did not take part in "
        "its cross-replica reduction (a worker died or stopped answering "
        "within the strategy's communication timeout, "
        "tf.distribute.experimental.CommunicationOptions(timeout_seconds=))"
        f". Restart the run from its last saved state. {type(e).__name__}: "
        f"{str(e).strip()[:300]}") from e


def local_chains(strategy, value, is_per_chain=lambda x: bool(x.shape.rank)):
  """A distributed value's local replicas: the leaves that `is_per_chain`
  (by default, those with a rank) concatenated along the chains, in
  replica order; the others, the same on every replica, once."""
  def gather(x):
    parts = strategy.experimental_local_results(x)
    return tf.concat(parts, 0) if is_per_chain(parts[0]) else parts[0]
  return tf.nest.map_structure(gather, value)
