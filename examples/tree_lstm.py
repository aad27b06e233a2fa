"""A binary TreeLSTM sentiment classifier, written for ONE tree.

A tree is three index arrays over its nodes (`neural_data.trees`): the
left and right child of each node (-1 at a leaf) and each leaf's word id,
and the index of its root. `node_state` recurses over node indices as the
model is defined; `@tab.batch` runs it on a batch of trees of different
shapes, every member at its own recursion depth.
"""
import tensorflow as tf

import tfp_autobatch as tab
from examples import cells
from examples import neural_data


class TreeLSTM(tf.Module):
  """Weights shared by all trees; `logits` is the batched model.

  `logits(left, right, words, root)` takes a batch of trees (arrays of
  shape [batch, nodes] and [batch]) and returns the root classifier's
  logits, [batch, num_classes].
  """

  def __init__(self, vocabulary_size=neural_data.VOCABULARY_SIZE,
               embedding_size=neural_data.EMBEDDING_SIZE,
               hidden_size=neural_data.HIDDEN_SIZE,
               num_classes=neural_data.NUM_CLASSES, max_depth=48, seed=0,
               batched_cells=False):
    super().__init__(name="tree_lstm")
    self.embedding = tf.Variable(tf.random.stateless_uniform(
        [vocabulary_size, embedding_size], [seed, 0], -0.1, 0.1),
                                 name="embedding")
    self.cell = cells.TreeCellWeights(embedding_size, hidden_size, seed + 1)
    self.output = cells.DenseWeights(hidden_size, num_classes, seed + 3)
    self.logits = _batched_logits(self, max_depth, batched_cells)


def _batched_logits(model, max_depth, batched_cells):
  """The model written for one tree, batched (weights by closure).

  With `batched_cells`, the two cells are `@tab.batched_primitive`s: each
  runs once on the rows of every tree whose recursion reaches it, which
  the program-counter backends gather (other code runs on every row,
  masked), instead of being vectorised with the per-example code.
  """
  embedding, cell, output = model.embedding, model.cell, model.output

  def leaf(x):
    return cells.tree_leaf(cell, x)

  def node(h_left, c_left, h_right, c_right):
    return cells.tree_node(cell, h_left, c_left, h_right, c_right)

  if batched_cells:
    # Costly per row, called from two blocks: buckets at every 3/4 step
    # compute fewer padded rows than halvings for a few more compilations.
    leaf = tab.batched_primitive(leaf, fine_buckets=True)
    node = tab.batched_primitive(node, fine_buckets=True)

  @tab.batch(max_stack_depth=max_depth)
  def node_state(left, right, words, n):
    if left[n] < 0:
      h, c = leaf(cells.embed(embedding, words[n]))
      return h, c
    h_left, c_left = node_state(left, right, words, left[n])
    h_right, c_right = node_state(left, right, words, right[n])
    h, c = node(h_left, c_left, h_right, c_right)
    return h, c

  @tab.batch(max_stack_depth=max_depth)
  def tree_logits(left, right, words, root):
    h, _ = node_state(left, right, words, root)
    return cells.dense(output, h)

  return tree_logits


def inputs(trees):
  """The batched model's arguments for `neural_data.Trees`."""
  return trees.left, trees.right, trees.words, trees.roots


def mean_loss(model, trees, backend=None):
  """The batch's mean cross-entropy of the root labels."""
  logits = model.logits(*inputs(trees), backend=backend)
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=trees.labels, logits=logits))
