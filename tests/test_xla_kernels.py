"""`xla_kernels.unsupported_ops`: the operations XLA has no kernel for in a
traced function, at any depth of its loops, branches and calls, and only
in the functions it calls."""
import tensorflow as tf

from tfp_autobatch.runtime import xla_kernels


def _through_numpy(x):
  return tf.ensure_shape(
      tf.numpy_function(lambda a: a, [x], x.dtype, stateful=False), x.shape)


def _graph(fn):
  return tf.function(fn, autograph=False).get_concrete_function(
      tf.TensorSpec([], tf.float32)).graph


def test_operations_xla_lacks_are_found_inside_loops_and_branches():
  def f(x):
    return tf.while_loop(
        lambda i: i < 3.0,
        lambda i: [tf.cond(i > 1.0, lambda: _through_numpy(i) + 1.0,
                           lambda: i + 2.0)], [x])
  found = xla_kernels.unsupported_ops(_graph(f))
  assert [op.type for op in found] == ["PyFuncStateless"]


def test_a_function_held_but_never_called_is_not_looked_at():
  # TFP's distributions leave such functions in a graph (a sampler's, say,
  # with random ops XLA lacks); XLA never compiles them.
  unused = tf.function(_through_numpy, autograph=False)
  def f(x):
    unused.get_concrete_function(x).add_to_graph()
    return tf.while_loop(lambda i: i < 3.0, lambda i: [i + 1.0], [x])
  assert not xla_kernels.unsupported_ops(_graph(f))
  assert not xla_kernels.unsupported_ops(_graph(lambda x: x * 2.0))
