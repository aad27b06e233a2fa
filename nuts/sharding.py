"""Chains and data split over the replicas of a `tf.distribute` strategy.

Two kinds of sharding, named as `tfp.mcmc` names them:

* Sharded chains (`experimental_chain_axis_names`, our kernel's keyword;
  `chain_axis_names` in TFP's `windowed_adaptive_nuts`). Each replica holds
  its own chains and batches them with the one batched program. The kernel
  keys chain `i` of replica `r` by its global index `r * C + i` (C chains
  per replica, the same on every replica), so N replicas of C chains draw
  exactly what one run of the N*C chains, stacked in replica order, draws
  with the same seed. (TFP's `tfp.experimental.mcmc.Sharded` folds the
  replica index into the step seed instead: independent chains, but not
  those of the unsharded run.) Adaptation that averages over chains reduces
  across the replicas as well through TFP's own options, e.g.
  `DualAveragingStepSizeAdaptation(experimental_reduce_chain_axis_names=)`;
  `reduce_over_chains` does it for statistics of our own.

* Sharded state parts (`experimental_shard_axis_names`, as on every
  `tfp.mcmc` kernel): a part whose values are split across replicas, such
  as a `tfp.experimental.distribute.Sharded` latent variable. TFP's NUTS
  then draws such a part's momentum per replica and sums kinetic energies
  and U-turn dot products across replicas inside its tree. Ours builds its
  trees in a batched program whose tree arithmetic is per chain and local,
  so it refuses such names (all-None names are accepted). A model whose
  *data* alone are sharded needs no names: its log density sums over the
  replicas itself (a `Sharded` likelihood's `log_prob` is all-reduced, with
  gradients summed as well), so every replica sees the same density and
  makes the same moves. But the kernel calls the target inside its batched
  program's loop, and TensorFlow's mirrored strategies (MirroredStrategy,
  MultiWorkerMirroredStrategy) all-reduce through `merge_call`, which is
  forbidden inside a loop or a nested function, unless the replica function
  is XLA-compiled on GPUs. So on CPUs a data-sharded target fails, as it
  fails under `tfp.mcmc.NoUTurnSampler` (whose target runs in a
  `tf.while_loop`; tests/test_distributed.py checks both), and
  `explain_collective_error` turns TensorFlow's error into one that says
  what to do. On GPUs with an XLA-compiled replica function, and on TPUs,
  it is untested.

TensorFlow has a single replica axis, so an axis name is any string (or a
list of one): it names the axis for parity with TFP's JAX backend.
"""
import tensorflow as tf

__all__ = ["canonical_axis_names", "check_state_shard_axis_names",
           "chain_offset", "reduce_over_chains", "CollectiveError",
           "explain_collective_error"]


class CollectiveError(RuntimeError):
  """A cross-replica reduction this kernel cannot run, said in NUTS terms."""


def canonical_axis_names(names, what):
  """None, a name or a list of names -> a tuple of names (TensorFlow's
  strategies have one replica axis, so at most one)."""
  if names is None:
    return ()
  if isinstance(names, str):
    names = (names,)
  names = tuple(names)
  if len(names) > 1:
    raise ValueError(
        f"{what} names the replica axis that chains are split over; "
        "TensorFlow's strategies have one replica axis, so give one name "
        f"(any string), got {names!r}")
  return names


def check_state_shard_axis_names(names):
  """Returns `names` (one entry per state part, or None) if no state part is
  sharded; raises NotImplementedError if one is."""
  sharded = [n for n in tf.nest.flatten(names) if n is not None]
  if sharded:
    raise NotImplementedError(
        "nuts.NoUTurnSampler does not support sharded state parts "
        f"(experimental_shard_axis_names={names!r}): its trees would need "
        "kinetic energies and U-turn checks summed across replicas. Keep "
        "every state part whole on each replica (None for each part). A "
        "model whose data alone are sharded (tfp.experimental.distribute."
        "Sharded likelihood terms) needs no names; to split chains over "
        "replicas, pass experimental_chain_axis_names instead")
  return names


def _replica_context(axis_names, what):
  """The replica context chains are split over, or None when they are not
  (no names, or running outside any strategy)."""
  if not axis_names:
    return None
  context = tf.distribute.get_replica_context()
  if context is None:
    raise ValueError(
        f"{what} is set but the kernel runs in a cross-replica context; "
        "call it inside strategy.run(...)")
  return context


def chain_offset(axis_names, num_local_chains):
  """The global index of this replica's first chain: replica id times the
  chains per replica (0 when chains are not split). Every replica must hold
  the same number of chains."""
  context = _replica_context(axis_names, "experimental_chain_axis_names")
  if context is None:
    return 0
  replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
  return replica * tf.cast(num_local_chains, tf.int32)


def reduce_over_chains(local_sum, local_count, axis_names):
  """(sum, count) of a statistic over every replica's chains, for a mean
  over all N*C chains: `local_sum` and `local_count` are this replica's.
  Without names, the local values."""
  context = _replica_context(axis_names, "chain_axis_names")
  if context is None or context.num_replicas_in_sync == 1:
    return local_sum, local_count
  total, count = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                    [local_sum, local_count])
  return total, count


def explain_collective_error(error):
  """A `CollectiveError` for a cross-replica reduction the target ran
  inside the batched program, or None if `error` is not one."""
  if isinstance(error, RuntimeError) and "merge_call" in str(error):
    strategy = tf.distribute.get_strategy()
    return CollectiveError(
        "target_log_prob_fn reduces across replicas (for example a "
        "tfp.experimental.distribute.Sharded likelihood term), and the "
        "kernel calls it inside its batched program's loop, where "
        f"{type(strategy).__name__} cannot all-reduce: it synchronises "
        "replicas with merge_call (unless the replica function is "
        "XLA-compiled on GPUs), which TensorFlow forbids inside loops and "
        "nested functions. tfp.mcmc.NoUTurnSampler fails alike (it calls "
        "the target in a tf.while_loop). Split the chains over the "
        "replicas instead of the data (experimental_chain_axis_names, with "
        "all the data on every replica)")
  return None
