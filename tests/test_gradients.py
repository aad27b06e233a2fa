"""Gradients through batched functions: right where a backend can take
them (pc:xla eagerly, `xla_gradient`), a clear error where XLA compiles
the VM inside a graph."""
import contextlib

import numpy as np
import pytest
import tensorflow as tf

import pc_testing
import tfp_autobatch as tab

WEIGHT = tf.Variable(0.8, dtype=tf.float64)
tree = pc_testing.tree_of_model_calls(WEIGHT)


def tree_one(x, depth):
  if depth == 0:
    return tf.tanh(x * WEIGHT)
  a = tree_one(x * 0.5 + 0.1, depth - 1)
  b = tree_one(a * x, depth - 1)
  return a + b * x


# Seven members (not a power of two: the local backends pad the members of
# a block to one, and the padding used to add its gradient to the first
# member's on `local:eager_xla`), at depths that split them at every call.
X = np.random.default_rng(1).normal(size=7)
DEPTH = np.array([0, 3, 1, 2, 3, 0, 2], np.int32)


def expected_gradients():
  dx, dw = [], 0.
  for x, depth in zip(X, DEPTH):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = tree_one(x, int(depth))
    g_x, g_w = tape.gradient(y, [x, WEIGHT])
    dx.append(float(g_x))
    dw += float(g_w)
  return np.array(dx), dw


TAPES = ["single", "persistent", "nested"]


@contextlib.contextmanager
def recording(tapes):
  """Tapes recording within: one ("single"), one persistent, or two, one
  inside the other ("nested"); yields them, the innermost first."""
  with contextlib.ExitStack() as stack:
    yield [stack.enter_context(tf.GradientTape(
        persistent=tapes == "persistent"))
           for _ in range(2 if tapes == "nested" else 1)][::-1]


def gradients(backend, tapes="single"):
  """The gradients of the tree's sum with respect to X and WEIGHT, as
  each tape of `recording(tapes)` gives them (the innermost first)."""
  x = tf.constant(X)
  with recording(tapes) as recorders:
    for tape in recorders:
      tape.watch(x)
    total = tf.reduce_sum(tree(x, DEPTH, backend=backend))
  found = []
  for tape in recorders:
    g_x, g_w = tape.gradient(total, [x, WEIGHT])
    found.append((tf.convert_to_tensor(g_x), g_w))
  return found


@pytest.mark.parametrize("backend", ["local:eager", "local:eager_xla",
                                     "pc:eager", "pc:graph", "pc:xla"])
def test_gradients_match_the_unbatched_program(backend):
  dx, dw = expected_gradients()
  [(got_dx, got_dw)] = gradients(backend)
  np.testing.assert_allclose(got_dx, dx, rtol=1e-10)
  np.testing.assert_allclose(got_dw, dw, rtol=1e-10)


def test_gradients_through_pc_graph_inside_tf_function():
  dx, dw = expected_gradients()
  [(got_dx, got_dw)] = tf.function(lambda: gradients("pc:graph"))()
  np.testing.assert_allclose(got_dx, dx, rtol=1e-10)
  np.testing.assert_allclose(got_dw, dw, rtol=1e-10)


@pytest.mark.parametrize("tapes", ["persistent", "nested"])
@pytest.mark.parametrize("where", ["eager", "tf.function"])
def test_pc_graph_gradients_under_a_persistent_or_nested_tape(where, tapes):
  # Where pc:graph differentiates, it does so for every tape recording it
  # (pins that tracing its VM apart from the tapes under XLA left these
  # alone: here the tapes must record the VM's ops).
  dx, dw = expected_gradients()
  wrap = tf.function if where == "tf.function" else lambda f: f
  found = wrap(lambda: gradients("pc:graph", tapes))()
  assert len(found) == (2 if tapes == "nested" else 1)
  for got_dx, got_dw in found:
    np.testing.assert_allclose(got_dx, dx, rtol=1e-10)
    np.testing.assert_allclose(got_dw, dw, rtol=1e-10)


