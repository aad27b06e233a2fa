"""Dynamic neural networks written for one example and run batched.

Three workloads from the dynamic-batching literature (DyNet's on-the-fly
batching, ACRoBat, MXNet's JIT dynamic batching), each a `@tab.batch`
function over ONE tree, sentence or sequence, with weights shared by all
examples as `tf.Variable`s captured by closure:

- `tree_lstm`: a binary (N-ary, N = 2) TreeLSTM (Tai et al. 2015) with a
  sentiment classifier at the root, recursing over node indices.
- `bilstm_tagger`: a BiLSTM tagger over a sentence of its own length.
- `rnn_classifier`: an LSTM over a sequence of its own length with one
  label per sequence.

`neural_data` makes their seeded synthetic data; `per_example` is the same
models written in plain TensorFlow for one example at a time, the
reference the tests check results and gradients against (and the floor
the benchmark measures). Like `benchmarks`, this package runs from a
checkout (`python -m benchmarks.neural`) and is not installed.
"""
