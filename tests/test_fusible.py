"""Stacks that XLA on CPU fuses into one kernel (`runtime/fusible.py`)."""
import re

import numpy as np
import pytest
import tensorflow as tf

from tfp_autobatch.runtime import fusible
from tfp_autobatch.runtime import register_file


def _kernels(fn, *args):
  """Kernels (fusions, unfused concatenations and copies) in the entry
  computation of `fn`'s optimised XLA program."""
  hlo = fn.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
  entry = hlo[hlo.index("\nENTRY"):]
  return len(re.findall(r" (?:fusion|concatenate|copy)\(", entry))


@pytest.mark.parametrize("count", [1, 8, 9, 20, 65])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_stack_equals_tf_stack(count, axis):
  rng = np.random.default_rng(count)
  values = [tf.constant(rng.standard_normal((3, 2)), tf.float32)
            for _ in range(count)]
  np.testing.assert_array_equal(fusible.stack(values, axis),
                                tf.stack(values, axis))


def test_stack_keeps_static_shapes_with_an_unknown_batch():
  @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
  def stacked(x):
    out = fusible.stack([x * i for i in range(20)])
    assert out.shape.as_list() == [20, None, 4]
    return out
  np.testing.assert_array_equal(stacked(tf.ones([2, 4]))[7], 7 * np.ones([2, 4]))


def test_a_long_stack_of_static_shapes_reshapes_by_a_constant():
  # The shape computed in the graph costs the trace about ten ops more.
  @tf.function
  def stacked(x):
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    out = fusible.stack([x * i for i in range(20)], axis=1)
    types = [op.type for op in graph.get_operations()[before:]]
    assert "Shape" not in types and "ConcatV2" not in types, types
    return out
  np.testing.assert_array_equal(stacked(tf.ones([2, 4]))[:, 7],
                                7 * np.ones([2, 4]))


def test_a_long_stack_of_selects_compiles_to_one_kernel():
  # tf.stack of 20 selects is 20 select kernels and a concatenation under
  # XLA on CPU (it fuses a concatenation of at most 8 operands).
  x = tf.ones([3, 5])
  mask = tf.constant([True, False, True])

  def selects(x, mask):
    return [tf.where(mask[:, None], x * (i + 1.), x) for i in range(20)]

  ours = tf.function(lambda x, m: fusible.stack(selects(x, m)),
                     jit_compile=True)
  plain = tf.function(lambda x, m: tf.stack(selects(x, m)), jit_compile=True)
  assert _kernels(ours, x, mask) == 1
  assert _kernels(plain, x, mask) > 10
  np.testing.assert_array_equal(ours(x, mask), plain(x, mask))


def test_a_register_file_of_many_leaves_round_trips_and_packs_in_one_kernel():
  # 20 integer leaves of widths 1-3 and 10 flags: a file of several chunks
  # (the flags are packed with the integers).
  z = 4
  example = {f"i{k}": tf.reshape(tf.range(z * (1 + k % 3)) * (k + 1),
                                 [z, 1 + k % 3]) for k in range(20)}
  example.update({f"b{k}": tf.constant([k % 2 == 0, True, False, k % 3 == 0])
                  for k in range(10)})
  packing = register_file.RegisterFile(example)
  files, loose = packing.pack(example)
  assert sorted(files) == ["int32"] and not loose
  back = packing.unpack(files, loose)
  for name, want in example.items():
    np.testing.assert_array_equal(back[name], want)

  def repack(files, flag):
    # A block: read every register, change every other one, pack them
    # again (the unchanged ones are slices of the old file).
    nest = dict(packing.unpack(files, []))
    for k in range(0, 20, 2):
      x = nest[f"i{k}"]
      nest[f"i{k}"] = tf.where(flag[:, None], x + k, x)
    return packing.pack(nest)[0]["int32"]

  flag = tf.constant([True, False, True, False])
  compiled = tf.function(repack, jit_compile=True)
  assert _kernels(compiled, files, flag) == 1
  np.testing.assert_array_equal(compiled(files, flag), repack(files, flag))