@pytest.mark.parametrize("tapes", TAPES)
def test_pc_xla_gradients_eagerly_under_every_kind_of_tape(tapes):
  # pc:xla had no gradient at all (an AutobatchError).
  dx, dw = expected_gradients()
  found = gradients("pc:xla", tapes)
  assert len(found) == (2 if tapes == "nested" else 1)
  for got_dx, got_dw in found:
    np.testing.assert_allclose(got_dx, dx, rtol=1e-10)
    np.testing.assert_allclose(got_dw, dw, rtol=1e-10)


def test_pc_xla_gradient_needing_a_larger_step_bound():
  # The backward's loop is bounded by the forward's steps rounded up to
  # a power of two; deeper trees than the first call's need a larger
  # bound, and a bound too small would silently cut the gradient short.
  fresh = tab.batch(tree.python_function)
  for depth in (DEPTH, DEPTH + 3):
    x = tf.constant(X)
    with tf.GradientTape() as tape:
      tape.watch(x)
      total = tf.reduce_sum(fresh(x, depth, backend="pc:xla"))
    got = tape.gradient(total, [x, WEIGHT])
    with tf.GradientTape() as tape:
      tape.watch(x)
      total = tf.reduce_sum(fresh(x, depth, backend="pc:graph"))
    expected = tape.gradient(total, [x, WEIGHT])
    for g, e in zip(got, expected):
      np.testing.assert_allclose(tf.convert_to_tensor(g),
                                 tf.convert_to_tensor(e), rtol=1e-10)


@pytest.mark.parametrize("tapes", TAPES)
@pytest.mark.parametrize("where", ["tf.function", "jit_compile"])
def test_no_gradient_through_xla_is_a_clear_error(where, tapes):
  # pc:xla had no gradient (an XlaScatter without one: a LookupError), and
  # pc:graph under the user's XLA failed inside XLA's compiler. (pc:xla
  # differentiates eagerly only.)
  backend = "pc:graph" if where == "jit_compile" else "pc:xla"
  wrap = {"eager": lambda f: f, "tf.function": tf.function,
          "jit_compile": lambda f: tf.function(f, jit_compile=True)}[where]
  with pytest.raises(tab.AutobatchError, match="not differentiable"):
    wrap(lambda: gradients(backend, tapes))()


def test_pc_xla_gradient_with_respect_to_a_variable_it_reads_alone():
  # Eagerly the gradient with respect to the variable the VM read came
  # back None once (the call was hidden from the tape), silently.
  _, dw = expected_gradients()
  with tf.GradientTape() as tape:
    total = tf.reduce_sum(tree(tf.constant(X), DEPTH, backend="pc:xla"))
  np.testing.assert_allclose(tape.gradient(total, WEIGHT), dw, rtol=1e-10)


@pytest.mark.parametrize("tapes", TAPES)
@pytest.mark.parametrize("backend, where", [
    ("pc:xla", "eager"), ("pc:xla", "tf.function"), ("pc:xla", "jit_compile"),
    ("pc:xla", "jit_compile while_loop"), ("pc:graph", "jit_compile"),
    ("pc:graph", "jit_compile while_loop")])
