"""Structured states (dicts, namedtuples, StructTuples, nests) and a
JointDistribution's `unnormalized_log_prob` as the target."""
import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import nuts

tfd = tfp.distributions

Point = collections.namedtuple("Point", ["loc", "scale_raw"])


def _named():
  return tfd.JointDistributionNamed(dict(
      loc=tfd.Normal(tf.constant(1., tf.float64), 2.),
      x=lambda loc: tfd.Independent(tfd.Normal(
          loc[..., tf.newaxis] * tf.ones([3], tf.float64), 0.5), 1)))


def _coroutine():
  @tfd.JointDistributionCoroutine
  def model():
    loc = yield tfd.JointDistributionCoroutine.Root(
        tfd.Normal(tf.constant(1., tf.float64), 2., name="loc"))
    yield tfd.Independent(tfd.Normal(loc[..., tf.newaxis] * tf.ones([3], tf.float64), 0.5), 1,
                          name="x")
  return model


def _step(target, state, **kwargs):
  kernel = nuts.NoUTurnSampler(target, 0.3, backend="pc:graph", **kwargs)
  results = kernel.bootstrap_results(state)
  new_state, results = kernel.one_step(state, results, seed=[5, 6])
  return kernel, new_state, results


@pytest.mark.parametrize("make", [_named, _coroutine])
def test_a_joint_distributions_state_and_unnormalized_log_prob(make):
  """The state in the JointDistribution's own structure (a dict, a
  StructTuple), its `unnormalized_log_prob` the target: the step returns
  that structure, and its log density is the target's at the new state."""
  model = make()
  state = model.sample(4, seed=[1, 2])
  kernel, new_state, results = _step(model.unnormalized_log_prob, state)
  assert type(new_state) is type(state)   # pylint: disable=unidiomatic-typecheck
  tf.nest.assert_same_structure(new_state, state)
  np.testing.assert_allclose(results.target_log_prob,
                             model.unnormalized_log_prob(new_state),
                             rtol=1e-10)
  assert kernel.batched_program(new_state, results) is not None
  moved = [np.any(np.asarray(a) != np.asarray(b))
           for a, b in zip(tf.nest.flatten(new_state), tf.nest.flatten(state))]
  assert all(moved)


def test_namedtuple_and_nested_states():
  """A namedtuple is unpacked into the target's arguments (as tfp.mcmc
  kernels call a target on a tuple), a nested list too."""
  def target(loc, scale_raw):
    return (tfd.Normal(0., 1.).log_prob(loc)
            + tf.reduce_sum(tfd.Normal(0., 1.).log_prob(scale_raw), -1))
  state = Point(tf.zeros([3]), tf.ones([3, 2]))
  _, new_state, results = _step(target, state)
  assert isinstance(new_state, Point)
  np.testing.assert_allclose(results.target_log_prob, target(*new_state),
                             rtol=1e-5)

  def nested(a, bc):
    return target(a, bc["b"]) + tf.reduce_sum(bc["c"] ** 2, -1)
  state = [tf.zeros([3]), {"b": tf.ones([3, 2]), "c": tf.ones([3, 1])}]
  _, new_state, results = _step(nested, state)
  tf.nest.assert_same_structure(new_state, state)
  np.testing.assert_allclose(results.target_log_prob, nested(*new_state),
                             rtol=1e-5)


def test_a_dict_state_with_a_momentum_distribution_over_it():
  model = _named()
  state = model.sample(4, seed=[3, 4])
  metric = tfd.JointDistributionNamed(dict(
      loc=tfd.Normal(tf.constant(0., tf.float64), 0.5),
      x=tfd.Independent(tfd.Normal(tf.zeros([3], tf.float64), 2.), 1)))
  _, new_state, results = _step(model.unnormalized_log_prob, state,
                                momentum_distribution=metric)
  assert set(new_state) == {"loc", "x"}
  assert results.momentum_distribution is not None


def test_a_state_part_that_is_not_a_tensor_says_so():
  with pytest.raises(TypeError, match="floating point"):
    nuts.NoUTurnSampler(lambda x: -tf.reduce_sum(x["a"] ** 2, -1),
                        0.1).bootstrap_results({"a": "text"})
