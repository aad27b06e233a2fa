"""The three `examples/` models in DyNet, and a worker process that times them.

DyNet (`dynet38` on PyPI, the optional `[dynet]` extra) is the peer of
issue 46: each model is written for one example, as in `examples/`, with
the same cell math (`examples/cells.py`) and sizes, and DyNet batches
the operations of a minibatch's graph itself. Its strategy is fixed when
the module is imported (`dynet_config.set(autobatch=...)`: 0 none, 1
agenda-based, 2 depth-based, as in DyNet's `--dynet-autobatch`), so each
strategy runs in a worker process of its own:

    python -m benchmarks.neural_dynet --autobatch=1 --data=pool.npz

It reads one JSON command a line on stdin and answers one JSON line:
`{"workload", "mode", "batch_size", "calls"}` -> `{"seconds"}` for
`calls` calls (a call is one minibatch: a new graph, its mean loss's
value, and in mode "training" its backward pass and an Adam update).
"""
import json
import sys
import time

import numpy as np
from absl import app
from absl import flags

STRATEGIES = {"none": 0, "agenda": 1, "depth": 2}


def _lstm_params(pc, input_size, hidden):
  return (pc.add_parameters((4 * hidden, input_size + hidden)),
          pc.add_parameters(4 * hidden, init=np.concatenate([
              np.zeros(hidden), np.ones(hidden), np.zeros(2 * hidden)])))


def _lstm_cell(dy, params, hidden, x, h, c):
  kernel, bias = params
  gates = dy.affine_transform([bias, kernel, dy.concatenate([x, h])])
  i = dy.logistic(dy.pick_range(gates, 0, hidden))
  f = dy.logistic(dy.pick_range(gates, hidden, 2 * hidden))
  o = dy.logistic(dy.pick_range(gates, 2 * hidden, 3 * hidden))
  u = dy.tanh(dy.pick_range(gates, 3 * hidden, 4 * hidden))
  c = dy.cmult(i, u) + dy.cmult(f, c)
  return dy.cmult(o, dy.tanh(c)), c


class TreeLSTM:
  def __init__(self, dy, pc, sizes):
    v, e, h, k = (sizes["vocabulary_size"], sizes["embedding_size"],
                  sizes["hidden_size"], sizes["num_classes"])
    self.dy, self.hidden = dy, h
    self.embedding = pc.add_lookup_parameters((v, e))
    self.leaf_kernel = pc.add_parameters((3 * h, e))
    self.leaf_bias = pc.add_parameters(3 * h, init=0.0)
    self.node_kernel = pc.add_parameters((5 * h, 2 * h))
    self.node_bias = pc.add_parameters(5 * h, init=np.concatenate([
        np.zeros(h), np.ones(2 * h), np.zeros(2 * h)]))
    self.out_kernel = pc.add_parameters((k, h))
    self.out_bias = pc.add_parameters(k, init=0.0)

  def loss(self, example):
    dy, n = self.dy, self.hidden
    left, right, words, root, label = example

    def state(node):
      if left[node] < 0:
        g = dy.affine_transform([self.leaf_bias, self.leaf_kernel,
                                 self.embedding[words[node]]])
        i = dy.logistic(dy.pick_range(g, 0, n))
        o = dy.logistic(dy.pick_range(g, n, 2 * n))
        u = dy.tanh(dy.pick_range(g, 2 * n, 3 * n))
        c = dy.cmult(i, u)
        return dy.cmult(o, dy.tanh(c)), c
      h_left, c_left = state(left[node])
      h_right, c_right = state(right[node])
      g = dy.affine_transform([self.node_bias, self.node_kernel,
                               dy.concatenate([h_left, h_right])])
      i = dy.logistic(dy.pick_range(g, 0, n))
      f_left = dy.logistic(dy.pick_range(g, n, 2 * n))
      f_right = dy.logistic(dy.pick_range(g, 2 * n, 3 * n))
      o = dy.logistic(dy.pick_range(g, 3 * n, 4 * n))
      u = dy.tanh(dy.pick_range(g, 4 * n, 5 * n))
      c = (dy.cmult(i, u) + dy.cmult(f_left, c_left)
           + dy.cmult(f_right, c_right))
      return dy.cmult(o, dy.tanh(c)), c

    logits = dy.affine_transform([self.out_bias, self.out_kernel,
                                  state(root)[0]])
    return dy.pickneglogsoftmax(logits, label)

  @staticmethod
  def examples(pool):
    return [(l.tolist(), r.tolist(), w.tolist(), int(root), int(label))
            for l, r, w, root, label in zip(
                pool["left"], pool["right"], pool["words"], pool["roots"],
                pool["labels"])]


