"""Builds colab/dynamic_networks.ipynb (unexecuted).

    python colab/tools/build_dynamic_networks.py
    python colab/tools/execute_notebook.py colab/dynamic_networks.ipynb
"""
from nbformat.v4 import new_markdown_cell as md, new_code_cell as code

from notebook_cells import install_cell, write_notebook

cells = [
md("""# Dynamic neural networks written for one example

A TreeLSTM is defined for **one** tree: a node's state is computed from its
children's, recursively. Batching trees of different shapes by hand means
padding, masking and level-by-level scheduling. With `@tab.batch` you write
the recursion for one tree and call it on a batch; gradients flow through
it to the shared weights, so it trains with `tf.GradientTape` and a Keras
optimizer. This notebook is the TreeLSTM of `examples/tree_lstm.py` (issue
46), written out in full."""),
install_cell(),
code("""import json, os, time
import numpy as np
import tensorflow as tf
import matplotlib.pyplot as plt
import tfp_autobatch as tab"""),
md("""## 1. Trees as index arrays

A tree is three arrays over its nodes, numbered children first and the root
last: the left and right child of each node (-1 at a leaf) and each leaf's
word id (-1 at an internal node). Every tree of a batch is padded to the same
number of nodes; `root` says where each one ends. The shapes are random
binary bracketings of sentences whose lengths follow SST's (see
`examples/neural_data.py` for the full generator)."""),
code("""VOCAB, EMBED, HIDDEN, CLASSES = (50, 16, 16, 5) if SMALL else (1000, 64, 64, 5)
MAX_LEAVES = 12 if SMALL else 30
rng = np.random.default_rng(0)
sentiment = rng.normal(size=VOCAB)

def random_tree(n_leaves):
    left, right, words = [], [], []
    def bracket(first, last):          # post-order: children first
        if last - first == 1:
            left.append(-1); right.append(-1); words.append(rng.integers(VOCAB))
            return len(words) - 1
        split = rng.integers(first + 1, last)
        l, r = bracket(first, split), bracket(split, last)
        left.append(l); right.append(r); words.append(-1)
        return len(words) - 1
    root = bracket(0, n_leaves)
    return left, right, words, root

def make_trees(count):
    nodes = 2 * MAX_LEAVES - 1
    data = {k: np.full([count, nodes], -1, np.int32) for k in ("left", "right", "words")}
    data["root"], labels = np.zeros(count, np.int32), np.zeros(count)
    for k in range(count):
        n = int(np.clip(np.ceil(rng.gamma(3.5, 5.4)), 1, MAX_LEAVES))
        left, right, words, data["root"][k] = random_tree(n)
        data["left"][k, :len(left)], data["right"][k, :len(left)] = left, right
        data["words"][k, :len(left)] = words
        labels[k] = sentiment[[w for w in words if w >= 0]].mean()
    data["label"] = np.searchsorted(np.quantile(labels, [.2, .4, .6, .8]), labels).astype(np.int32)
    return data

trees = make_trees(32 if SMALL else 128)
print("leaves per tree:", (trees["root"][:10] + 2) // 2)"""),
md("""## 2. The model, written for one tree

The weights are `tf.Variable`s shared by all trees, captured by closure. The
cell is the binary N-ary TreeLSTM of Tai et al. (2015): leaves read a word,
internal nodes their two children. `node_state` is plain recursion over node
indices; `tree_logits` classifies the root's state."""),
code("""init = tf.keras.initializers.GlorotUniform(seed=1)
embedding = tf.Variable(tf.random.stateless_uniform([VOCAB, EMBED], [0, 0], -0.1, 0.1))
leaf_kernel = tf.Variable(init([EMBED, 3 * HIDDEN]))
node_kernel = tf.Variable(init([2 * HIDDEN, 5 * HIDDEN]))
node_bias = tf.Variable(tf.concat([tf.zeros([HIDDEN]), tf.ones([2 * HIDDEN]), tf.zeros([2 * HIDDEN])], 0))
out_kernel = tf.Variable(init([HIDDEN, CLASSES]))
weights = [embedding, leaf_kernel, node_kernel, node_bias, out_kernel]

def vecmat(x, w):   # one example's x @ w (pfor makes it one 2-D matmul)
    return tf.matmul(x[None, :], w)[0]

def leaf(word):
    x = tf.gather(embedding.read_value(), word)
    i, o, u = tf.split(vecmat(x, leaf_kernel), 3)
    c = tf.sigmoid(i) * tf.tanh(u)
    return tf.sigmoid(o) * tf.tanh(c), c

def node(h_left, c_left, h_right, c_right):
    gates = vecmat(tf.concat([h_left, h_right], 0), node_kernel) + node_bias
    i, f_left, f_right, o, u = tf.split(gates, 5)
    c = tf.sigmoid(i) * tf.tanh(u) + tf.sigmoid(f_left) * c_left + tf.sigmoid(f_right) * c_right
    return tf.sigmoid(o) * tf.tanh(c), c

@tab.batch(max_stack_depth=MAX_LEAVES + 1)
def node_state(left, right, words, n):
    if left[n] < 0:
        return leaf(words[n])
    h_left, c_left = node_state(left, right, words, left[n])
    h_right, c_right = node_state(left, right, words, right[n])
    return node(h_left, c_left, h_right, c_right)

@tab.batch(max_stack_depth=MAX_LEAVES + 1)
def tree_logits(left, right, words, root):
    h, _ = node_state(left, right, words, root)
    return vecmat(h, out_kernel)

args = (trees["left"], trees["right"], trees["words"], trees["root"])
logits = tree_logits(*args)
print(logits.shape)"""),
md("""The batched result is what the plain function gives on each tree alone
(`run_unbatched` runs the Python function on one example, eagerly):"""),
code("""one = [tree_logits.run_unbatched(*(tf.constant(a[k]) for a in args)) for k in range(4)]
np.testing.assert_allclose(logits[:4], tf.stack(one), rtol=1e-5, atol=1e-6)
print("batched == per tree")"""),
md("""## 3. The program the backends run

IR-1: each function as basic blocks of single-example primitives (your
straight-line code, grouped), calls of batched functions, and branches. Every
tree follows its own path through these blocks; the runtime runs each block
for the trees that are there."""),
code("""print(node_state.ir())"""),
md("""## 4. Training

A step is the gradient of the batch's mean loss with `tf.GradientTape`, then
a Keras optimizer update. `pc:xla` compiles the whole batched program with
XLA and has no gradient; `pc:graph` (one TensorFlow graph) and the local
backends do."""),
code("""optimizer = tf.keras.optimizers.Adam(0.02)
labels = trees["label"]

def train_step(backend="pc:graph"):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=tree_logits(*args, backend=backend)))
    optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))
    return float(loss)

losses = [train_step() for _ in range(8 if SMALL else 30)]
print(np.round(losses, 3))
assert losses[-1] < losses[0]
plt.plot(losses, "o-"); plt.xlabel("step"); plt.ylabel("mean loss")
plt.title("TreeLSTM training on pc:graph"); plt.show()"""),
md("""## 5. Throughput against DyNet

`python -m benchmarks.neural` times the three workloads of `examples/`
(TreeLSTM, BiLSTM tagger, LSTM classifier, at the DyNet paper's sizes)
against DyNet's on-the-fly batching (`pip install dynet38`: no batching,
depth-based and agenda-based) and the per-example TF eager floor. The plot
below reads its saved results (`benchmarks/results/neural.json`, a sweep of
batch sizes 1 to 256, where present, and `neural_b64.json`, batch 64; measured on
a loaded 2-core machine, see `docs/neural.md`). `+batched_cells` marks the
model with its cells as `@tab.batched_primitive`s. Where the files are not at
hand it times this notebook's small TreeLSTM alone."""),
code("""results = os.path.join("..", "benchmarks", "results")
def records(name, mode):   # the TreeLSTM's records at one thread
    path = os.path.join(results, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in json.load(f)["records"] if r["workload"] == "tree_lstm"
                and r["mode"] == mode and r["threads"] == 1]
# The sweep over batch sizes (inference), and batch 64 alone (training).
panels = [("inference", records("neural.json", "inference")
                        or records("neural_b64.json", "inference")),
          ("training", records("neural_b64.json", "training"))]
if any(rs for _, rs in panels):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, (mode, rs) in zip(axes, panels):
        for system in sorted({r["system"] for r in rs}):
            mine = sorted((r for r in rs if r["system"] == system), key=lambda r: r["batch_size"])
            ax.loglog([r["batch_size"] for r in mine], [r["examples_per_sec"] for r in mine],
                      "o-", label=system, ms=4)
        ax.set_title(f"TreeLSTM {mode}, 1 thread"); ax.set_xlabel("batch size")
        ax.set_ylabel("trees / s"); ax.grid(alpha=.3); ax.legend(fontsize=7)
    plt.show()
else:   # no saved results at hand: time this notebook's model alone
    sizes = [1, 4, 16] if SMALL else [1, 4, 16, 64]
    for backend in ["pc:xla", "pc:graph"]:
        rates = []
        for b in sizes:
            batch = tuple(a[:b] for a in args)
            tree_logits(*batch, backend=backend)            # compile
            start = time.perf_counter(); tree_logits(*batch, backend=backend)
            rates.append(b / (time.perf_counter() - start))
        plt.loglog(sizes, rates, "o-", label=backend)
    plt.xlabel("batch size"); plt.ylabel("trees / s"); plt.legend(); plt.show()"""),
]

if __name__ == "__main__":
  print("wrote", write_notebook(cells, "dynamic_networks.ipynb"))
