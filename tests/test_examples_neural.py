"""The dynamic neural network examples (`examples/`): batched results and
gradients equal the per-example plain-TF models', on every backend (all
differentiate; pc:xla eagerly), and a few training steps lower the
loss."""
import numpy as np
import pytest
import tensorflow as tf

import tfp_autobatch as tab
from examples import bilstm_tagger
from examples import neural_data
from examples import per_example
from examples import rnn_classifier
from examples import training
from examples import tree_lstm

# XLA compiles each segment (`local:eager_xla`) or the whole VM (`pc:xla`)
# per shape: 5 to 50 s on a loaded 2-core machine.
_XLA = pytest.mark.slow
DIFFERENTIABLE = ("local:eager", pytest.param("local:eager_xla", marks=_XLA),
                  "pc:eager", "pc:graph", pytest.param("pc:xla", marks=_XLA))
ALL_BACKENDS = [pytest.param(b, marks=_XLA) if b.endswith("xla") else b
                for b in tab.BACKENDS]
assert {"local:eager_xla", "pc:xla"} <= set(tab.BACKENDS)
SIZES = dict(vocabulary_size=40, embedding_size=6, hidden_size=5)
BATCH = 5


def _tree_case(batched_cells):
  model = tree_lstm.TreeLSTM(**SIZES, max_depth=12, seed=3,
                             batched_cells=batched_cells)
  data = neural_data.trees(BATCH, seed=4, vocabulary_size=40, max_leaves=9)
  return model, data, tree_lstm.mean_loss, per_example.tree_loss


def _tagger_case(batched_cells):
  model = bilstm_tagger.BiLSTMTagger(**SIZES, max_length=9, seed=3,
                                     batched_cells=batched_cells)
  data = neural_data.sentences(BATCH, seed=4, vocabulary_size=40,
                               max_length=9)
  return model, data, bilstm_tagger.mean_loss, per_example.tagger_loss


def _rnn_case(batched_cells):
  model = rnn_classifier.RNNClassifier(**SIZES, seed=3,
                                       batched_cells=batched_cells)
  data = neural_data.sequences(BATCH, seed=4, vocabulary_size=40,
                               max_length=9)
  return model, data, rnn_classifier.mean_loss, per_example.rnn_loss


CASES = {"tree_lstm": _tree_case, "bilstm_tagger": _tagger_case,
         "rnn_classifier": _rnn_case}


# Each model with its cells vectorised with the per-example code, and as
# `@tab.batched_primitive`s.
@pytest.fixture(scope="module",
                params=[(name, batched) for name in sorted(CASES)
                        for batched in (False, True)],
                ids=lambda p: p[0] + ("-batched_cells" if p[1] else ""))
def case(request):
  name, batched_cells = request.param
  return CASES[name](batched_cells)


def _dense(g):
  return tf.convert_to_tensor(g).numpy()


def test_data_has_varied_sizes_and_valid_trees():
  trees = neural_data.trees(300, seed=0)
  leaves = (trees.roots + 2) // 2
  assert leaves.min() <= 3 and leaves.max() > 40
  assert len(set(trees.depths)) > 5
  for k in range(300):   # children before parents, every node reached once
    internal = np.flatnonzero(trees.left[k, :trees.roots[k] + 1] >= 0)
    assert (trees.left[k, internal] < internal).all()
    assert (trees.right[k, internal] < internal).all()
    children = np.concatenate([trees.left[k, internal],
                               trees.right[k, internal]])
    assert sorted(children) == list(range(trees.roots[k]))
    assert (trees.words[k, internal] == -1).all()
  lengths = neural_data.sentences(500, seed=0).lengths
  assert lengths.min() <= 3 and lengths.max() >= 50


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_batched_loss_equals_per_example(case, backend):
  model, data, mean_loss, example_loss = case
  expected = per_example.mean_loss(example_loss, model, data)
  np.testing.assert_allclose(mean_loss(model, data, backend=backend),
                             expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", DIFFERENTIABLE)
def test_gradients_equal_per_example(case, backend):
  model, data, mean_loss, example_loss = case
  _, expected = training.per_example_gradients(example_loss, model, data)
  loss, grads = training.gradients(mean_loss, model, data, backend)
  assert np.isfinite(loss.numpy())
  for v, g, e in zip(model.trainable_variables, grads, expected):
    assert g is not None, v.name
    np.testing.assert_allclose(_dense(g), _dense(e), rtol=1e-4, atol=1e-6,
                               err_msg=v.name)
    # Every weight is reached (a gradient of zeros would pass trivially).
    assert np.abs(_dense(e)).max() > 0, v.name


# (pc:xla's gradients are checked above; its training steps, two more XLA
# compilations per model, nightly.)
@pytest.mark.parametrize("backend", ["pc:graph", pytest.param(
    "pc:xla", marks=[_XLA, pytest.mark.nightly])])
def test_training_steps_lower_the_loss(case, backend):
  model, data, mean_loss, _ = case
  optimizer = tf.keras.optimizers.Adam(0.1)
  losses = [float(training.train_step(mean_loss, model, data, optimizer,
                                      backend)) for _ in range(6)]
  assert losses[-1] < 0.9 * losses[0], losses


def test_pc_xla_gradient_of_a_table_past_a_million_elements():
  # XLA refused to compile pc:xla's gradient of an embedding table of
  # 10,000 x 256 (the benchmark's): it evaluated the table on the host to
  # prove the sparse gradient's shape constant.
  model = tree_lstm.TreeLSTM(vocabulary_size=4000, embedding_size=256,
                             hidden_size=4, max_depth=12, seed=3)
  data = neural_data.trees(3, seed=4, vocabulary_size=4000, max_leaves=5)
  _, expected = training.per_example_gradients(per_example.tree_loss, model,
                                               data)
  _, grads = training.gradients(tree_lstm.mean_loss, model, data, "pc:xla")
  for v, g, e in zip(model.trainable_variables, grads, expected):
    np.testing.assert_allclose(_dense(g), _dense(e), rtol=1e-4, atol=1e-6,
                               err_msg=v.name)


def test_a_sentence_of_the_longest_length_fits_the_taggers_recursion():
  # The tagger recurses once a token: a sentence of `max_length` tokens
  # reaches the deepest frame its stack holds.
  model = bilstm_tagger.BiLSTMTagger(**SIZES, max_length=4, seed=3)
  words = np.array([[3, 1, 4, 1], [5, 9, 0, 0]], np.int32)
  tags = np.array([[1, 2, 0, 3], [4, 1, 0, 0]], np.int32)
  data = neural_data.Sentences(words, tags, np.array([4, 2], np.int32))
  got = bilstm_tagger.mean_loss(model, data, backend="pc:graph")
  expected = np.mean([per_example.tagger_loss(model, data, k)
                      for k in range(2)])
  np.testing.assert_allclose(got, expected, rtol=1e-5)
