"""The systems `benchmarks.neural` times: our backends, per-example TF
eager, and DyNet's strategies in worker processes.

Each system answers `seconds(workload, mode, batch_size, calls)`: the
wall time of `calls` calls, a call being one minibatch of `batch_size`
examples (mode "inference": the mean loss; mode "training": its gradient
and an Adam update of the shared weights). Every system gets the same
examples: the first `batch_size` of the workload's pool.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

from examples import neural_data
from examples import per_example
from examples import training

# Sizes of the DyNet paper's models (Neubig et al. 2017, Appendix C).
PAPER_SIZES = dict(vocabulary_size=neural_data.VOCABULARY_SIZE,
                   embedding_size=neural_data.EMBEDDING_SIZE,
                   hidden_size=neural_data.HIDDEN_SIZE,
                   num_classes=neural_data.NUM_CLASSES,
                   num_tags=neural_data.NUM_TAGS,
                   max_length=neural_data.MAX_SENTENCE_LENGTH,
                   max_leaves=neural_data.MAX_TREE_LEAVES)
LEARNING_RATE = 1e-3


def make_pools(sizes, count, seed):
  """Each workload's examples, made once and shared by every system."""
  v = sizes["vocabulary_size"]
  return {
      "tree_lstm": neural_data.trees(count, seed, v, sizes["num_classes"],
                                     sizes["max_leaves"]),
      "bilstm_tagger": neural_data.sentences(count, seed + 1, v,
                                             sizes["num_tags"],
                                             sizes["max_length"]),
      "rnn_classifier": neural_data.sequences(count, seed + 2, v,
                                              sizes["num_classes"],
                                              sizes["max_length"]),
  }


def make_model(workload, sizes, pool, batched_cells=False):
  common = dict(vocabulary_size=sizes["vocabulary_size"],
                embedding_size=sizes["embedding_size"],
                hidden_size=sizes["hidden_size"], batched_cells=batched_cells)
  if workload == "tree_lstm":
    return training.WORKLOADS[workload].make_model(
        **common, num_classes=sizes["num_classes"],
        max_depth=int(pool.depths.max()) + 1)
  if workload == "bilstm_tagger":
    return training.WORKLOADS[workload].make_model(
        **common, num_tags=sizes["num_tags"], max_length=sizes["max_length"])
  return training.WORKLOADS[workload].make_model(
      **common, num_classes=sizes["num_classes"])


class Ours:
  """A backend of tfp_autobatch running the `@tab.batch` models; with
  `batched_cells` (named `<backend>+batched_cells`), their cells are
  `@tab.batched_primitive`s."""

  def __init__(self, backend, sizes, pools, batched_cells=False):
    self.name = backend + ("+batched_cells" if batched_cells else "")
    self.backend = backend
    self.pools = pools
    self.models = {w: make_model(w, sizes, p, batched_cells)
                   for w, p in pools.items()}
    self.optimizers = {w: tf.keras.optimizers.Adam(LEARNING_RATE)
                       for w in pools}

  def supports(self, mode):
    del mode   # every backend differentiates (pc:xla eagerly)
    return True

  def seconds(self, workload, mode, batch_size, calls):
    spec = training.WORKLOADS[workload]
    model = self.models[workload]
    batch = neural_data.take(self.pools[workload], 0, batch_size)
    start = time.perf_counter()
    for _ in range(calls):
      if mode == "inference":
        loss = spec.batched_loss(model, batch, backend=self.backend)
      else:
        loss = training.train_step(spec.batched_loss, model, batch,
                                   self.optimizers[workload], self.backend)
      loss.numpy()
    return time.perf_counter() - start


class TFEager:
  """The per-example plain-TF models, one example after another, eagerly.

  Only the first `cap` examples of a batch are timed (a batch of 256 trees
  takes seconds); the time is scaled to the batch (`extrapolated`).
  """

  def __init__(self, sizes, pools, cap):
    self.name = "tf_eager"
    self.pools, self.cap = pools, cap
    self.models = {w: make_model(w, sizes, p) for w, p in pools.items()}
    self.optimizers = {w: tf.keras.optimizers.Adam(LEARNING_RATE)
                       for w in pools}

  def supports(self, mode):
    del mode
    return True

  def extrapolated(self, batch_size):
    return batch_size > self.cap

  def seconds(self, workload, mode, batch_size, calls):
    spec = training.WORKLOADS[workload]
    model = self.models[workload]
    timed = min(batch_size, self.cap)
    batch = neural_data.take(self.pools[workload], 0, timed)
    start = time.perf_counter()
    for _ in range(calls):
      if mode == "inference":
        loss = per_example.mean_loss(spec.example_loss, model, batch)
      else:
        loss, grads = training.per_example_gradients(spec.example_loss,
                                                     model, batch)
        self.optimizers[workload].apply_gradients(
            zip(grads, model.trainable_variables))
      loss.numpy()
    return (time.perf_counter() - start) * batch_size / timed


class DyNet:
  """One DyNet strategy, in a worker process (`benchmarks.neural_dynet`)."""

  def __init__(self, strategy, data_path, threads):
    self.name = f"dynet:{strategy}"
    env = dict(os.environ, OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    self.process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.neural_dynet",
         f"--autobatch={strategy}", f"--data={data_path}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    self._answer()   # {"ready": true} once the models are built

  def _answer(self):
    while True:
      line = self.process.stdout.readline()
      if not line:
        raise RuntimeError(f"{self.name}'s worker ended (see its stderr)")
      if line.startswith("{"):
        answer = json.loads(line)
        if "error" in answer:
          raise RuntimeError(f"{self.name}: {answer['error']}")
        return answer

  def supports(self, mode):
    del mode
    return True

  def seconds(self, workload, mode, batch_size, calls):
    self.process.stdin.write(json.dumps(dict(
        workload=workload, mode=mode, batch_size=batch_size,
        calls=calls)) + "\n")
    self.process.stdin.flush()
    return self._answer()["seconds"]

  def close(self):
    self.process.stdin.close()
    self.process.wait(timeout=60)


def save_pools(path, pools, sizes):
  """The pools as the DyNet workers read them."""
  arrays = {f"{w}/{field}": np.asarray(value)
            for w, pool in pools.items()
            for field, value in pool._asdict().items()}
  np.savez(path, sizes=json.dumps(sizes), **arrays)


def dynet_available():
  try:
    import dynet_config  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True