def test_a_vm_that_xla_compiles_runs_forward_under_tapes(backend, where, tapes):
  # A tape that watched a variable the VM reads used to make the forward
  # call itself fail: a recorded call builds its backward function at
  # once, also for a user's tf.function an eager tape records, and a
  # persistent tape met the VM's trace too. A fresh function, so that its
  # first call (the trace) is under the tapes. pc:graph inside the user's
  # jit_compile traced its VM in place, under a persistent tape or two
  # tapes, which had TensorFlow wrap its loop for their higher-order
  # gradients, with accumulators that XLA cannot size: the forward call
  # failed ("XLA compilation requires a fixed tensor list size").
  fresh = tab.batch(tree.python_function)
  call = lambda x: fresh(x, DEPTH, backend=backend)
  if where == "jit_compile":   # as the NUTS kernel compiles its step
    call = tf.function(call, jit_compile=True)
  if where == "jit_compile while_loop":
    # The backward function read the VM's result in the loop, which made
    # the forward loop accumulate it, which XLA cannot compile unbounded:
    # the forward call failed. (pc:graph's results have an unknown batch
    # size: its one trace serves every size.)
    once = lambda y, vm=call: tf.ensure_shape(vm(y), y.shape)
    call = tf.function(lambda x: tf.while_loop(
        lambda i, y: i < 1, lambda i, y: (i + 1, once(y)), (0, x))[1],
                       jit_compile=True)
  if where != "eager":
    call = tf.function(call)
  with recording(tapes) as recorders:
    y = call(tf.constant(X))
    loss = 2. * WEIGHT + tf.reduce_sum(y)
  np.testing.assert_allclose(
      y, tree(tf.constant(X), DEPTH, backend="pc:graph"), rtol=1e-12)
  if where == "eager":   # pc:xla differentiates eagerly (`xla_gradient`)
    with tf.GradientTape() as tape:
      expected = 2. * WEIGHT + tf.reduce_sum(
          tree(tf.constant(X), DEPTH, backend="pc:graph"))
    expected = tape.gradient(expected, WEIGHT)
    for tape in recorders:
      np.testing.assert_allclose(tape.gradient(loss, WEIGHT), expected,
                                 rtol=1e-10)
    return
  # The gradient through the VM is still the error: in the user's graph,
  # when its backward function runs (an assertion), and under XLA, which
  # drops assertions, when it compiles (the gradient was NaN).
  error = tf.errors.InvalidArgumentError
  for tape in recorders:
    with pytest.raises(error, match="not.differentiable"):
      tape.gradient(loss, WEIGHT)


@tab.batch
def shrink(x):
  while x > 1.:
    x = x * 0.5 * WEIGHT
  return x


@pytest.mark.parametrize("tapes", TAPES)
def test_pc_graph_in_jit_compile_runs_a_while_loop_forward_under_tapes(tapes):
  # A data-dependent loop that reads a variable in single-example code
  # (the previous test's VM has its loop too, but reads the variable in a
  # batched primitive): the program the failure was first met with.
  fresh = tab.batch(shrink.python_function)
  call = tf.function(lambda x: fresh(x, backend="pc:graph"),
                     jit_compile=True)
  x = tf.constant([3., 50., 0.5, 7.], tf.float64)
  with recording(tapes) as recorders:
    for tape in recorders:
      tape.watch(x)
    y = call(x)
  np.testing.assert_allclose(y, shrink(x, backend="pc:graph"), rtol=1e-12)
  for tape in recorders:
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="not.differentiable"):
      tape.gradient(y, x)


def _log_prob_with_a_variable_scale():
  scale = tf.Variable(1.5, dtype=tf.float64)
  return lambda q: -0.5 * tf.reduce_sum(tf.square(q / scale), -1)


def _compiled_sample_chain(kernel):
  """`sample_chain` of two draws in the user's `jit_compile`, behind
  `tf.stop_gradient`, as docs/nuts.md says: without it no kernel works
  under a tape there (XLA cannot compile the gradient of its loop)."""
  import tensorflow_probability as tfp   # pylint: disable=g-import-not-at-top
  return tf.function(lambda q: tf.stop_gradient(tfp.mcmc.sample_chain(
      2, q, kernel=kernel, trace_fn=None, seed=[1, 2])), jit_compile=True)


HIGHER_ORDER_TAPE_ERROR = "fixed tensor list size"


