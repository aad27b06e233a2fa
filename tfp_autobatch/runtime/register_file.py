"""Register files: a nest of [Z, ...] tensors packed into one [Z, width]
tensor per dtype.

The program-counter VM's loop state and each block's results pass through
`tf.switch_case`. Under XLA every tensor a branch returns is a separate
buffer the branch must fill, so a branch that leaves a variable alone still
copies it: with a hundred small variables a VM step ran a hundred copy
kernels, which cost more than the block's own work at small batch sizes.
Packed, a step copies a few wide rows instead (one per dtype): the same
bytes, a few kernels. Reading a variable is a static column slice, which XLA
fuses into the reader.

Only integer and boolean leaves are packed (the pc, stack pointers, loop
counters, flags: most of the leaves, and tiny). Floating-point registers
stay loose: packing them too made NUTS on the 100 x 10,000 logistic
regression 2x slower per step (680 vs 1,337 gradients/s at one chain;
perhaps because the column slices are then fused into the model's matmul
operands), while packing ints and bools alone made it faster (1,456) and
cut the cost of a VM step of NUTS on the 100-d Gaussian from 69 to 55 us
at one chain (2 AMD EPYC cores, `benchmarks.nuts`, 2026-11-23).
"""
import collections

import numpy as np
import tensorflow as tf

_Slot = collections.namedtuple("_Slot", ["dtype", "start", "event_shape"])


class RegisterFile:
  """The packing of one nest structure; built from an example of it.

  Floating-point leaves, leaves whose shape past the leading (batch)
  dimension is not fully known at trace time or has no elements, and
  scalars are not packed: they travel beside the files.
  """

  def __init__(self, example, enabled=True):
    """`enabled=False` packs nothing: every leaf travels loose."""
    self.structure = example
    self._slots = []
    self.widths = {}
    for leaf in tf.nest.flatten(example):
      shape = leaf.shape
      if (not enabled or leaf.dtype.is_floating
          or shape.rank is None or shape.rank == 0
          or not shape[1:].is_fully_defined()
          or shape[1:].num_elements() == 0):
        self._slots.append(None)
        continue
      key = leaf.dtype.name
      start = self.widths.get(key, 0)
      event_shape = shape[1:].as_list()
      self._slots.append(_Slot(leaf.dtype, start, event_shape))
      self.widths[key] = start + int(np.prod(event_shape, dtype=np.int64))

  def pack(self, nest):
    """`(files, loose)`: {dtype name: [Z, width]} and the unpacked leaves."""
    leaves = tf.nest.flatten(nest)
    columns = {key: [] for key in self.widths}
    loose = []
    for leaf, slot in zip(leaves, self._slots):
      if slot is None:
        loose.append(leaf)
      else:
        columns[slot.dtype.name].append(tf.reshape(
            leaf, [-1, int(np.prod(slot.event_shape, dtype=np.int64))]))
    files = {key: (cols[0] if len(cols) == 1 else tf.concat(cols, axis=1))
             for key, cols in columns.items()}
    return files, loose

  def unpack(self, files, loose):
    """The nest packed by `pack`."""
    loose = iter(loose)
    leaves = []
    for slot in self._slots:
      if slot is None:
        leaves.append(next(loose))
        continue
      file = files[slot.dtype.name]
      width = int(np.prod(slot.event_shape, dtype=np.int64))
      column = file[:, slot.start:slot.start + width]
      leaves.append(tf.reshape(column, tf.concat(
          [tf.shape(file)[:1], slot.event_shape], 0)))
    return tf.nest.pack_sequence_as(self.structure, leaves)
