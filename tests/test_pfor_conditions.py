"""Tests of per-example TensorFlow conditionals inside the batched code
(`runtime/pfor_conditions.py`)."""
import numpy as np
import pytest
import tensorflow as tf

import tfp_autobatch as tab
from tfp_autobatch.runtime import pfor_conditions


@tab.batch
def _tf_conditionals(x, k):
  y = tf.switch_case(k, [lambda: x, lambda: x * 10., lambda: x * 100.])
  while y > 50.:         # in the VM's loop, beside a Python branch
    y = y - tf.cond(x > 1.5, lambda: 30., lambda: 40.)
  return y


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_per_example_tf_cond_and_switch_case_run_on_every_backend(backend):
  # pfor partitions the rows of a per-example conditional; inside the
  # pc:xla loop XLA could not compile that ("Reading input as constant from
  # a dynamic tensor"), so there both branches run and a select picks.
  x = np.array([1., -1., 2., 0.6], np.float32)
  k = np.array([0, 1, 2, 2], np.int32)
  want = [_tf_conditionals.run_unbatched(tf.constant(a), tf.constant(b))
          for a, b in zip(x, k)]
  np.testing.assert_allclose(_tf_conditionals(x, k, backend=backend), want)


def test_pc_graph_tf_cond_inside_a_user_xla_function():
  # pc:graph traced in a plain tf.function first, then in a jit_compile
  # one: the second used the first's trace, whose partitioned conditional
  # XLA cannot compile. Each context gets a trace of its own.
  x = tf.constant([1., -1., 2., 0.6], tf.float32)
  k = tf.constant([0, 1, 2, 2], tf.int32)
  want = _tf_conditionals(x, k, backend="local:eager")
  run = lambda x, k: _tf_conditionals(x, k, backend="pc:graph")  # pylint: disable=unnecessary-lambda-assignment
  for jit_compile in (False, True):
    np.testing.assert_allclose(
        tf.function(run, jit_compile=jit_compile)(x, k), want)


@pytest.mark.parametrize("persistent", [False, True])
def test_pc_graph_tf_cond_inside_a_user_xla_function_under_a_tape(
    persistent):
  # Under a tape, pc:graph in the user's jit_compile traces its VM in a
  # thread of its own, apart from the tapes (a persistent tape made the
  # VM's forward call fail: test_gradients.py); traced there, it must
  # still vectorise the conditionals as selects, which XLA can compile.
  # A fresh function, so that its first trace is under the tape.
  fresh = tab.batch(_tf_conditionals.python_function)
  x = tf.constant([1., -1., 2., 0.6], tf.float32)
  k = tf.constant([0, 1, 2, 2], tf.int32)
  want = _tf_conditionals(x, k, backend="local:eager")
  run = tf.function(lambda x, k: fresh(x, k, backend="pc:graph"),
                    jit_compile=True)
  with tf.GradientTape(persistent=persistent) as tape:
    tape.watch(x)
    got = run(x, k)
  np.testing.assert_allclose(got, want)


def test_selects_for_conditions_leave_pfor_as_it_was():
  from tensorflow.python.ops.parallel_for import pfor  # pylint: disable=g-direct-tensorflow-import
  registry = pfor._pfor_converter_registry  # pylint: disable=protected-access
  before = dict(registry)
  with pfor_conditions.as_selects():
    assert registry["StatelessIf"] is not before["StatelessIf"]
    assert registry["StatelessCase"] is not before["StatelessCase"]
  assert registry == before


def _conditions_computed_once(graph):
  """How many `SelectV2`s in `graph` select on a condition computed once
  (`_xla.computed_once`: a comparison of a sum)."""
  return sum(op.type == "SelectV2" and op.inputs[0].op.type == "Greater"
             and op.inputs[0].op.inputs[0].op.type == "Sum"
             for op in graph.get_operations())


@pytest.mark.parametrize("rows, once", [(256, True), (4, False)])
def test_a_large_select_computes_its_row_condition_once(rows, once):
  # A per-example tf.where on a scalar condition: XLA would evaluate the
  # condition's computation for every element of the row. From
  # CONDITION_ONCE_FROM_ELEMENTS elements the condition is computed once
  # per row (a reduction XLA does not fuse into the select); a small
  # select is left as pfor makes it.
  assert rows * 8 >= pfor_conditions.CONDITION_ONCE_FROM_ELEMENTS or not once
  rng = np.random.default_rng(0)
  c = rng.normal(size=[rows]).astype(np.float32)
  x = rng.normal(size=[rows, 8]).astype(np.float32)

  @tf.function(autograph=False)
  def run(c, x):
    with pfor_conditions.as_selects():
      return tf.vectorized_map(
          lambda a: tf.where(tf.exp(a[0]) > 1., a[1], -2. * a[1]), (c, x))

  np.testing.assert_allclose(run(c, x),
                             np.where(c[:, None] > 0, x, -2. * x))
  graph = run.get_concrete_function(c, x).graph
  assert _conditions_computed_once(graph) == int(once)


@tab.batch
def _flip_where_negative(x, c):
  return tf.where(c > 0., x, -2. * x)


def test_pc_xla_select_with_its_condition_once_matches_per_example_code():
  rng = np.random.default_rng(1)
  c = rng.normal(size=[256]).astype(np.float32)
  x = rng.normal(size=[256, 8]).astype(np.float32)
  np.testing.assert_allclose(
      _flip_where_negative(x, c, backend="pc:xla"),
      np.where(c[:, None] > 0, x, -2. * x))
