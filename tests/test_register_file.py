"""Packing the pc VM's integer and boolean registers into one tensor each."""
import collections

import numpy as np
import tensorflow as tf

from tfp_autobatch.runtime import register_file

Pair = collections.namedtuple("Pair", ["count", "flag"])


def _example(z=3):
  return {
      "pc": tf.constant([0, 1, 2][:z], tf.int32),
      "vars": {"x": tf.ones([z, 4], tf.float32),
               "pair": Pair(tf.reshape(tf.range(z * 6, dtype=tf.int32),
                                       [z, 2, 3]),
                            tf.constant([True, False, True][:z])),
               "n64": tf.constant([5, 6, 7][:z], tf.int64),
               "empty": tf.zeros([z, 0], tf.int32)},
      "steps": tf.constant(9),
  }


def test_pack_unpack_round_trip_and_layout():
  example = _example()
  packing = register_file.RegisterFile(example)
  files, loose = packing.pack(example)
  # One file per packed dtype: int32 (pc 1 + pair.count 6 columns), bool,
  # int64. Floats, the empty leaf and the scalar travel loose.
  assert sorted(files) == ["bool", "int32", "int64"]
  assert files["int32"].shape == (3, 7)
  assert len(loose) == 3
  back = packing.unpack(files, loose)
  tf.nest.assert_same_structure(back, example)
  for got, want in zip(tf.nest.flatten(back), tf.nest.flatten(example)):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_unknown_batch_size_inside_a_graph():
  example = _example()
  packing = register_file.RegisterFile(example)
  specs = tf.nest.map_structure(
      lambda t: tf.TensorSpec([None] + t.shape[1:].as_list(), t.dtype)
      if t.shape.rank else tf.TensorSpec([], t.dtype), example)

  @tf.function(input_signature=[specs])
  def round_trip(nest):
    return packing.unpack(*packing.pack(nest))

  small = _example(z=2)
  for got, want in zip(tf.nest.flatten(round_trip(small)),
                       tf.nest.flatten(small)):
    np.testing.assert_array_equal(got, want)


def test_disabled_packs_nothing():
  example = _example()
  packing = register_file.RegisterFile(example, enabled=False)
  files, loose = packing.pack(example)
  assert files == {}
  assert len(loose) == len(tf.nest.flatten(example))
