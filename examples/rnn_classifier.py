"""An LSTM sequence classifier, written for ONE sequence of its own length.

The LSTM runs over the sequence's `length` tokens (a per-example trip
count); its last state is classified (one label per sequence).
"""
import tensorflow as tf

import tfp_autobatch as tab
from examples import cells
from examples import neural_data


class RNNClassifier(tf.Module):
  """Weights shared by all sequences; `logits` is the batched model.

  `logits(words, length)` takes [batch, max_length] word ids and [batch]
  lengths, and returns [batch, num_classes] logits.
  """

  def __init__(self, vocabulary_size=neural_data.VOCABULARY_SIZE,
               embedding_size=neural_data.EMBEDDING_SIZE,
               hidden_size=neural_data.HIDDEN_SIZE,
               num_classes=neural_data.NUM_CLASSES, seed=0,
               batched_cells=False):
    super().__init__(name="rnn_classifier")
    self.embedding = tf.Variable(tf.random.stateless_uniform(
        [vocabulary_size, embedding_size], [seed, 0], -0.1, 0.1),
                                 name="embedding")
    self.lstm = cells.LSTMWeights(embedding_size, hidden_size, seed + 1)
    self.output = cells.DenseWeights(hidden_size, num_classes, seed + 3)
    self.logits = _batched_logits(self, batched_cells)


def _batched_logits(model, batched_cells):
  """The model written for one sequence, batched (weights by closure).

  With `batched_cells`, the LSTM step is a `@tab.batched_primitive` (see
  `tree_lstm`).
  """
  embedding, lstm, output = model.embedding, model.lstm, model.output
  hidden_size = lstm.hidden_size

  def step(x, h, c):
    return cells.lstm_cell(lstm, x, h, c)

  if batched_cells:
    step = tab.batched_primitive(step)

  @tab.batch
  def sequence_logits(words, length):
    h = tf.zeros([hidden_size])
    c = tf.zeros([hidden_size])
    i = 0
    while i < length:
      h, c = step(cells.embed(embedding, words[i]), h, c)
      i += 1
    return cells.dense(output, h)

  return sequence_logits


def inputs(sequences):
  """The batched model's arguments for `neural_data.Sequences`."""
  return sequences.words, sequences.lengths


def mean_loss(model, sequences, backend=None):
  """The batch's mean cross-entropy of the sequence labels."""
  logits = model.logits(*inputs(sequences), backend=backend)
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=sequences.labels, logits=logits))
