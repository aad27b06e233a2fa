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


def test_where_takes_a_row_mask_as_it_is():
  """The VM selects every register a block writes: TensorFlow's first
  Select takes a mask of the rows for a leaf of any rank, with no
  expanded mask per leaf (a slice each cost a NUTS trace a thousand ops)
  and without SelectV2's broadcasting (about 1 us a call on a CPU)."""
  graph = tf.Graph()
  with graph.as_default():
    mask = tf.compat.v1.placeholder(tf.bool, [3])
    new = [tf.compat.v1.placeholder(tf.float32, [3] + [2] * (i % 2))
           for i in range(10)]
    before = len(graph.get_operations())
    batch_state.where(mask, new, new)
    ops = [op.type for op in graph.get_operations()[before:]]
  assert ops == ["Select"] * 10


def test_where_under_xla_broadcasts_a_row_mask_with_select_v2():
  """TensorFlow's bridge to XLA lowers the first Select through MLIR,
  far longer to compile than SelectV2 for the same computation: under
  XLA the mask is broadcast once per rank instead."""
  seen = []
  @tf.function(jit_compile=True)
  def select(mask, a, b):
    before = len(tf.compat.v1.get_default_graph().get_operations())
    out = batch_state.where(mask, [a, b, a], [b, a, b])
    seen.extend(op.type for op in
                tf.compat.v1.get_default_graph().get_operations()[before:])
    return out
  mask = tf.constant([True, False, True])
  a, b = tf.ones([3, 2]), tf.zeros([3, 2])
  got = select(mask, a, b)
  np.testing.assert_array_equal(got[0], [[1, 1], [0, 0], [1, 1]])
  np.testing.assert_array_equal(got[1], [[0, 0], [1, 1], [0, 0]])
  assert "Select" not in seen
  assert seen.count("SelectV2") == 3


def test_where_expands_a_wider_mask_once_per_rank():
  graph = tf.Graph()
  with graph.as_default():
    mask = tf.compat.v1.placeholder(tf.bool, [3, 2])
    new = [tf.compat.v1.placeholder(tf.float32, [3, 2, 4])
           for _ in range(5)]
    before = len(graph.get_operations())
    batch_state.where(mask, new, new)
    ops = [op.type for op in graph.get_operations()[before:]]
  assert ops.count("SelectV2") == 5
  assert ops.count("StridedSlice") == 1


def test_where_in_a_function_expands_a_mask_once_for_every_call():
  """A block selects most of its registers with one mask, over several
  calls: in a function graph its broadcast is made once, and a branch
  (a graph of its own) makes its own."""
  counts = {}
  @tf.function(jit_compile=True)
  def select(mask, a, b):
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    first = batch_state.where(mask, a, b)
    second = batch_state.where(mask, [b, a], [a, b])
    counts["outer"] = [op.type for op in graph.get_operations()[before:]
                       ].count("StridedSlice")
    def branch():
      inner = tf.compat.v1.get_default_graph()
      start = len(inner.get_operations())
      out = batch_state.where(mask, a, b)
      counts["branch"] = [op.type for op in inner.get_operations()[start:]
                          ].count("StridedSlice")
      return out
    third = tf.cond(tf.reduce_any(mask), branch, lambda: b)
    return first, second, third
  mask = tf.constant([True, False])
  a, b = tf.ones([2, 3, 2]), tf.zeros([2, 3, 2])
  first, (second_a, second_b), third = select(mask, a, b)
  assert counts == {"outer": 1, "branch": 1}
  expected = np.broadcast_to(np.reshape([1., 0.], [2, 1, 1]), [2, 3, 2])
  for got, want in [(first, expected), (second_a, 1 - expected),
                    (second_b, expected), (third, expected)]:
    np.testing.assert_array_equal(got, want)


def test_where_selects_rows_of_any_rank():
  mask = tf.constant([True, False, True])
  new = (tf.ones([3]), tf.ones([3, 2], tf.int32), tf.ones([3, 2, 2]))
  old = tf.nest.map_structure(tf.zeros_like, new)
  got = batch_state.where(mask, new, old)
  for g, n in zip(got, new):
    rows = np.reshape([1, 0, 1], [3] + [1] * (n.shape.rank - 1))
    np.testing.assert_array_equal(g, np.broadcast_to(rows, n.shape))


def test_take_returns_a_value_of_that_many_rows_as_it_is():
  """The local runtime takes the real rows of every call's result; an
  eager slice costs about 0.25 ms, so a result without padding is not
  sliced."""
  whole = {"a": tf.constant([1, 2, 3]), "b": tf.ones([3, 2])}
  same = batch_state.take(whole, 3)
  assert same["a"] is whole["a"] and same["b"] is whole["b"]
  first = batch_state.take(whole, 2)
  np.testing.assert_array_equal(first["a"], [1, 2])
  assert first["b"].shape == (2, 2)
