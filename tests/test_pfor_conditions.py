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