@pytest.mark.slow
@pytest.mark.parametrize("tapes", TAPES)
def test_nuts_on_pc_graph_in_jit_compile_samples_under_tapes(tapes):
  # The NUTS kernel's step, compiled by the user's XLA on pc:graph under
  # a persistent tape, gave no result after minutes, at over 10 GB of
  # memory (the tape had TensorFlow wrap the VM's loop for higher-order
  # gradients, as in the tests above). Under a persistent or nested tape
  # TensorFlow also makes `sample_chain`'s own loop (no maximum number of
  # iterations) accumulate what its gradient reads, which XLA cannot
  # size: that fails as it does for tfp.mcmc.NoUTurnSampler
  # (`test_..._under_higher_order_tapes_as_tfps_kernel_does`), and
  # sampling with the tapes stopped works.
  import nuts   # pylint: disable=g-import-not-at-top
  log_prob = _log_prob_with_a_variable_scale()
  init = tf.constant(np.random.default_rng(2).normal(size=(4, 3)))
  def sampler(backend):
    return _compiled_sample_chain(nuts.NoUTurnSampler(
        log_prob, 0.3, max_tree_depth=3, backend=backend))
  with recording(tapes) as recorders:
    if tapes == "single":
      got = sampler("pc:graph")(init)
    else:
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=HIGHER_ORDER_TAPE_ERROR):
        sampler("pc:graph")(init)
      with recorders[-1].stop_recording():   # the outermost: all of them
        got = sampler("pc:graph")(init)
  # Against pc:xla, also under XLA: TensorFlow's stateless random draws
  # differ there from the draws outside XLA, for TFP's kernels too.
  np.testing.assert_allclose(got, sampler("pc:xla")(init), rtol=1e-10)


@pytest.mark.nightly
@pytest.mark.parametrize("tapes", ["persistent", "nested"])
def test_nuts_in_jit_compile_fails_under_higher_order_tapes_as_tfps_kernel_does(
    tapes):
  # The drop-in contract: where TFP's kernel works ours works; here
  # neither does, with the same XLA error.
  import tensorflow_probability as tfp   # pylint: disable=g-import-not-at-top
  init = tf.constant(np.random.default_rng(2).normal(size=(4, 3)))
  theirs = _compiled_sample_chain(tfp.mcmc.NoUTurnSampler(
      _log_prob_with_a_variable_scale(), 0.3, max_tree_depth=3))
  with recording(tapes):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=HIGHER_ORDER_TAPE_ERROR):
      theirs(init)


@tf.custom_gradient
def halved_gradient(x):
  return tf.identity(x), lambda dy: 0.5 * dy


@tab.batch
def squared_custom(v):
  return halved_gradient(v) * v


@tab.batched_primitive
def halved_gradient_on_the_batch(v):
  return halved_gradient(v)


@tab.batch
def squared_custom_batched(v):
  return halved_gradient_on_the_batch(v) * v


def test_a_custom_gradient_in_single_example_code_is_named(caplog):
  # pfor vectorises the op a @tf.custom_gradient wraps by its ordinary
  # gradient, so the batched gradient is the ordinary one (2v, not 1.5v):
  # a warning names the code. In a batched primitive it is kept.
  v = tf.constant([1., 2., 3.])
  with tf.GradientTape() as tape:
    tape.watch(v)
    y = squared_custom(v, backend="pc:graph")
  np.testing.assert_allclose(tape.gradient(y, v), 2. * v)
  assert "custom gradient" in caplog.text
  assert "test_gradients.py" in caplog.text
  # Once, not at every trace (pc:xla traces for each batch size).
  for n in (2, 5):
    squared_custom(tf.ones([n]), backend="pc:xla")
  assert caplog.text.count("custom gradient") == 1
  with tf.GradientTape() as tape:
    tape.watch(v)
    y = squared_custom_batched(v, backend="pc:graph")
  np.testing.assert_allclose(tape.gradient(y, v), 1.5 * v)


def test_a_traced_pc_xla_call_does_not_keep_its_graph_alive():
  # tf.custom_gradient in a graph registers a gradient function per call
  # in TensorFlow's global registry, holding the call's tensors: every
  # tf.function traced around a pc:xla call stayed alive.
  import gc
  import weakref
  graphs = []
  for offset in (1., 2.):
    fn = tf.function(lambda x, c=offset: tree(x, DEPTH, backend="pc:xla") + c)
    graphs.append(weakref.ref(fn.get_concrete_function(tf.constant(X)).graph))
    del fn
  gc.collect()
  assert [g() for g in graphs] == [None, None]