class BiLSTMTagger:
  def __init__(self, dy, pc, sizes):
    v, e, h, k = (sizes["vocabulary_size"], sizes["embedding_size"],
                  sizes["hidden_size"], sizes["num_tags"])
    self.dy, self.hidden = dy, h
    self.embedding = pc.add_lookup_parameters((v, e))
    self.forward = _lstm_params(pc, e, h)
    self.backward = _lstm_params(pc, e, h)
    self.out_kernel = pc.add_parameters((k, 2 * h))
    self.out_bias = pc.add_parameters(k, init=0.0)

  def loss(self, example):
    dy, n = self.dy, self.hidden
    words, tags = example
    h, c = dy.zeros(n), dy.zeros(n)
    forward_states = []
    for w in words:
      h, c = _lstm_cell(dy, self.forward, n, self.embedding[w], h, c)
      forward_states.append(h)
    h, c = dy.zeros(n), dy.zeros(n)
    losses = []
    for i in reversed(range(len(words))):
      h, c = _lstm_cell(dy, self.backward, n, self.embedding[words[i]], h, c)
      logits = dy.affine_transform([
          self.out_bias, self.out_kernel,
          dy.concatenate([forward_states[i], h])])
      losses.append(dy.pickneglogsoftmax(logits, tags[i]))
    return dy.esum(losses)

  @staticmethod
  def examples(pool):
    return [(w[:n].tolist(), t[:n].tolist()) for w, t, n in zip(
        pool["words"], pool["tags"], pool["lengths"])]


class RNNClassifier:
  def __init__(self, dy, pc, sizes):
    v, e, h, k = (sizes["vocabulary_size"], sizes["embedding_size"],
                  sizes["hidden_size"], sizes["num_classes"])
    self.dy, self.hidden = dy, h
    self.embedding = pc.add_lookup_parameters((v, e))
    self.lstm = _lstm_params(pc, e, h)
    self.out_kernel = pc.add_parameters((k, h))
    self.out_bias = pc.add_parameters(k, init=0.0)

  def loss(self, example):
    dy, n = self.dy, self.hidden
    words, label = example
    h, c = dy.zeros(n), dy.zeros(n)
    for w in words:
      h, c = _lstm_cell(dy, self.lstm, n, self.embedding[w], h, c)
    logits = dy.affine_transform([self.out_bias, self.out_kernel, h])
    return dy.pickneglogsoftmax(logits, label)

  @staticmethod
  def examples(pool):
    return [(w[:n].tolist(), int(y)) for w, n, y in zip(
        pool["words"], pool["lengths"], pool["labels"])]


MODELS = {"tree_lstm": TreeLSTM, "bilstm_tagger": BiLSTMTagger,
          "rnn_classifier": RNNClassifier}


class Worker:
  """The models of one DyNet process, built once, timed on command."""

  def __init__(self, dy, pools, sizes):
    self.dy = dy
    self.models, self.examples, self.trainers = {}, {}, {}
    # Kept: a collection Python frees takes its parameters with it, and
    # the trainer then updates freed memory (a crash or bad_alloc).
    self.collections = {}
    for name, pool in pools.items():
      pc = self.collections[name] = dy.ParameterCollection()
      self.models[name] = MODELS[name](dy, pc, sizes)
      self.examples[name] = MODELS[name].examples(pool)
      self.trainers[name] = dy.AdamTrainer(pc, alpha=0.001)

  def call(self, workload, mode, batch_size):
    dy, model = self.dy, self.models[workload]
    examples = self.examples[workload]
    dy.renew_cg()
    losses = [model.loss(examples[k % len(examples)])
              for k in range(batch_size)]
    loss = dy.esum(losses) / batch_size
    value = loss.value()
    if mode == "training":
      loss.backward()
      self.trainers[workload].update()
    return value

  def seconds(self, workload, mode, batch_size, calls):
    start = time.perf_counter()
    for _ in range(calls):
      self.call(workload, mode, batch_size)
    return time.perf_counter() - start


FLAGS = flags.FLAGS
flags.DEFINE_enum("autobatch", "agenda", list(STRATEGIES),
                  "DyNet's batching strategy.")
flags.DEFINE_string("data", None, "An .npz of the pools "
                    "(`<workload>/<field>` arrays) and `sizes` (JSON).")
flags.DEFINE_integer("memory_mb", 2048, "DyNet's memory pool.")


def main(argv):
  del argv
  import dynet_config  # pylint: disable=g-import-not-at-top
  dynet_config.set(mem=str(FLAGS.memory_mb), random_seed=1,
                   autobatch=STRATEGIES[FLAGS.autobatch])
  import dynet as dy  # pylint: disable=g-import-not-at-top
  with np.load(FLAGS.data) as data:
    sizes = json.loads(str(data["sizes"]))
    pools = {}
    for key in data.files:
      if "/" in key:
        workload, field = key.split("/")
        pools.setdefault(workload, {})[field] = data[key]
  worker = Worker(dy, pools, sizes)
  print(json.dumps({"ready": True}), flush=True)
  for line in sys.stdin:
    command = json.loads(line)
    try:
      seconds = worker.seconds(command["workload"], command["mode"],
                               command["batch_size"], command["calls"])
      print(json.dumps({"seconds": seconds}), flush=True)
    except Exception as e:  # pylint: disable=broad-except
      print(json.dumps({"error": repr(e)}), flush=True)


if __name__ == "__main__":
  app.run(main)
