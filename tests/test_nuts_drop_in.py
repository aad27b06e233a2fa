"""TFP's documented usage patterns that must work with our kernel, in
eager mode and in a `tf.compat.v1` graph run by a Session: the same draws
as eagerly, targets that squeeze their result, states of unknown static
shape."""
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import nuts

tfd = tfp.distributions


def _in_mode(mode, build):
  """`build()`'s tensors, evaluated eagerly or in a v1 graph's Session
  ("graph"; "graph function": built in a `tf.function` traced in the v1
  graph, as `sample_chain` is usually run there)."""
  if mode == "eager":
    return tf.nest.map_structure(np.asarray, build())
  with tf.Graph().as_default():
    out = (tf.function(build, autograph=False)() if mode == "graph function"
           else build())
    with tf.compat.v1.Session() as session:
      return session.run(out)


@pytest.mark.parametrize("mode", ["eager", "graph", "graph function"])
def test_a_target_that_squeezes_its_result(mode):
  """`tf.squeeze(dist.log_prob(x))`, as TFP's examples write targets:
  shape [] on one chain, which is still one value per chain."""
  def build():
    dist = tfd.MultivariateNormalDiag(scale_diag=[1., 2.])
    target = lambda x: tf.squeeze(dist.log_prob(x))  # pylint: disable=unnecessary-lambda-assignment
    kernel = nuts.NoUTurnSampler(target, 0.5, backend="pc:graph")
    init = tf.zeros([3, 2])
    results = kernel.bootstrap_results(init)
    state, results = kernel.one_step(init, results, seed=[1, 2])
    return state, results.target_log_prob, dist.log_prob(state)
  state, logp, expected = _in_mode(mode, build)
  assert state.shape == (3, 2)
  np.testing.assert_allclose(logp, expected, rtol=1e-5)


@pytest.mark.parametrize("mode", ["eager", "graph", "graph function"])
def test_a_squeezed_target_with_a_parameter_per_chain(mode):
  """A scale per chain, squeezed as TFP's examples write targets: it was
  refused; each chain now gets its own scale, as with TFP's kernel."""
  def build():
    scale = tf.constant([1., 2., 3.])
    target = lambda x: tf.squeeze(tfd.Normal(0., scale).log_prob(x))  # pylint: disable=unnecessary-lambda-assignment
    kernel = nuts.NoUTurnSampler(target, 0.5, backend="pc:graph")
    init = tf.constant([0.3, -0.2, 0.1])
    results = kernel.bootstrap_results(init)
    state, results = kernel.one_step(init, results, seed=[1, 2])
    return (state, results.target_log_prob, target(state),
            results.grads_target_log_prob[0], -state / scale ** 2)
  state, logp, expected, grad, expected_grad = _in_mode(mode, build)
  assert state.shape == (3,)
  np.testing.assert_allclose(logp, expected, rtol=1e-5)
  np.testing.assert_allclose(grad, expected_grad, rtol=1e-5)


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("shape", [[None, 2], None])
def test_a_state_of_unknown_shape(mode, shape):
  """A state fed through placeholder_with_default: with the chain and
  event dimensions known it runs; with none known (`shape=None`, as in
  TFP's testDynamicShape) it runs at the default's shape."""
  def build():
    init = tf.compat.v1.placeholder_with_default(np.zeros([4, 2], np.float32),
                                                 shape=shape)
    dist = tfd.MultivariateNormalDiag(scale_diag=[1., 2.])
    kernel = nuts.NoUTurnSampler(dist.log_prob, 0.5, backend="pc:graph")
    results = kernel.bootstrap_results(init)
    state, results = kernel.one_step(init, results, seed=[1, 2])
    return state, results.target_log_prob, dist.log_prob(state)
  state, logp, expected = _in_mode(mode, build)
  assert state.shape == (4, 2)
  np.testing.assert_allclose(logp, expected, rtol=1e-5)


