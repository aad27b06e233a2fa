"""LSTM cells, shared by the batched and per-example code.

Each cell is plain TensorFlow on one example's vectors, or on a batch of
them (a leading axis): a `@tab.batch` function calls it as an ordinary
helper (its ops run per example and are vectorised with the rest of the
straight-line code), or wrapped in `@tab.batched_primitive` (it then runs
once on the rows of all members that reach it); `per_example` calls it
eagerly on one example. The weights are `tf.Variable`s held by
`tf.Module`s, so `module.trainable_variables` is what an optimizer updates.

A single example's vector-matrix product is written `matmul(x[None], w)`,
not `matvec(w, x, transpose_a=True)`: pfor turns the first into one
[batch, in] x [in, out] product, and the second into a batched product
that XLA ran about 4x slower (the LSTM classifier on `pc:xla`, batch 64).
"""
import tensorflow as tf


def _glorot(seed, shape):
  return tf.keras.initializers.GlorotUniform(seed=seed)(shape)


class LSTMWeights(tf.Module):
  """One LSTM: a [input + hidden, 4 * hidden] matrix and a bias, gates in
  the order input, forget, output, candidate (forget bias starts at 1)."""

  def __init__(self, input_size, hidden_size, seed, name=None):
    super().__init__(name=name)
    self.hidden_size = hidden_size
    self.kernel = tf.Variable(
        _glorot(seed, [input_size + hidden_size, 4 * hidden_size]),
        name="kernel")
    self.bias = tf.Variable(tf.concat([
        tf.zeros([hidden_size]), tf.ones([hidden_size]),
        tf.zeros([2 * hidden_size])], 0), name="bias")


def affine(x, kernel, bias):
  """x @ kernel + bias for one example's vector `x` or a batch of them."""
  if x.shape.rank == 1:
    return tf.matmul(x[None, :], kernel)[0] + bias
  return tf.matmul(x, kernel) + bias


def lstm_cell(weights, x, h, c):
  """One step of an LSTM on the input `x` and state (h, c)."""
  gates = affine(tf.concat([x, h], -1), weights.kernel, weights.bias)
  i, f, o, u = tf.split(gates, 4, axis=-1)
  c = tf.sigmoid(i) * tf.tanh(u) + tf.sigmoid(f) * c
  return tf.sigmoid(o) * tf.tanh(c), c


class TreeCellWeights(tf.Module):
  """A binary N-ary TreeLSTM cell (Tai et al. 2015, section 3.2): leaves
  read a word (gates i, o, u); internal nodes read their two children's
  states (gates i, f_left, f_right, o, u), with no word of their own, as
  in the constituency TreeLSTM on the Stanford Sentiment Treebank."""

  def __init__(self, input_size, hidden_size, seed, name=None):
    super().__init__(name=name)
    self.hidden_size = hidden_size
    self.leaf_kernel = tf.Variable(
        _glorot(seed, [input_size, 3 * hidden_size]), name="leaf_kernel")
    self.leaf_bias = tf.Variable(tf.zeros([3 * hidden_size]),
                                 name="leaf_bias")
    self.node_kernel = tf.Variable(
        _glorot(seed + 1, [2 * hidden_size, 5 * hidden_size]),
        name="node_kernel")
    self.node_bias = tf.Variable(tf.concat([
        tf.zeros([hidden_size]), tf.ones([2 * hidden_size]),
        tf.zeros([2 * hidden_size])], 0), name="node_bias")


def tree_leaf(weights, x):
  """A leaf's (h, c) from its word vector `x` (no children)."""
  gates = affine(x, weights.leaf_kernel, weights.leaf_bias)
  i, o, u = tf.split(gates, 3, axis=-1)
  c = tf.sigmoid(i) * tf.tanh(u)
  return tf.sigmoid(o) * tf.tanh(c), c


def tree_node(weights, h_left, c_left, h_right, c_right):
  """An internal node's (h, c) from its two children's states."""
  gates = affine(tf.concat([h_left, h_right], -1), weights.node_kernel,
                 weights.node_bias)
  i, f_left, f_right, o, u = tf.split(gates, 5, axis=-1)
  c = (tf.sigmoid(i) * tf.tanh(u) + tf.sigmoid(f_left) * c_left
       + tf.sigmoid(f_right) * c_right)
  return tf.sigmoid(o) * tf.tanh(c), c


class DenseWeights(tf.Module):
  """An affine output layer: logits = x @ kernel + bias."""

  def __init__(self, input_size, output_size, seed, name=None):
    super().__init__(name=name)
    self.kernel = tf.Variable(_glorot(seed, [input_size, output_size]),
                              name="kernel")
    self.bias = tf.Variable(tf.zeros([output_size]), name="bias")


def dense(weights, x):
  return affine(x, weights.kernel, weights.bias)


def embed(table, word):
  """Row `word` of the embedding `table` (a `tf.Variable`), for one example.

  Read as a tensor first: pfor has no rule for a gather straight from a
  variable (`ResourceGather`) and would run it as a loop over the batch.
  """
  return tf.gather(table.read_value(), word)


def cross_entropy(logits, label):
  """-log softmax(logits)[label] for one example's logits and label."""
  return tf.reduce_logsumexp(logits) - tf.gather(logits, label)
