"""The three models in plain TensorFlow, one example at a time.

What a user writes without batching: Python control flow over NumPy
indices, TensorFlow ops on one example's vectors, eagerly. The tests
check the batched models' results and gradients against these, and the
benchmark measures them as the floor. They share only the cells (the
per-step math) with the batched models.
"""
import tensorflow as tf

from examples import cells


def tree_logits(model, left, right, words, root):
  """One tree's root logits, recursing in Python."""
  def state(node):
    if left[node] < 0:
      return cells.tree_leaf(model.cell,
                             tf.gather(model.embedding, words[node]))
    h_left, c_left = state(left[node])
    h_right, c_right = state(right[node])
    return cells.tree_node(model.cell, h_left, c_left, h_right, c_right)
  return cells.dense(model.output, state(root)[0])


def tree_loss(model, trees, k):
  logits = tree_logits(model, trees.left[k], trees.right[k], trees.words[k],
                       trees.roots[k])
  return cells.cross_entropy(logits, trees.labels[k])


def sentence_loss(model, words, tags, length):
  """One sentence's summed tag cross-entropy, looping in Python."""
  hidden = model.forward.hidden_size
  h, c = tf.zeros([hidden]), tf.zeros([hidden])
  forward_states = []
  for i in range(length):
    h, c = cells.lstm_cell(model.forward,
                           tf.gather(model.embedding, words[i]), h, c)
    forward_states.append(h)
  h, c = tf.zeros([hidden]), tf.zeros([hidden])
  loss = tf.constant(0.0)
  for i in reversed(range(length)):
    h, c = cells.lstm_cell(model.backward,
                           tf.gather(model.embedding, words[i]), h, c)
    logits = cells.dense(model.output, tf.concat([forward_states[i], h], 0))
    loss += cells.cross_entropy(logits, tags[i])
  return loss


def tagger_loss(model, sentences, k):
  return sentence_loss(model, sentences.words[k], sentences.tags[k],
                       sentences.lengths[k])


def sequence_logits(model, words, length):
  """One sequence's logits, looping in Python."""
  hidden = model.lstm.hidden_size
  h, c = tf.zeros([hidden]), tf.zeros([hidden])
  for i in range(length):
    h, c = cells.lstm_cell(model.lstm, tf.gather(model.embedding, words[i]),
                           h, c)
  return cells.dense(model.output, h)


def rnn_loss(model, sequences, k):
  logits = sequence_logits(model, sequences.words[k], sequences.lengths[k])
  return cells.cross_entropy(logits, sequences.labels[k])


def mean_loss(example_loss, model, data):
  """The batch's mean loss, one example at a time."""
  count = len(data[0])
  return tf.add_n([example_loss(model, data, k) for k in range(count)]) / count
