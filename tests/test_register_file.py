"""Packing the pc VM's integer and boolean registers into one tensor each."""
import collections

import numpy as np
import pytest
import tensorflow as tf

from tfp_autobatch import errors
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
  # One file per packed dtype, booleans in the int32 one: int32 (pc 1 +
  # pair.count 6 + pair.flag 1 columns) and int64. Floats, the empty leaf
  # and the scalar travel loose.
  assert sorted(files) == ["int32", "int64"]
  assert files["int32"].shape == (3, 8)
  np.testing.assert_array_equal(files["int32"][:, 7], [1, 0, 1])
  assert len(loose) == 3
  back = packing.unpack(files, loose)
  tf.nest.assert_same_structure(back, example)
  for got, want in zip(tf.nest.flatten(back), tf.nest.flatten(example)):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_a_large_batch_packs_registers_as_rows():
  """From `ROWS_FROM_BATCH` members a register is a row of its file:
  XLA's CPU kernel that builds a file concatenates rows as runs and
  columns element by element (fib on 1,024 members: 10.9 to 6.9 us a VM
  step)."""
  z = register_file.ROWS_FROM_BATCH
  example = {"pc": tf.range(z, dtype=tf.int32),
             "pair": Pair(tf.reshape(tf.range(z * 6, dtype=tf.int32),
                                     [z, 2, 3]),
                          tf.range(z) % 3 == 0),
             "x": tf.ones([z, 2])}
  packing = register_file.RegisterFile(example)
  assert packing.axis == 0
  assert register_file.RegisterFile(_example()).axis == 1
  files, loose = packing.pack(example)
  # The file's own dtype first, then booleans, each in flat order:
  # pair.count (6 registers), pc, pair.flag; x travels loose.
  assert files["int32"].shape == (8, z)
  np.testing.assert_array_equal(files["int32"][:6, 1], range(6, 12))
  np.testing.assert_array_equal(files["int32"][6], range(z))
  np.testing.assert_array_equal(files["int32"][7], np.arange(z) % 3 == 0)
  back = packing.unpack(files, loose)
  for got, want in zip(tf.nest.flatten(back), tf.nest.flatten(example)):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(packing.unpack_leaf(files, loose, 0),
                                example["pair"].count)
  np.testing.assert_array_equal(packing.unpack_leaf(files, loose, 2),
                                example["pc"])


@pytest.mark.parametrize("enabled", [True, False])
def test_one_leaf_unpacked_alone_is_that_leaf_of_the_whole(enabled):
  """`unpack_leaf` reads one leaf from the files, also past the first
  chunk of a file of many leaves (each chunk padded to one width)."""
  many = {f"r{i:02d}": tf.reshape(tf.range(3 * (1 + i % 3), dtype=tf.int32)
                                  + 100 * i, [3, 1 + i % 3])
          for i in range(21)}
  for example in (_example(), dict(_example(), many=many)):
    packing = register_file.RegisterFile(example, enabled=enabled)
    files, loose = packing.pack(example)
    if enabled and "many" in example:
      assert len(packing._chunks["int32"]) > 1
    for i, want in enumerate(tf.nest.flatten(example)):
      got = packing.unpack_leaf(files, loose, i)
      assert got.dtype == want.dtype
      np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("z", [3, register_file.ROWS_FROM_BATCH])
def test_round_trip_of_many_leaves_mixing_scalars_and_vectors(z):
  """A file of several chunks, with runs of per-member scalars (stacked)
  between vectors (reshaped), booleans among them; registers as columns
  (3 members) and as rows (`ROWS_FROM_BATCH`)."""
  many = {f"r{i:02d}": (tf.range(z) % (i + 2) == 0 if i % 5 == 4
                        else tf.reshape(tf.range(z * (i % 3 or 1),
                                                 dtype=tf.int32) + 100 * i,
                                        [z] if i % 3 == 0 else [z, i % 3]))
          for i in range(23)}
  example = dict(_example(), many=many) if z == 3 else many
  packing = register_file.RegisterFile(example)
  assert packing.axis == (1 if z == 3 else 0)
  files, loose = packing.pack(example)
  assert len(packing._chunks["int32"]) > 1
  back = packing.unpack(files, loose)
  for i, (got, want) in enumerate(zip(tf.nest.flatten(back),
                                      tf.nest.flatten(example))):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(packing.unpack_leaf(files, loose, i), want)


def test_scalar_registers_pack_and_unpack_in_a_few_ops():
  """Per-member scalars (most of the VM's registers, packed and unpacked
  by every block) cost the trace a few ops per chunk, not some per leaf:
  with a reshape per leaf a NUTS trace was 28% larger."""
  graph = tf.Graph()
  with graph.as_default():
    example = {f"r{i:02d}": tf.compat.v1.placeholder(
        tf.bool if i % 4 == 0 else tf.int32, [3]) for i in range(40)}
    packing = register_file.RegisterFile(example)
    before = len(graph.get_operations())
    packing.unpack(*packing.pack(example))
    built = [op.type for op in graph.get_operations()[before:]]
  # About 30 ops for the six chunks: fewer ops than leaves. The 10
  # booleans are laid out together, so they go into the int32 file in one
  # cast (a cast each cost the trace about twenty ops a NUTS block) and
  # come out of it in one.
  assert len(built) < 40, built
  assert built.count("Cast") <= 3, built


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


def _float_example(z=3):
  return {"pc": tf.constant([0, 1, 2][:z], tf.int32),
          "vars": {"a": tf.reshape(tf.range(z * 2, dtype=tf.float32), [z, 2]),
                   "b": tf.ones([z, 2], tf.float32) * 7.,
                   "s": tf.constant([1., 2., 3.][:z], tf.float64),
                   "w": tf.fill([z, 2], 5.)}}


