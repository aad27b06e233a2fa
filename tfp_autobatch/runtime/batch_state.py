"""Operations on batched values (nests of tensors with a leading batch dim).

Both strategies use these to read and write the state of a subset of the
batch: gather the members that run a block, scatter their results back, or
select with a mask.
"""
import numpy as np
import tensorflow as tf

from tfp_autobatch.runtime import _tf_private


def size(x, axis=0):
  """The size of `x`'s dimension `axis`: a Python int where the shape
  knows it (under `pc:xla`, which traces once per batch size, the batch
  size always), else a scalar tensor. A static size costs the trace no
  ops: `tf.shape(x)[0]` is five (a NUTS trace took it a few hundred
  times)."""
  static = x.shape[axis]
  return static if static is not None else tf.shape(x)[axis]


def row_indices(n):
  """`[0, 1, ..., n - 1]` as int32: one constant when `n` is a Python int
  (see `size`), else `tf.range(n)`."""
  if isinstance(n, int):
    return tf.constant(np.arange(n, dtype=np.int32))
  return tf.range(n)


def gather(value, indices):
  return tf.nest.map_structure(lambda x: tf.gather(x, indices), value)


def scatter(old, indices, new):
  """`old` with rows `indices` replaced by the rows of `new`."""
  idx = tf.expand_dims(indices, -1)
  return tf.nest.map_structure(
      lambda o, n: tensor_scatter_nd_update(o, idx, n), old, new)


def tensor_scatter_nd_update(tensor, indices, updates):
  """`tf.tensor_scatter_nd_update`, also where `tensor` has no elements
  (a per-example shape such as [0]; a static dimension 0): there is
  nothing to write, and `tensor` is returned as it is. TensorFlow rejects
  any index into a tensor with no elements, also one whose updates have
  none: its kernel when it runs, shape inference where the shape is
  known, XLA when it compiles."""
  if 0 in tensor.shape:
    return tensor
  return tf.tensor_scatter_nd_update(tensor, indices, updates)


def with_rows(value, n, message):
  """`value` (a nest), each leaf checked when the graph runs to have `n`
  rows: assertions that every leaf waits for through a `tf.identity`
  (TensorFlow's graph optimiser drops a reshape it finds redundant, and
  its control dependencies with it), then a reshape to `n` rows, which
  fails where XLA drops the assertions."""
  checks = [tf.debugging.assert_equal(tf.shape(x)[0], n, message=message)
            for x in tf.nest.flatten(value)]
  def checked(x):
    with tf.control_dependencies(checks):
      x = tf.identity(x)
    rows = tf.reshape(x, tf.concat([[n], tf.shape(x)[1:]], 0))
    rows.set_shape(x.shape)
    return rows
  return tf.nest.map_structure(checked, value)


def where(mask, new, old):
  """`new` where `mask`, else `old`; `mask` covers the leading dims of each leaf.

  The mask is broadcast by static rank, so static shapes survive (which
  `tf.while_loop` needs of its loop state).
  """
  rows_select = mask.shape.rank == 1 and not _tf_private.in_xla_context()
  made = _broadcastable_masks()
  def leaf(n, o):
    if (rows_select and n.shape.rank == o.shape.rank
        and n.shape.is_compatible_with(o.shape)):
      # TensorFlow's first Select takes a mask of the rows as it is, and
      # skips SelectV2's broadcasting, which every VM step of `pc:graph`
      # pays several times. Not under XLA: its bridge lowers that Select
      # through MLIR, one small module per op, far longer to compile than
      # SelectV2 for the same computation (a NUTS step has hundreds).
      return tf.raw_ops.Select(condition=mask, x=n, y=o)
    return tf.where(
        _broadcastable(mask, n.shape.rank - mask.shape.rank, made), n, o)
  return tf.nest.map_structure(leaf, new, old)


# Where a function graph keeps its masks made broadcastable, by (mask,
# trailing axes): {(mask.ref(), extra): mask[..., None, ...]}.
_BROADCASTABLE_MASKS = "_tfp_autobatch_broadcastable_masks"


def _broadcastable_masks():
  """Where `where` keeps the masks it made broadcastable (`_broadcastable`).

  In a function graph, the graph's own: a slice costs the trace four ops,
  and the blocks of a batched program select most of their registers
  with a few masks (a NUTS step's trace sliced them about 120 times).
  Elsewhere (eagerly, or in a TF1 graph, whose control-flow contexts
  could not share a tensor between branches) one call's."""
  graph = tf.compat.v1.get_default_graph()
  if tf.executing_eagerly() or not graph.building_function:
    return {}
  made = getattr(graph, _BROADCASTABLE_MASKS, None)
  if made is None:
    made = {}
    setattr(graph, _BROADCASTABLE_MASKS, made)
  return made


def _broadcastable(mask, extra, made):
  """`mask` with `extra` trailing axes of size 1, to select leaves of
  higher rank with; made once per mask and rank in `made`."""
  if extra == 0:
    return mask
  key = (mask.ref(), extra)
  if key not in made:
    made[key] = mask[(Ellipsis,) + (None,) * extra]
  return made[key]


def take(value, count):
  """The first `count` rows (a value of `count` rows as it is: an eager
  slice is costly, and a local call's result is sliced at every
  return)."""
  return tf.nest.map_structure(
      lambda x: x if x.shape[:1] == [count] else x[:count], value)
