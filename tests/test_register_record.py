"""The reverse VM's register record (`register_record`): a register's
values by version, written only by the blocks that change it."""
import numpy as np
import tensorflow as tf

from tfp_autobatch.runtime import register_record

# Block 0 changes the first leaf, block 1 the second, block 2 neither.
BLOCKS = [0, 1, 2, 0, 2, 1, 0, 0, 2]


def _block(i, leaves):
  small, table = leaves
  if i == 0:
    return [small + 1.0, table]
  if i == 1:
    return [small, table * 2.0 + tf.reduce_sum(small)]
  return [small, table]


def _recorded_run(blocks):
  """Runs `_block` over `blocks` in a compiled loop, recording, then reads
  back every step's leaves before it, last step first: (the leaves
  before each step, in step order; the versions at the end; the writers
  found)."""
  start = [tf.zeros([3]), tf.ones([4, 5])]
  record = register_record.RegisterRecord(start, 3, len(blocks))

  @tf.function(jit_compile=True, autograph=False)
  def run(blocks):
    arrays, versions = record.start()
    def body(t, leaves, arrays, versions):
      block = blocks[t]
      def branch(i):
        after = _block(i, leaves)
        return after, record.written(i, arrays, versions, leaves, after)
      leaves, arrays = tf.switch_case(
          block, [lambda i=i: branch(i) for i in range(3)])
      return t + 1, leaves, arrays, record.after(versions, block)
    _, _, arrays, versions = tf.while_loop(
        lambda t, *_: t < len(BLOCKS), body,
        (tf.constant(0), start, arrays, versions))
    end_versions = versions
    before = []
    for t in reversed(range(len(BLOCKS))):
      versions = record.before(versions, blocks[t])
      before.append(record.values(arrays, versions))
    return before[::-1], end_versions

  before, end_versions = run(tf.constant(blocks))
  return before, end_versions.numpy(), record.writers


def _expected_before(blocks):
  leaves = [np.zeros(3, np.float32), np.ones([4, 5], np.float32)]
  before = []
  for i in blocks:
    before.append(leaves)
    leaves = [np.asarray(x) for x in
              _block(i, [tf.constant(x) for x in leaves])]
  return before


def test_each_step_reads_back_the_registers_it_started_from():
  before, _, _ = _recorded_run(BLOCKS)
  for got, expected in zip(before, _expected_before(BLOCKS)):
    for g, e in zip(got, expected):
      np.testing.assert_allclose(g, e)


def test_a_register_gets_a_version_only_where_a_block_changes_it():
  _, end_versions, writers = _recorded_run(BLOCKS)
  assert writers == [{0}, {1}]
  # Four steps of block 0 wrote the first leaf, two of block 1 the
  # second; block 2's three steps wrote neither.
  np.testing.assert_array_equal(end_versions, [4, 2])