def test_banks_group_float_registers_by_dtype_and_shape():
  example = _float_example()
  banks = register_file.RegisterBanks(example)
  stacked, rest = banks.split(example)
  assert sorted(stacked) == [("float32", (2,)), ("float64", ())]
  assert stacked[("float32", (2,))].shape == (3, 3, 2)    # a, b, w
  assert [t.dtype for t in rest] == [tf.int32]            # pc
  back = banks.join(stacked, rest)
  for got, want in zip(tf.nest.flatten(back), tf.nest.flatten(example)):
    np.testing.assert_array_equal(got, want)


def test_bank_writes_change_only_the_written_registers():
  example = _float_example()
  banks = register_file.RegisterBanks(example)
  stacked, rest = banks.split(example)
  positions = {"a": 1, "b": 2, "s": 3, "w": 4}   # flat order: pc, a, b, s, w
  # Blocks that may change {a, w} and {b}: the float32 bank takes 2 rows.
  capacity = banks.capacity([{positions["a"], positions["w"]},
                             {positions["b"]}])
  assert capacity == {("float32", (2,)): 2, ("float64", ()): 0}
  old = banks.join(stacked, rest)
  new = {"pc": old["pc"], "vars": dict(old["vars"], b=old["vars"]["b"] + 1.)}
  writes = banks.changes(new, old, {positions["b"]}, capacity)
  index, values = writes[("float32", (2,))]
  # b, then a padding write to row 3, past the bank's end (XLA skips it).
  assert index.numpy().tolist() == [1, 3]
  assert values.shape == (2, 3, 2)
  after = tf.function(lambda: banks.apply(stacked, writes),
                      jit_compile=True)()
  got = banks.join(after, rest)["vars"]
  np.testing.assert_array_equal(got["b"], example["vars"]["b"] + 1.)
  np.testing.assert_array_equal(got["a"], example["vars"]["a"])
  np.testing.assert_array_equal(got["w"], example["vars"]["w"])


def test_bank_writes_with_an_empty_batch_compile_and_do_nothing():
  # TF's public scatter rejects indices into a bank with no elements at XLA
  # compile time; an empty batch makes such banks.
  example = tf.nest.map_structure(lambda t: t[:0], _float_example())
  banks = register_file.RegisterBanks(example)
  stacked, rest = banks.split(example)
  capacity = banks.capacity([{2}])
  old = banks.join(stacked, rest)
  new = {"pc": old["pc"], "vars": dict(old["vars"], b=old["vars"]["b"] + 1.)}
  writes = banks.changes(new, old, {2}, capacity)
  after = tf.function(lambda: banks.apply(stacked, writes),
                      jit_compile=True)()
  assert after[("float32", (2,))].shape == (3, 0, 2)


def test_bank_write_outside_the_declared_registers_is_an_error():
  example = _float_example()
  banks = register_file.RegisterBanks(
      example, names=["pc", "a", "b", "s", "w"])
  stacked, rest = banks.split(example)
  capacity = banks.capacity([{1}])
  old = banks.join(stacked, rest)
  new = {"pc": old["pc"], "vars": dict(old["vars"], w=old["vars"]["w"] * 2.)}
  with pytest.raises(errors.IRError, match="'w' changed"):
    banks.changes(new, old, {1}, capacity)


def test_integer_and_boolean_leaves_named_for_banks_share_the_int32_bank():
  example = {"pc": tf.constant([0, 1, 2]),
             "vars": {"count": tf.constant([4, 5, 6]),
                      "flag": tf.constant([True, False, True]),
                      "seed": tf.reshape(tf.range(9), [3, 3]),
                      "x": tf.ones([3]) * 2.}}
  # Flat order: pc, count, flag, seed, x; the pc stays out of the banks.
  banks = register_file.RegisterBanks(
      example, integer_leaves=[False, True, True, True, False])
  stacked, rest = banks.split(example)
  assert sorted(stacked) == [("float32", ()), ("int32", ()), ("int32", (3,))]
  assert stacked[("int32", ())].numpy().tolist() == [[4, 5, 6], [1, 0, 1]]
  assert [t.dtype for t in rest] == [tf.int32]
  old = banks.join(stacked, rest)
  assert old["vars"]["flag"].dtype == tf.bool
  for got, want in zip(tf.nest.flatten(old), tf.nest.flatten(example)):
    np.testing.assert_array_equal(got, want)
  # A block that flips the flag writes one row of the int32 bank.
  capacity = banks.capacity([{2}])
  new = {"pc": old["pc"], "vars": dict(
      old["vars"], flag=tf.logical_not(old["vars"]["flag"]))}
  writes = banks.changes(new, old, {2}, capacity)
  assert writes[("int32", ())][0].numpy().tolist() == [1]
  after = tf.function(lambda: banks.apply(stacked, writes),
                      jit_compile=True)()
  got = banks.join(after, rest)["vars"]
  np.testing.assert_array_equal(got["flag"], [False, True, False])
  np.testing.assert_array_equal(got["count"], [4, 5, 6])


def test_banks_disabled_bank_nothing():
  example = _float_example()
  stacked, rest = register_file.RegisterBanks(
      example, enabled=False).split(example)
  assert stacked == {}
  assert len(rest) == 5


def test_the_differential_tests_run_a_batch_packed_as_rows():
  # `tests/example_programs.py`'s every-batch-size programs run pc:xla on a
  # batch whose register files are rows (checked against their oracles).
  import example_programs   # pylint: disable=import-outside-toplevel
  assert max(example_programs.ALL_BATCHES) >= register_file.ROWS_FROM_BATCH
