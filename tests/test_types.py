"""Per-example variable types."""
import numpy as np
import tensorflow as tf

from tfp_autobatch.ir import types as types_lib

_F = types_lib.TensorType(tf.float32, (2,))
_I = types_lib.TensorType(tf.int32, ())


def test_zeros_have_the_type_under_the_leading_dims():
  got = types_lib.zeros((_F, _I), 3)
  assert got[0].shape == (3, 2) and got[0].dtype == tf.float32
  assert got[1].shape == (3,) and got[1].dtype == tf.int32
  np.testing.assert_array_equal(got[0], np.zeros([3, 2]))


def test_zeros_with_a_cache_share_one_tensor_per_type():
  """The VM zeroes hundreds of variables of a few types; each distinct
  type is built once."""
  cache = {}
  first = types_lib.zeros((_F, _I), 3, cache=cache)
  again = types_lib.zeros(_F, 3, cache=cache)
  assert again is first[0]
  assert first[1] is not first[0]
  assert len(cache) == 2
  assert types_lib.zeros(_F, 3) is not first[0]
