"""Operations on batched values (nests of tensors with a leading batch dim).

Both strategies use these to read and write the state of a subset of the
batch: gather the members that run a block, scatter their results back, or
select with a mask.
"""
import tensorflow as tf


def gather(value, indices):
  return tf.nest.map_structure(lambda x: tf.gather(x, indices), value)


def scatter(old, indices, new):
  """`old` with rows `indices` replaced by the rows of `new`."""
  idx = tf.expand_dims(indices, -1)
  return tf.nest.map_structure(
      lambda o, n: tf.tensor_scatter_nd_update(o, idx, n), old, new)


def where(mask, new, old):
  """Rows of `new` where `mask`, else rows of `old`."""
  def leaf(n, o):
    m = tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones(tf.rank(n) - 1,
                                                            tf.int32)], 0))
    return tf.where(m, n, o)
  return tf.nest.map_structure(leaf, new, old)


def take(value, count):
  """The first `count` rows."""
  return tf.nest.map_structure(lambda x: x[:count], value)


def batch_size(value):
  leaves = tf.nest.flatten(value)
  return tf.shape(leaves[0])[0] if leaves else 0
