"""Every trajectory's draw of a fused step, as `NUTSKernelResults`'
`trajectory_states`.

With `num_trajectories_per_step=k`, one `one_step` runs k NUTS transitions
per chain, and each of them ends in a draw of the target. The step's
returned state is the last; `trajectory_states` holds all k, in order, in
the state's structure with a leading axis of k: a part of shape
[chains..., event...] becomes [k, chains..., event...]. To keep all of
them from `tfp.mcmc.sample_chain`, trace that field:

    draws = tfp.mcmc.sample_chain(
        n, init, kernel=kernel, seed=seed,
        trace_fn=lambda _, r: r.trajectory_states)[1]   # [n, k, chains, ...]

(under an adaptation kernel, `r.inner_results.trajectory_states`), and to
hand them to ArviZ as n * k draws per chain, `flatten_draws(draws)` (or
reshape to [n * k, chains, ...] and swap the first two axes):

    arviz.from_dict(posterior={"x": trajectory_draws.flatten_draws(draws)})
"""
import tensorflow as tf

__all__ = ["initial", "from_flat", "flatten_draws"]


def initial(parts, num_trajectories):
  """`trajectory_states` before any step: each start repeated k times."""
  return [tf.repeat(p[tf.newaxis], num_trajectories, axis=0) for p in parts]


def from_flat(trajectory_q, num_trajectories, sizes, chain_shape,
              event_shapes):
  """The parts of the draws [chains, k, d] the batched program returned
  (state parts flattened and concatenated), as [k, chains..., event...].
  Reshaped to [chains, k, d] first: in a TF1 graph with unknown chain
  counts the program's result can lose its static rank."""
  k = num_trajectories
  trajectory_q = tf.reshape(trajectory_q, [-1, k, sum(sizes)])
  by_trajectory = tf.transpose(trajectory_q, [1, 0, 2])
  return [tf.reshape(v, tf.concat([[k], chain_shape, s], 0))
          for v, s in zip(tf.split(by_trajectory, sizes, axis=-1),
                          event_shapes)]


def flatten_draws(draws):
  """Traced `trajectory_states` of shape [n, k, chains, event...] as
  [chains, n * k, event...], the (chain, draw) layout ArviZ reads; the k
  draws of a step stay in trajectory order. A NumPy array or tensor (or a
  structure of them, the state's)."""
  def one(x):
    x = tf.convert_to_tensor(x)
    shape = tf.shape(x)
    merged = tf.reshape(x, tf.concat([[shape[0] * shape[1]], shape[2:]], 0))
    perm = tf.concat([[1, 0], tf.range(2, tf.rank(merged))], 0)
    return tf.transpose(merged, perm).numpy()
  return tf.nest.map_structure(one, draws)
