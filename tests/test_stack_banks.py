"""The pc VM's stacks kept in banks: layout, writes, reads, compiled loop."""
import collections
import re

import numpy as np
import pytest
import tensorflow as tf

import example_programs
from tfp_autobatch import errors
from tfp_autobatch import pipeline
from tfp_autobatch.runtime import stack_banks

D = 4
Pair = collections.namedtuple("Pair", ["count", "weight"])


def _stacks(z):
  return {
      "pc": tf.zeros([D, z], tf.int32),
      "depth": tf.zeros([D, z], tf.int32),
      "pair": Pair(tf.zeros([D, z], tf.int32), tf.zeros([D, z, 2])),
      "x": tf.zeros([D, z, 2]),
      "flag": tf.zeros([D, z], tf.bool),
      # No elements per member: a write has nothing to write, which
      # TensorFlow's scatter rejects (and XLA's) if asked to.
      "empty": tf.zeros([D, z, 0]),
  }


def _write(z, rng, stack):
  row = tf.constant(rng.integers(0, D, z), tf.int32)
  mask = tf.constant(rng.random(z) < 0.6)
  value = tf.nest.map_structure(
      lambda s: tf.constant(rng.integers(1, 99, s.shape[1:]), s.dtype), stack)
  return stack_banks.StackWrite(row, value, mask)


def test_layout_one_bank_per_dtype_and_shape():
  banks = stack_banks.StackBanks(_stacks(3), D)
  # int32 scalars: pc, depth, pair.count; float32 [2]: pair.weight, x; bool;
  # float32 [0]: empty.
  assert banks.sizes == {("int32", ()): 3, ("float32", (2,)): 2,
                         ("bool", ()): 1, ("float32", (0,)): 1}
  state = banks.initial(_stacks(3))
  assert state[("int32", ())].shape == (D, 3, 3)
  assert state[("float32", (2,))].shape == (D, 2, 3, 2)
  capacity = banks.capacity([{"pc", "depth"}, {"pair"},
                             {"x", "pair", "flag"}, set()])
  assert capacity == {("int32", ()): 2, ("float32", (2,)): 2,
                            ("bool", ()): 1, ("float32", (0,)): 0}


# Banks are for XLA only (elsewhere TF raises on their out-of-range rows).
@pytest.mark.parametrize("enabled,xla", [(True, True), (False, True),
                                         (False, False)])
@pytest.mark.parametrize("z", [0, 1, 5])
def test_writes_and_reads_match_one_stack_at_a_time(enabled, xla, z):
  rng = np.random.default_rng(z)
  example = _stacks(z)
  blocks = [{"pc", "depth", "pair"}, {"x", "empty"}, {"flag", "x", "pc"},
            set()]
  banks = stack_banks.StackBanks(example, D, enabled=enabled)
  capacity = banks.capacity(blocks)
  want = dict(example)
  state = banks.initial(example)

  def step(state, writes):
    return banks.apply(state, banks.pack(writes, z, capacity), xla=xla)

  run = tf.function(step, jit_compile=True) if xla else step
  for _ in range(3):
    for names in blocks:
      writes = {n: _write(z, rng, example[n]) for n in sorted(names)}
      for name, write in writes.items():
        want[name] = stack_banks.apply_stack_write(want[name], write)
      state = run(state, writes)
      for name in example:
        tf.nest.map_structure(np.testing.assert_array_equal,
                              banks.view(state, name), want[name])


@pytest.mark.parametrize("z,fills", [(5, 0), (2048, 5)])
def test_a_packed_write_of_few_members_fills_by_constants(z, fills):
  """A bank write's slot indices and padding rows, a fill each, cost the
  trace three ops a leaf: constants where the batch is static and small;
  a large one is filled when it runs (a constant would be carried whole
  in the graph and the HLO)."""
  rng = np.random.default_rng(0)
  example = _stacks(z)
  banks = stack_banks.StackBanks(example, D)
  capacity = banks.capacity([{"pc", "depth", "pair"}, {"x", "flag", "pc"}])
  writes = {n: _write(z, rng, example[n]) for n in ("x", "flag", "pc")}
  types = []
  @tf.function(jit_compile=True, autograph=False)
  def step(state, writes):
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    packed = banks.pack(writes, z, capacity)
    types.extend(op.type for op in graph.get_operations()[before:])
    return banks.apply(state, packed, xla=True)
  state = step(banks.initial(example), writes)
  assert types.count("Fill") == fills
  for name, write in writes.items():
    tf.nest.map_structure(
        np.testing.assert_array_equal, banks.view(state, name),
        stack_banks.apply_stack_write(example[name], write))


