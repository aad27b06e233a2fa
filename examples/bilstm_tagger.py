"""A BiLSTM tagger, written for ONE sentence of its own length.

The forward LSTM runs over the sentence's `length` tokens (a per-example
trip count) and keeps its states in a [max_length, hidden] table; the
backward LSTM then runs from the last token to the first, and at each
token scores the tags from both directions' states (one layer of 256 in
each direction, as in the DyNet paper's tagger). The result is the
sentence's summed tag cross-entropy.

The frontend has no assignment into `x[i]`, so the table is written with
`tf.where` on a one-hot row mask: one [max_length, hidden] select a token,
about a tenth of the cell's matrix-vector product at the default sizes.
"""
import tensorflow as tf

import tfp_autobatch as tab
from examples import cells
from examples import neural_data


class BiLSTMTagger(tf.Module):
  """Weights shared by all sentences; `sentence_loss` is the batched model.

  `sentence_loss(words, tags, length)` takes [batch, max_length] word and
  tag ids and [batch] lengths, and returns [batch] summed tag losses.
  """

  def __init__(self, vocabulary_size=neural_data.VOCABULARY_SIZE,
               embedding_size=neural_data.EMBEDDING_SIZE,
               hidden_size=neural_data.HIDDEN_SIZE,
               num_tags=neural_data.NUM_TAGS,
               max_length=neural_data.MAX_SENTENCE_LENGTH, seed=0,
               batched_cells=False):
    super().__init__(name="bilstm_tagger")
    self.max_length = max_length
    self.embedding = tf.Variable(tf.random.stateless_uniform(
        [vocabulary_size, embedding_size], [seed, 0], -0.1, 0.1),
                                 name="embedding")
    self.forward = cells.LSTMWeights(embedding_size, hidden_size, seed + 1)
    self.backward = cells.LSTMWeights(embedding_size, hidden_size, seed + 2)
    self.output = cells.DenseWeights(2 * hidden_size, num_tags, seed + 3)
    self.sentence_loss = _batched_loss(self, batched_cells)


def _batched_loss(model, batched_cells):
  """The model written for one sentence, batched (weights by closure).

  With `batched_cells`, the LSTM steps are `@tab.batched_primitive`s (see
  `tree_lstm`).
  """
  embedding, forward, backward = model.embedding, model.forward, model.backward
  output, max_length = model.output, model.max_length
  hidden_size = forward.hidden_size

  def forward_step(x, h, c):
    return cells.lstm_cell(forward, x, h, c)

  def backward_step(x, h, c):
    return cells.lstm_cell(backward, x, h, c)

  if batched_cells:
    forward_step = tab.batched_primitive(forward_step)
    backward_step = tab.batched_primitive(backward_step)

  @tab.batch
  def sentence_loss(words, tags, length):
    forward_states = tf.zeros([max_length, hidden_size])
    h = tf.zeros([hidden_size])
    c = tf.zeros([hidden_size])
    i = 0
    while i < length:
      h, c = forward_step(cells.embed(embedding, words[i]), h, c)
      forward_states = tf.where(
          tf.range(max_length)[:, None] == i, h[None, :], forward_states)
      i += 1
    h = tf.zeros([hidden_size])
    c = tf.zeros([hidden_size])
    loss = 0.0
    i = length - 1
    while i >= 0:
      h, c = backward_step(cells.embed(embedding, words[i]), h, c)
      logits = cells.dense(output, tf.concat([forward_states[i], h], 0))
      loss += cells.cross_entropy(logits, tags[i])
      i -= 1
    return loss

  return sentence_loss


def inputs(sentences):
  """The batched model's arguments for `neural_data.Sentences`."""
  return sentences.words, sentences.tags, sentences.lengths


def mean_loss(model, sentences, backend=None):
  """The batch's mean (over sentences) summed tag cross-entropy."""
  return tf.reduce_mean(model.sentence_loss(*inputs(sentences),
                                            backend=backend))
