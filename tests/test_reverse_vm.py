"""The reverse VM (`reverse_vm`): `pc:xla`'s gradient as the blocks that
ran, taken back one at a time, and batched primitives differentiated in
their buckets."""
import numpy as np
import pytest
import tensorflow as tf

import pc_testing
import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.runtime import batched_primitive_calls
from tfp_autobatch.runtime import vectorize

# A 2-vector variable and inputs of two columns, so that the stacks the
# reverse VM reads and writes have an event shape.
SCALE = tf.Variable([1.5, -0.5], dtype=tf.float64)
tree = pc_testing.tree_of_model_calls(SCALE)

X = np.random.default_rng(3).normal(size=(9, 2))
DEPTH = np.array([0, 3, 1, 2, 3, 0, 2, 4, 1], np.int32)


def _gradients(backend):
  x = tf.constant(X)
  with tf.GradientTape() as tape:
    tape.watch(x)
    total = tf.reduce_sum(tree(x, DEPTH, backend=backend) * [1.0, 2.0])
  return [tf.convert_to_tensor(g) for g in tape.gradient(total, [x, SCALE])]


def _op_types(concrete):
  """The op types of a concrete function's graph and every function it
  calls."""
  graph_def = concrete.graph.as_graph_def()
  types = {node.op for node in graph_def.node}
  for function in graph_def.library.function:
    types |= {node.op for node in function.node_def}
  return types


def test_pc_xla_gradient_is_the_reverse_vm_and_matches_pc_graph():
  got = _gradients("pc:xla")
  expected = _gradients("pc:graph")
  for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, rtol=1e-10)
  # The backward pass is no gradient of the VM's loop: TensorFlow's keeps
  # each step's intermediates in accumulators (TensorList pushes), every
  # block's at every step.
  runtime = pipeline.runtime(tree, tree._last_types, "pc:xla")  # pylint: disable=protected-access
  recordings = list(runtime._gradient._recordings.values())  # pylint: disable=protected-access
  concretes = [c for r in recordings for c in
               [r.forward] + [b for _, b in r._backward.values()]]  # pylint: disable=protected-access
  assert len(concretes) >= 2
  for concrete in concretes:
    types = _op_types(concrete)
    assert "While" in types or "StatelessWhile" in types
    assert not {"TensorListPushBack", "EmptyTensorList"} & types


def test_under_a_tape_pc_xla_runs_the_program_forward_once_a_call():
  # The recording run's result is the call's: the VM pc:xla compiled runs
  # only on a batch size's first call under a tape, for its step count.
  fresh = pc_testing.tree_of_model_calls(SCALE)
  x = tf.constant(X)
  def gradient():
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = fresh(x, DEPTH, backend="pc:xla")
      total = tf.reduce_sum(y * [1.0, 2.0])
    return y, tape.gradient(total, [x, SCALE])
  gradient()
  runtime = pipeline.runtime(fresh, fresh._last_types, "pc:xla")  # pylint: disable=protected-access
  vm = runtime._concrete_for([x, tf.constant(DEPTH)])  # pylint: disable=protected-access
  calls = []
  compiled = runtime.compiled_for([x, tf.constant(DEPTH)])
  runtime._concrete[compiled] = _Counted(vm, calls)  # pylint: disable=protected-access
  y, grads = gradient()
  runtime._concrete[compiled] = vm  # pylint: disable=protected-access
  assert not calls
  stats = fresh.last_stats
  np.testing.assert_allclose(y, fresh(x, DEPTH, backend="pc:graph"),
                             rtol=1e-12)
  # Its statistics are the compiled VM's.
  fresh(x, DEPTH, backend="pc:xla")
  assert stats == fresh.last_stats and stats.steps > 0
  for g, e in zip(grads, _gradients("pc:graph")):
    np.testing.assert_allclose(g, e, rtol=1e-10)


def test_under_a_tape_pc_xla_still_says_the_stack_overflowed():
  # The recording run halts a member whose recursion passes the stack's
  # depth, as the compiled VM does, on a batch size's first call under a
  # tape and after it.
  shallow = tab.batch(max_stack_depth=4)(
      pc_testing.tree_of_model_calls(SCALE).python_function)
  x = tf.constant(X)
  for depth, fits in ((DEPTH, False), (np.minimum(DEPTH, 2), True),
                      (DEPTH, False)):
    with tf.GradientTape() as tape:
      tape.watch(x)
      if fits:
        total = tf.reduce_sum(shallow(x, depth, backend="pc:xla"))
      else:
        with pytest.raises(tab.StackOverflowError, match="max_stack_depth"):
          shallow(x, depth, backend="pc:xla")
    if fits:
      assert tape.gradient(total, x) is not None


