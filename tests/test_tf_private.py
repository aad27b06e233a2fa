"""`_tf_private.call_concrete`: a traced function called at its flat inputs
behaves as its own call does. `_tf_private.eager_captures_as_constants`:
small eager tensors become constants of the graph that reads them.
`_tf_private.matrix_work_on_constants`: factorisations and solves of
matrices that do not depend on a graph's arguments."""
import numpy as np
import tensorflow as tf

from tfp_autobatch.runtime import _tf_private


def _traced():
  spec = tf.TensorSpec([None], tf.float32)
  @tf.function(input_signature=[{"b": spec, "a": spec}, (spec, spec)],
               autograph=False)
  def f(d, pair):
    return {"sum": d["a"] + 2.0 * d["b"], "prod": pair[0] * pair[1]}, d["a"]
  return f.get_concrete_function()


def test_a_flat_call_binds_nested_arguments_as_the_function_does():
  concrete = _traced()
  d = {"a": tf.constant([1.0, 2.0]), "b": tf.constant([10.0, 20.0])}
  pair = (tf.constant([3.0, 4.0]), tf.constant([5.0, 6.0]))
  got = _tf_private.call_concrete(concrete, [d, pair])
  want = concrete(d, pair)
  for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
    np.testing.assert_array_equal(g, w)
  np.testing.assert_array_equal(got[0]["sum"], [21.0, 42.0])


def test_a_flat_call_is_recorded_by_a_tape():
  concrete = _traced()
  a = tf.constant([1.0, 2.0])
  b = tf.constant([10.0, 20.0])
  with tf.GradientTape() as tape:
    tape.watch(b)
    out, _ = _tf_private.call_concrete(concrete, [{"a": a, "b": b}, (a, b)])
    loss = tf.reduce_sum(out["sum"] + out["prod"])
  np.testing.assert_array_equal(tape.gradient(loss, b), [3.0, 4.0])


def test_tensorflow_private_modules_are_imported_in_two_files_only():
  # A TensorFlow upgrade then breaks `_tf_private` or `_xla`, nowhere else.
  import pathlib   # pylint: disable=import-outside-toplevel
  import tfp_autobatch   # pylint: disable=import-outside-toplevel
  root = pathlib.Path(tfp_autobatch.__file__).parent
  allowed = {root / "runtime" / "_tf_private.py", root / "runtime" / "_xla.py"}
  found = [str(p.relative_to(root)) for p in root.rglob("*.py")
           if p not in allowed and any(
               name in p.read_text() for name in (
                   "tensorflow.python", "tensorflow.compiler", "_call_flat"))]
  assert not found


def test_xla_kernels_are_told_from_the_registry():
  assert _tf_private.has_xla_kernel("AddV2")
  assert _tf_private.has_xla_kernel("StatelessWhile")
  assert not _tf_private.has_xla_kernel("PyFuncStateless")
  assert not _tf_private.has_xla_kernel("Placeholder")   # a function's input


def test_called_graphs_are_the_functions_an_operation_calls():
  @tf.function(autograph=False)
  def never_called(x):
    return x + 1.0
  @tf.function(autograph=False)
  def f(x):
    # Held by f's graph, not called.
    never_called.get_concrete_function(x).add_to_graph()
    return tf.while_loop(lambda i: i < 3.0,
                         lambda i: [tf.cond(i > 1.0, lambda: i + 1.0,
                                            lambda: i + 2.0)], [x])
  graph = f.get_concrete_function(tf.TensorSpec([], tf.float32)).graph
  assert any("never_called" in name for name in graph._functions)  # pylint: disable=protected-access
  def kinds(graphs):
    return sorted(type(g).__name__ for g in graphs)
  loop, = [op for op in graph.get_operations() if "While" in op.type]
  assert kinds(_tf_private.called_graphs(loop, graph)) == [
      "WhileBodyFuncGraph", "WhileCondFuncGraph"]
  body = [g for g in _tf_private.called_graphs(loop, graph)
          if type(g).__name__ == "WhileBodyFuncGraph"][0]
  branch, = [op for op in body.get_operations() if "If" in op.type]
  # Found in the outermost graph, which holds every function within it.
  assert kinds(_tf_private.called_graphs(branch, graph)) == [
      "CondBranchFuncGraph", "CondBranchFuncGraph"]


