"""Selecting between batched values with a per-member mask."""
import numpy as np
import tensorflow as tf

from tfp_autobatch.runtime import batch_state


def test_where_broadcasts_the_mask_over_each_leafs_event_shape():
  mask = tf.constant([True, False, True])
  new = {"s": tf.constant([1, 2, 3]), "v": tf.ones([3, 2]),
         "m": tf.fill([3, 2, 2], 7)}
  old = {"s": tf.constant([-1, -2, -3]), "v": tf.zeros([3, 2]),
         "m": tf.zeros([3, 2, 2], tf.int32)}
  got = batch_state.where(mask, new, old)
  np.testing.assert_array_equal(got["s"], [1, -2, 3])
  np.testing.assert_array_equal(got["v"], [[1, 1], [0, 0], [1, 1]])
  np.testing.assert_array_equal(got["m"][:, 0, 0], [7, 0, 7])


def test_where_expands_the_mask_once_per_rank():
  """The VM selects every register a block writes: a slice of the mask per
  leaf cost a NUTS trace a thousand ops."""
  graph = tf.Graph()
  with graph.as_default():
    mask = tf.compat.v1.placeholder(tf.bool, [3])
    new = [tf.compat.v1.placeholder(tf.float32, [3] + [2] * (i % 2))
           for i in range(10)]
    before = len(graph.get_operations())
    batch_state.where(mask, new, new)
    ops = [op.type for op in graph.get_operations()[before:]]
  assert ops.count("SelectV2") == 10
  assert ops.count("StridedSlice") == 1