def test_unbanked_stacks_left_alone_share_their_zeros():
  # Outside XLA every stack a block does not push gets a write that writes
  # nothing; a block's such writes share their zeros (one per dtype and
  # shape, and one row and mask tensor) instead of each building its own.
  banks = stack_banks.StackBanks(_stacks(3), D, enabled=False)
  packed = banks.pack({"x": _write(3, np.random.default_rng(0),
                                   _stacks(3)["x"])}, 3, capacity=None)
  left_alone = [packed[n] for n in ("pc", "depth", "pair", "flag")]
  assert len({id(w.row) for w in left_alone}) == 1
  assert len({id(w.mask) for w in left_alone}) == 1
  pair = packed["pair"].value
  assert packed["pc"].value is packed["depth"].value is pair.count
  assert pair.weight.shape == (3, 2)
  assert not np.any(pair.weight) and not np.any(packed["flag"].mask)


def test_more_writes_than_reserved_is_an_ir_error():
  banks = stack_banks.StackBanks(_stacks(2), D)
  capacity = banks.capacity([{"x"}])
  writes = {n: _write(2, np.random.default_rng(0), _stacks(2)[n])
            for n in ("x", "pair")}
  with pytest.raises(errors.IRError, match="more than the 1 reserved"):
    banks.pack(writes, 2, capacity)


def test_compiled_loop_scatters_once_per_bank():
  # tree_depth_sum keeps two int32 arguments and an int32 result across its
  # recursive calls: with the pc, several int32 stacks, one bank.
  fn = example_programs.tree_depth_sum
  args = [tf.constant([3, 1, 2], tf.int32), tf.constant([0, 1, 2], tf.int32)]
  fn(*args, backend="pc:xla")
  runtime = pipeline.runtime(fn, fn._last_types, "pc:xla")  # pylint: disable=protected-access
  layout = runtime.layout_for(3)
  stacks = layout.stacks
  assert len(stacks.names) > len(stacks.sizes) == 1
  hlo = runtime.compiled_for(args).experimental_get_compiler_ir(*args)(
      stage="optimized_hlo")
  # One scatter per bank in each dispatch's loop (see
  # `dispatch.group_blocks`) that writes the bank.
  dispatches = layout.dispatches
  writing = [d for d in dispatches if d.stack_capacity[("int32", ())]]
  assert all(not any(d.bank_capacity.values()) for d in dispatches)
  assert len(re.findall(r" scatter\(", hlo)) == len(writing) >= 1


def test_flat_rows_of_stacks_past_two_to_the_31_rows_are_int64():
  # A [D, Z] stack seen as D * Z rows: with D * Z >= 2**31 the int32 row
  # `sp * Z + i` wrapped negative (a member 2,048 frames deep of 2**20).
  z, depth = 2**20, 4096
  sp = tf.constant([2047, 4095], tf.int32)
  # Two members of a batch of 2**20: their rows, as the first two.
  rows = stack_banks._flat_rows(depth, tf.concat(   # pylint: disable=protected-access
      [sp, tf.zeros([z - 2], tf.int32)], 0))[:2]
  assert rows.dtype == tf.int64
  assert rows.numpy().tolist() == [2047 * z, 4095 * z + 1]
  # Within int32 the rows stay int32 (the common case, and XLA's).
  small = stack_banks._flat_rows(16, tf.constant([3, 0]))   # pylint: disable=protected-access
  assert small.dtype == tf.int32 and small.numpy().tolist() == [6, 1]
  # A batch size unknown at trace time cannot be checked: int64.
  unknown = tf.function(stack_banks._flat_rows).get_concrete_function(   # pylint: disable=protected-access
      16, tf.TensorSpec([None], tf.int32))
  assert unknown.structured_outputs.dtype == tf.int64
