"""TFP's documented usage patterns that must work with our kernel, in
eager mode and in a `tf.compat.v1` graph run by a Session: targets that
squeeze their result, states of unknown static shape."""
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import nuts

tfd = tfp.distributions


def _in_mode(mode, build):
  """`build()`'s tensors, evaluated eagerly or in a v1 graph's Session."""
  if mode == "eager":
    return tf.nest.map_structure(np.asarray, build())
  with tf.Graph().as_default():
    out = build()
    with tf.compat.v1.Session() as session:
      return session.run(out)


@pytest.mark.parametrize("mode", ["eager", "graph"])
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


def test_a_target_with_a_parameter_per_chain_is_still_refused():
  scale = tf.constant([1., 2., 3.])
  kernel = nuts.NoUTurnSampler(
      lambda x: tf.squeeze(tfd.Normal(0., scale).log_prob(x)), 0.5)
  with pytest.raises(ValueError, match="treat the chains alike"):
    kernel.bootstrap_results(tf.zeros([3]))


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_state_of_unknown_shape(mode):
  """A state fed through placeholder_with_default: with the chain and
  event dimensions known it runs; with none known, a clear error (the
  NUTS program is built for one event shape)."""
  def build(shape):
    init = tf.compat.v1.placeholder_with_default(np.zeros([4, 2], np.float32),
                                                 shape=shape)
    dist = tfd.MultivariateNormalDiag(scale_diag=[1., 2.])
    kernel = nuts.NoUTurnSampler(dist.log_prob, 0.5, backend="pc:graph")
    results = kernel.bootstrap_results(init)
    state, results = kernel.one_step(init, results, seed=[1, 2])
    return state, results.target_log_prob, dist.log_prob(state)
  state, logp, expected = _in_mode(mode, lambda: build([None, 2]))
  assert state.shape == (4, 2)
  np.testing.assert_allclose(logp, expected, rtol=1e-5)
  if mode == "graph":
    with pytest.raises(ValueError, match="placeholder_with_default"):
      _in_mode(mode, lambda: build(None))
