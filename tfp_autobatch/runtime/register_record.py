"""The reverse VM's record of the registers: each register's values, one
entry per version, rather than one per step.

A backward step (`reverse_vm`) runs its block again on the registers the
block started from. A register's value before step t is the value its
last writer left, so the record keeps, per register leaf, its value at
the start (version 0) and after each step whose block writes it
(versions 1, 2, ...), and the loops carry each leaf's version. A block
that leaves a leaf alone (found while tracing it: it returns the very
tensor it was given) writes no version of it: the record's write is in
the block's branch of the conditional over the blocks, as the backward
step's read is. A BiLSTM tagger's [max length, hidden] table of forward
states is such a leaf: its loop over the tokens writes it, the loop back
reads it, and recorded at every step, its writes were most of the
recording run's own time (`benchmarks.neural_profile`).

Its arrays are `tf.TensorArray`s of `bound` + 1 entries (a leaf may be
written at every step), updated in place under XLA.
"""
import tensorflow as tf


class RegisterRecord:
  """The record described in the module docstring, of the start state's
  register leaves `start_leaves`, for a program of `num_blocks` blocks,
  over at most `bound` steps.

  `written` is called in each block's branch while the recording run is
  traced, and learns which leaves the block writes; the other methods
  use what it learned, so they are traced after every block's branch.
  """

  def __init__(self, start_leaves, num_blocks, bound):
    self.start_leaves = list(start_leaves)
    self.num_blocks = num_blocks
    self.bound = bound
    self.writers = [set() for _ in self.start_leaves]

  def start(self):
    """`(arrays, versions)` holding the start leaves as version 0."""
    arrays = [tf.TensorArray(x.dtype, size=self.bound + 1,
                             element_shape=x.shape).write(0, x)
              for x in self.start_leaves]
    return arrays, tf.zeros([len(arrays)], tf.int32)

  def written(self, block, arrays, versions, before, after):
    """`arrays` with the leaves block `block` changed (`after` where not
    `before`) written at their next version, in the block's branch."""
    arrays = list(arrays)
    for k, (old, new) in enumerate(zip(before, after)):
      if new is not old:
        self.writers[k].add(block)
        arrays[k] = arrays[k].write(versions[k] + 1, new)
    return arrays

  def _writes(self, block):
    """[leaves] int32 (a tensor, for a tensor `block`): 1 where the
    block writes the leaf."""
    writes = [[int(b in w) for w in self.writers]
              for b in range(self.num_blocks)]
    if isinstance(block, int):
      return writes[block]
    return tf.gather(tf.constant(writes, tf.int32), block)

  def after(self, versions, block):
    """The leaves' versions after a step of block `block`."""
    return versions + self._writes(block)

  def before(self, versions, block):
    """The leaves' versions before a step of block `block`."""
    return versions - self._writes(block)

  def values(self, arrays, versions):
    """The leaves at `versions` (read in the branch that uses them: XLA
    drops the reads a block does not use)."""
    return [a.read(versions[k]) for k, a in enumerate(arrays)]