@pytest.mark.parametrize("backend", ["pc:graph", "pc:xla"])
def test_sample_chain_on_a_state_of_unknown_rank_in_a_v1_graph(backend):
  """TFP's testDynamicShape: `sample_chain` from a placeholder with a
  default and `shape=None`, in a v1 graph (the loop's state has no static
  shape either; its gradient in the kernel results has). It failed saying
  the rank is unknown. It samples at the default's shape; another shape
  fed is an error when the graph runs, the program being built for one."""
  with tf.Graph().as_default():
    init = tf.compat.v1.placeholder_with_default(np.zeros([5, 3], np.float32),
                                                 shape=None)
    kernel = nuts.NoUTurnSampler(
        tfd.Independent(tfd.Normal(tf.zeros(3), 1.), 1).log_prob, 0.1,
        backend=backend)
    draws = tfp.mcmc.sample_chain(7, init, kernel=kernel, trace_fn=None,
                                  seed=[1, 2])
    with tf.compat.v1.Session() as session:
      got = session.run(draws)
      assert got.shape == (7, 5, 3) and np.all(np.isfinite(got))
      assert np.all(got[-1] != 0.)   # the chains moved
      with pytest.raises(tf.errors.InvalidArgumentError, match="shape"):
        session.run(draws, {init: np.zeros([2, 3], np.float32)})


_COVARIANCE = np.array([[1., 1.8], [1.8, 4.]], np.float32)


def _correlated_gaussian():
  return tfd.MultivariateNormalTriL(
      np.zeros(2, np.float32), np.linalg.cholesky(_COVARIANCE))


