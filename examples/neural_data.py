"""Seeded synthetic data with the shapes of the DyNet paper's workloads.

Sizes follow Neubig et al. 2017 ("On-the-fly operation batching in
dynamic computation graphs", Appendix C): word embeddings and LSTM states
of 256 for the BiLSTM tagger (WikiNER) and the TreeLSTM (Stanford
Sentiment Treebank); the variable-length RNN uses the same sizes.

How the data is made (all from one `numpy.random.default_rng(seed)`):

- Sentence lengths: ceil(Gamma(shape=4, scale=6)), clipped to
  [1, max_length]: mean about 24 tokens with a long tail past 50, as
  newswire and Wikipedia sentences have.
- Words: a Zipf (1/rank) distribution over the vocabulary, as word
  frequencies are.
- Tags (tagger): each word has a "natural" tag (its id modulo the tag
  count); a token gets it with probability 0.8, else a uniform tag, so the
  task is learnable but noisy.
- Trees (TreeLSTM): SST sentences are shorter (mean about 19 tokens,
  at most 56): lengths ceil(Gamma(3.5, 5.4)) clipped to [1, 56]. A binary
  bracketing splits each span at a uniformly random point, recursively,
  giving parse-like shapes of depth about log to linear in the length.
  Nodes are numbered in post-order (children before parents, the root
  last); a leaf has children -1 and its word id, an internal node word -1.
  The label (5 classes, as SST's fine-grained task) is the quintile of
  the mean of per-word sentiment scores.
- Sequences (RNN): sentence lengths and Zipf words; the label (5
  classes) is the first word's id modulo 5, which the LSTM must carry
  across the whole sequence.

Every example is padded to one shape (`max_length` tokens, `2 *
max_length - 1` nodes) so a batch is one tensor; lengths and roots say
where each example ends.
"""
import collections

import numpy as np

EMBEDDING_SIZE = 256
HIDDEN_SIZE = 256
VOCABULARY_SIZE = 10_000
NUM_TAGS = 9          # WikiNER's IOB tags over four entity types
NUM_CLASSES = 5       # SST's fine-grained sentiment
MAX_SENTENCE_LENGTH = 64
MAX_TREE_LEAVES = 56

Sentences = collections.namedtuple("Sentences", ["words", "tags", "lengths"])
Sequences = collections.namedtuple("Sequences",
                                   ["words", "lengths", "labels"])
Trees = collections.namedtuple(
    "Trees", ["left", "right", "words", "roots", "labels", "depths"])


def sentence_lengths(rng, count, max_length, shape=4.0, scale=6.0):
  lengths = np.ceil(rng.gamma(shape, scale, size=count)).astype(np.int32)
  return np.clip(lengths, 1, max_length)


def zipf_words(rng, count, vocabulary_size):
  ranks = np.arange(1, vocabulary_size + 1)
  p = 1.0 / ranks
  return rng.choice(vocabulary_size, size=count, p=p / p.sum()).astype(
      np.int32)


def sentences(count, seed=0, vocabulary_size=VOCABULARY_SIZE,
              num_tags=NUM_TAGS, max_length=MAX_SENTENCE_LENGTH):
  """Tagged sentences, padded to `max_length` (padding is word 0, tag 0)."""
  rng = np.random.default_rng(seed)
  lengths = sentence_lengths(rng, count, max_length)
  words = np.zeros([count, max_length], np.int32)
  tags = np.zeros([count, max_length], np.int32)
  for k, n in enumerate(lengths):
    w = zipf_words(rng, n, vocabulary_size)
    noisy = rng.random(n) < 0.2
    words[k, :n] = w
    tags[k, :n] = np.where(noisy, rng.integers(0, num_tags, n),
                           w % num_tags)
  return Sentences(words, tags, lengths)


def sequences(count, seed=0, vocabulary_size=VOCABULARY_SIZE,
              num_classes=NUM_CLASSES, max_length=MAX_SENTENCE_LENGTH):
  """Labelled sequences, padded to `max_length` with word 0."""
  s = sentences(count, seed, vocabulary_size, 1, max_length)
  labels = (s.words[:, 0] % num_classes).astype(np.int32)
  return Sequences(s.words, s.lengths, labels)


def _bracket(rng, first, last, left, right, words, sentence):
  """Appends the nodes of a random binary tree over sentence[first:last]
  in post-order; returns (root index, depth)."""
  if last - first == 1:
    left.append(-1)
    right.append(-1)
    words.append(sentence[first])
    return len(words) - 1, 1
  split = rng.integers(first + 1, last)
  l, dl = _bracket(rng, first, split, left, right, words, sentence)
  r, dr = _bracket(rng, split, last, left, right, words, sentence)
  left.append(l)
  right.append(r)
  words.append(-1)
  return len(words) - 1, 1 + max(dl, dr)


def trees(count, seed=0, vocabulary_size=VOCABULARY_SIZE,
          num_classes=NUM_CLASSES, max_leaves=MAX_TREE_LEAVES):
  """Random binary trees over Zipf sentences, as index arrays."""
  rng = np.random.default_rng(seed)
  lengths = sentence_lengths(rng, count, max_leaves, shape=3.5, scale=5.4)
  sentiment = rng.normal(size=vocabulary_size)
  max_nodes = 2 * max_leaves - 1
  out_left = np.full([count, max_nodes], -1, np.int32)
  out_right = np.full([count, max_nodes], -1, np.int32)
  out_words = np.full([count, max_nodes], -1, np.int32)
  roots = np.zeros([count], np.int32)
  depths = np.zeros([count], np.int32)
  means = np.zeros([count])
  for k, n in enumerate(lengths):
    sentence = zipf_words(rng, n, vocabulary_size)
    left, right, words = [], [], []
    roots[k], depths[k] = _bracket(rng, 0, n, left, right, words, sentence)
    out_left[k, :len(left)] = left
    out_right[k, :len(right)] = right
    out_words[k, :len(words)] = words
    means[k] = sentiment[sentence].mean()
  edges = np.quantile(means, np.linspace(0, 1, num_classes + 1)[1:-1])
  labels = np.searchsorted(edges, means).astype(np.int32)
  return Trees(out_left, out_right, out_words, roots, labels, depths)


def take(data, start, size):
  """Examples [start, start + size) of `data`, wrapping around."""
  index = (start + np.arange(size)) % len(data[0])
  return type(data)(*(x[index] for x in data))
