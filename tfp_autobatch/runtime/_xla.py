"""TensorFlow's private XLA operations, imported in this one place.

Only the XLA backend calls this. `computed_once(x)` is `x`, computed by
XLA into a buffer of its own. `overwrite_rows(buffer, rows, values)` sets
`buffer[rows[k]] = values[k]` with one XLA scatter. TensorFlow's public `tensor_scatter_nd_update` does the
same but rejects (at XLA compile time) indices into a buffer with no
elements, which an empty batch makes ([R, 0, ...] register banks). Under
XLA the write is in place inside a compiled loop, and rows past the end are
skipped.
"""
import functools

import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla as _xla
from tensorflow.compiler.xla import xla_data_pb2


@functools.lru_cache(maxsize=None)
def _keep_update(dtype):
  """The scatter's combiner: the update replaces the old value."""
  spec = tf.TensorSpec([], dtype)
  keep = tf.function(lambda old, new: new, autograph=False)
  return keep.get_concrete_function(spec, spec)


def overwrite_rows(buffer, rows, values):
  """`buffer` with `buffer[rows[k]] = values[k]`; rows [K] int32, values
  [K, ...buffer.shape[1:]]. Repeated rows must carry equal values."""
  rank = buffer.shape.rank
  numbers = xla_data_pb2.ScatterDimensionNumbers(
      update_window_dims=list(range(1, rank)),
      inserted_window_dims=[0],
      scatter_dims_to_operand_dims=[0],
      index_vector_dim=1)
  return _xla.scatter(buffer, rows[:, None], values,
                      _keep_update(buffer.dtype), numbers)


def computed_once(value):
  """`value` (floating point), computed by XLA into a buffer of its own
  rather than fused into each of its users, which may evaluate it again
  for every element they read of it.

  A sum over a leading axis of two, `value` and zeros: XLA on CPU does not
  fuse a reduction into the kernels that read its result, and keeps this
  one (its optimisation barrier, `tf2xla`'s `optimization_barrier`, is
  removed before fusion and changes nothing). The sum is `value`
  exactly (a zero of either sign reads as +0).
  """
  return tf.reduce_sum(tf.stack([value, tf.zeros_like(value)]), 0)