def test_small_eager_tensors_read_within_become_constants_of_the_graph():
  scale = tf.constant(2.)
  data = tf.range(5000.)   # more numbers than a constant may hold
  flag = tf.constant([True, False])

  @tf.function(autograph=False)
  def f(x):
    with _tf_private.eager_captures_as_constants():
      with _tf_private.eager_captures_as_constants():   # nested: restored
        y = x * scale
      y = tf.where(flag, y + tf.reduce_sum(data), y)
    return y, x * scale   # read after: captured as TensorFlow does
  concrete = f.get_concrete_function(tf.TensorSpec([2]))
  captured = concrete.captured_inputs
  assert any(c is data for c in captured)
  assert any(c is scale for c in captured)   # the read after the block
  assert not any(c is flag for c in captured)
  inside = [op for op in concrete.graph.get_operations()
            if op.type == "Const" and op.get_attr("dtype") == tf.bool]
  assert inside
  y, z = f(tf.constant([1., 3.]))
  np.testing.assert_allclose(y, [2. + 4999. * 5000. / 2., 6.])
  np.testing.assert_allclose(z, [2., 6.])
  graph = concrete.graph
  assert graph.capture.__func__ is type(graph).capture


def test_float_ops_estimates_a_graph_with_its_calls_and_branches():
  def ops_of(fn, *specs):
    return _tf_private.float_ops(
        tf.function(fn, autograph=False).get_concrete_function(*specs).graph)

  matrix = tf.TensorSpec([4, 30], tf.float32)
  # A matrix product counts as TensorFlow's profiler counts it: a
  # multiplication and an addition per term.
  assert ops_of(lambda x: tf.matmul(x, tf.ones([30, 20])), matrix) == (
      2 * 4 * 30 * 20)
  # An operation it has no count for counts an operation per element of
  # its outputs (`tf.ones` above is a constant: none).
  assert ops_of(tf.exp, matrix) == 4 * 30
  # An operation whose result no output reads (work moved out of a
  # kernel, `constant_work`) counts nothing.
  assert ops_of(lambda x: [tf.matmul(x, tf.ones([30, 20])), tf.exp(x)][1],
                matrix) == 4 * 30

  @tf.function(autograph=False)
  def inner(x):
    return tf.matmul(x, tf.ones([30, 20]))
  # A call counts what it calls.
  assert ops_of(inner, matrix) == 2 * 4 * 30 * 20
  # A conditional counts its costliest branch.
  def branches(x, flag):
    return tf.cond(flag, lambda: tf.reduce_sum(inner(x)),
                   lambda: tf.reduce_sum(x))
  assert ops_of(branches, matrix, tf.TensorSpec([], tf.bool)) >= (
      2 * 4 * 30 * 20)
  # A loop's trip count is not known: no estimate.
  def loop(x):
    return tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 2.),
                         (0, x))[1]
  assert ops_of(loop, matrix) is None


_FACTOR = tf.linalg.cholesky(tf.constant([[4., 1.], [1., 3.]]))


@tf.function
def _solved_inside(x):
  return tf.linalg.triangular_solve(_FACTOR, x)


def test_matrix_work_on_constants_is_told_from_work_on_the_arguments():
  spec = tf.TensorSpec([2, 1], tf.float32)

  @tf.function
  def on_a_fixed_factor(x):
    return tf.linalg.triangular_solve(_FACTOR, x)

  @tf.function
  def on_a_factor_of_the_argument(x):
    factor = tf.linalg.cholesky(_FACTOR + tf.reduce_sum(x) ** 2)
    return tf.linalg.triangular_solve(factor, x)

  @tf.function
  def in_a_called_function(x):
    return _solved_inside(x) + tf.linalg.inv(tf.eye(2) + x[0, 0])

  found = _tf_private.matrix_work_on_constants(
      on_a_fixed_factor.get_concrete_function(spec).graph)
  assert [op for op, _ in found] == ["MatrixTriangularSolve"]
  # Where it was made: this file, outside TensorFlow and its libraries.
  assert "test_tf_private.py:" in found[0][1]
  # The factor and the solve depend on the argument; the fixed factor
  # plus a square of it does too.
  assert _tf_private.matrix_work_on_constants(
      on_a_factor_of_the_argument.get_concrete_function(spec).graph) == []
  # Through a call: the called function's solve is on a capture of its
  # own; the inverse depends on the argument.
  found = _tf_private.matrix_work_on_constants(
      in_a_called_function.get_concrete_function(spec).graph)
  assert [op for op, _ in found] == ["MatrixTriangularSolve"]
