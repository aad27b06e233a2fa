"""A training step: the gradient of the batch's mean loss, then a Keras
optimizer update of the model's shared weights.

`mean_loss(model, data, backend)` is a workload's batched loss
(`tree_lstm.mean_loss`, ...); the gradient flows through the batched
program on every backend (`pc:xla` called eagerly, as here; see
docs/backends.md, "Gradients"), reaching every `tf.Variable` the program
reads.
"""
import tensorflow as tf

from examples import bilstm_tagger
from examples import neural_data
from examples import per_example
from examples import rnn_classifier
from examples import tree_lstm


def gradients(mean_loss, model, data, backend=None):
  """(loss, gradients of `model.trainable_variables`) of one batch."""
  with tf.GradientTape() as tape:
    loss = mean_loss(model, data, backend=backend)
  return loss, tape.gradient(loss, model.trainable_variables)


def train_step(mean_loss, model, data, optimizer, backend=None):
  """One optimizer step on the batch `data`; returns the loss before it."""
  loss, grads = gradients(mean_loss, model, data, backend)
  optimizer.apply_gradients(zip(grads, model.trainable_variables))
  return loss


def per_example_gradients(example_loss, model, data):
  """The same as `gradients`, with the per-example plain-TF model."""
  with tf.GradientTape() as tape:
    loss = per_example.mean_loss(example_loss, model, data)
  return loss, tape.gradient(loss, model.trainable_variables)


class Workload:
  """A model, its data maker and its losses, batched and per example."""

  def __init__(self, name, make_model, make_data, batched_loss,
               example_loss, inputs, forward):
    self.name = name
    self.make_model = make_model      # (**sizes) -> tf.Module
    self.make_data = make_data        # (count, seed, **sizes) -> data
    self.batched_loss = batched_loss  # (model, data, backend) -> scalar
    self.example_loss = example_loss  # (model, data, k) -> scalar
    self.inputs = inputs              # data -> the batched call's arguments
    self.forward = forward            # model -> the batched function


WORKLOADS = {
    "tree_lstm": Workload(
        "tree_lstm",
        lambda **kw: tree_lstm.TreeLSTM(**kw),
        neural_data.trees, tree_lstm.mean_loss, per_example.tree_loss,
        tree_lstm.inputs, lambda model: model.logits),
    "bilstm_tagger": Workload(
        "bilstm_tagger",
        lambda **kw: bilstm_tagger.BiLSTMTagger(**kw),
        neural_data.sentences, bilstm_tagger.mean_loss,
        per_example.tagger_loss, bilstm_tagger.inputs,
        lambda model: model.sentence_loss),
    "rnn_classifier": Workload(
        "rnn_classifier",
        lambda **kw: rnn_classifier.RNNClassifier(**kw),
        neural_data.sequences, rnn_classifier.mean_loss,
        per_example.rnn_loss, rnn_classifier.inputs,
        lambda model: model.logits),
}