class _Counted:
  """A concrete function that notes its calls."""

  def __init__(self, concrete, calls):
    self.concrete, self.calls = concrete, calls
    self.variables = concrete.variables

  def __call__(self, *args):
    self.calls.append(args)
    return self.concrete(*args)


def test_the_reverse_vm_does_not_check_for_work_on_constants(monkeypatch):
  # Its kernels, traced in place, have no graph to check; the forward
  # pc:xla call checks the same code.
  traced_for = []
  monkeypatch.setattr(
      batched_primitive_calls, "warn_of_matrix_work_on_constants",
      lambda kernel, code: traced_for.append(
          vectorize.tracing_for_reverse_vm()))
  fresh = pc_testing.tree_of_model_calls(SCALE)
  x = tf.constant(X)
  with tf.GradientTape() as tape:
    tape.watch(x)
    total = tf.reduce_sum(fresh(x, DEPTH, backend="pc:xla"))
  assert tape.gradient(total, x) is not None
  assert traced_for and not any(traced_for)


def _kernel_for(size):
  del size
  def kernel(n, x):
    del n
    return [tf.tanh(x * SCALE)]
  return kernel


@pytest.mark.parametrize("members", [
    [True, False, True, False, False, False, False, True] * 2,   # a bucket
    [True] * 16,                                                 # every row
    [False] * 16])                                               # none
def test_a_batched_primitive_in_buckets_has_the_members_gradient(
    members, monkeypatch):
  # Buckets for any kernel, however cheap (else a call runs on every row).
  monkeypatch.setattr(batched_primitive_calls,
                      "BUCKETS_FROM_FLOAT_OPS_PER_ROW", 0)
  x = tf.constant(np.random.default_rng(4).normal(size=(16, 2)))
  members = tf.constant(members)
  weights = tf.constant(np.arange(32.).reshape(16, 2))

  @tf.function(jit_compile=True)
  def gradients(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      outs, rows, count = (
          batched_primitive_calls.on_members_in_buckets_with_vjp(
              _kernel_for, 16, members, [x],
              lambda: ([tf.zeros_like(x)], 0)))
      y = tf.where(members[:, None], outs[0], tf.zeros_like(outs[0]))
      total = tf.reduce_sum(y * weights)
    return tape.gradient(total, [x, SCALE]), rows, count

  (g_x, g_scale), rows, count = gradients(x)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = tf.where(members[:, None], tf.tanh(x * SCALE), tf.zeros_like(x))
    total = tf.reduce_sum(y * weights)
  e_x, e_scale = tape.gradient(total, [x, SCALE])
  np.testing.assert_allclose(g_x, e_x, rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(g_scale, e_scale, rtol=1e-12, atol=1e-12)
  n = int(np.sum(members))
  assert int(count) == n
  # The members alone, gathered into the smallest bucket that holds them.
  assert int(rows) == {3 * 2: 8, 16: 16, 0: 0}[n]


TABLE = tf.Variable(np.random.default_rng(5).normal(size=(50, 3)))


@tab.batch
def walk(words, n):
  # Reads rows of TABLE (an embedding) along a recursion.
  if n == 0:
    return tf.zeros([3], tf.float64)
  return tf.tanh(tf.gather(tf.convert_to_tensor(TABLE), words[n])
                 + walk(words, n - 1))


def test_an_embeddings_gradient_leaves_each_step_as_its_rows():
  words = tf.constant(np.random.default_rng(6).integers(0, 50, (6, 5)),
                      tf.int32)
  lengths = tf.constant([0, 4, 2, 3, 1, 4], tf.int32)
  grads = {}
  for backend in ("pc:graph", "pc:xla"):
    with tf.GradientTape() as tape:
      total = tf.reduce_sum(
          walk(words, lengths, backend=backend) * [1., 2., 3.])
    grads[backend] = tf.convert_to_tensor(tape.gradient(total, TABLE))
  np.testing.assert_allclose(grads["pc:xla"], grads["pc:graph"], rtol=1e-10)
  # The plan the backward pass was traced with has the table gathered:
  # its rows, not the whole table, leave the conditional at each step.
  runtime = pipeline.runtime(walk, walk._last_types, "pc:xla")  # pylint: disable=protected-access
  plans = list(runtime._gradient._gathered_plans.values())  # pylint: disable=protected-access
  assert plans and all(plans)