@pytest.mark.parametrize("mode", ["graph", "graph function"])
def test_a_step_in_a_v1_graph_draws_what_it_draws_eagerly(mode):
  """The same seed and start give the same trajectories in a v1 graph as
  eagerly. (Inside a v1 graph TensorFlow's `==` on tensors compared them
  as objects, so every depth-0 subtree took two leapfrogs: trajectories
  of 2, 4, 8, 12 steps instead of 1, 3, 7, 11, and draws 10% too wide.)"""
  start = np.random.RandomState(0).randn(8, 2).astype(np.float32)
  def build():
    kernel = nuts.NoUTurnSampler(_correlated_gaussian().log_prob, 0.5,
                                 backend="pc:graph")
    state = tf.constant(start)
    state, results = kernel.one_step(
        state, kernel.bootstrap_results(state), seed=[3, 4])
    return state, results.leapfrogs_taken, results.log_accept_ratio
  eager = _in_mode("eager", build)
  graph = _in_mode(mode, build)
  np.testing.assert_array_equal(graph[1], eager[1])
  np.testing.assert_allclose(graph[0], eager[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(graph[2], eager[2], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["graph", "graph function"])
def test_pc_xla_steps_as_pc_graph_in_a_v1_graph(mode):
  """In a tf.compat.v1 graph the kernel runs `pc:xla`'s steps on
  `pc:graph`'s VM: TensorFlow's v1 executor mis-framed XLA-compiled calls
  inside sample_chain's nested loops ("inputs from different frames", in
  TFP's own windowed_adaptive_nuts test run with ours). The draws are
  then pc:graph's exactly (XLA's random draws differ from them)."""
  start = np.random.RandomState(1).randn(6, 2).astype(np.float32)
  def build(backend):
    def step():
      kernel = nuts.NoUTurnSampler(_correlated_gaussian().log_prob, 0.5,
                                   backend=backend)
      state = tf.constant(start)
      return kernel.one_step(state, kernel.bootstrap_results(state),
                             seed=[5, 6])[0]
    return step
  np.testing.assert_array_equal(_in_mode(mode, build("pc:xla")),
                                _in_mode(mode, build("pc:graph")))


@pytest.mark.parametrize("backend", ["pc:graph", "pc:xla"])
def test_a_step_in_a_v1_graph_is_plain_ops_of_that_graph(backend):
  """In a tf.compat.v1 graph the batched program is traced in place, not
  called as a function: TensorFlow lowered a stateful function call
  inside sample_chain's nested loops with a control input from the outer
  loop's frame and data from the inner one ("StatefulPartitionedCall has
  inputs from different frames"), in some runs and not others (TFP's own
  nuts_test testDivergence and testCorrelated2dNormalwithinMCError in
  graph mode, run with our kernel). Without the call there is nothing
  left to mis-frame."""
  with tf.Graph().as_default() as graph:
    kernel = nuts.NoUTurnSampler(_correlated_gaussian().log_prob, 0.5,
                                 max_tree_depth=3, backend=backend)
    state = tf.zeros([4, 2])
    kernel.one_step(state, kernel.bootstrap_results(state), seed=[1, 2])
  calls = [op.name for op in graph.get_operations()
           if op.type in ("StatefulPartitionedCall", "PartitionedCall")]
  assert not calls


@pytest.mark.nightly
def test_sample_chain_in_a_v1_graph_function_has_the_target_scales():
  """Issue 44's report as a user runs it: `sample_chain` with step-size
  adaptation in a tf.function run by a v1 Session. 64 chains x 150 draws
  (nearly independent on this target): a standard deviation's relative
  error is about 1%, so 5% is a 5-sigma bound; the bug gave 10% too wide."""
  def build():
    kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
        nuts.NoUTurnSampler(_correlated_gaussian().log_prob, 0.5,
                            backend="pc:graph"), num_adaptation_steps=20)
    return tfp.mcmc.sample_chain(150, tf.zeros([64, 2]), kernel=kernel,
                                 num_burnin_steps=20, trace_fn=None,
                                 seed=[1, 2])
  draws = _in_mode("graph function", build).reshape(-1, 2)
  np.testing.assert_allclose(draws.std(0), [1., 2.], rtol=0.05)
  np.testing.assert_allclose(np.corrcoef(draws.T)[0, 1], 0.9, atol=0.03)


_V1_CONTROL_FLOW_SCRIPT = """
import json
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
import nuts
tfd = tfp.distributions
tf.compat.v1.disable_control_flow_v2()
with tf.Graph().as_default():
  data = tf.compat.v1.placeholder_with_default(
      np.arange(5.).astype(np.float32), shape=[5])
  def target(mu):
    return (tf.reduce_sum(tfd.Normal(mu[..., None], 1.).log_prob(data), -1)
            + tfd.Normal(0., 1.).log_prob(mu))
  kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
      nuts.NoUTurnSampler(target, 0.3, max_tree_depth=3, backend=%r),
      num_adaptation_steps=3)
  draws = tfp.mcmc.sample_chain(4, tf.zeros([8]), kernel=kernel,
                                num_burnin_steps=3, trace_fn=None,
                                seed=[1, 2])
  print(json.dumps(tf.compat.v1.Session().run(draws).shape))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pc:graph", "pc:xla"])
def test_sample_chain_in_v1_control_flow_with_a_target_capturing_data(
    backend, fresh_python):
  """`tf.compat.v1.disable_control_flow_v2()` (a fresh process: it is
  global) and a target that closes over a graph tensor of data. On pc:xla
  this failed with "StatefulPartitionedCall has inputs from different
  frames" (the jit-compiled step's call took the data from outside the
  while frame)."""
  assert fresh_python(_V1_CONTROL_FLOW_SCRIPT % backend) == [4, 8]


def test_a_step_with_functions_run_eagerly():
  """`tf.config.run_functions_eagerly(True)`, as users debug and TFP's
  test_util's "eager_no_tf_function" regime runs: pc:xla's shared
  compiled step then ran op by op and read its run counts as tensors it
  did not have (a TypeError)."""
  dist = tfd.MultivariateNormalDiag(scale_diag=[1., 2.])
  kernel = nuts.NoUTurnSampler(dist.log_prob, 0.5, max_tree_depth=3)
  init = tf.zeros([3, 2])
  tf.config.run_functions_eagerly(True)
  try:
    state, results = kernel.one_step(init, kernel.bootstrap_results(init),
                                     seed=[1, 2])
  finally:
    tf.config.run_functions_eagerly(False)
  np.testing.assert_allclose(results.target_log_prob, dist.log_prob(state),
                             rtol=1e-5)
  assert int(results.num_grads_computed) >= int(
      tf.reduce_sum(results.leapfrogs_taken)) > 0
