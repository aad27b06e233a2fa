"""The program-counter VM's blocks split into dispatches by how much they
write back.

The VM runs a block through a `tf.switch_case` whose branches must all
return the same shapes, so every block of one `tf.switch_case` writes as
many register-bank and stack-bank rows as its largest writer, padded with
zeros: on NUTS's 100-d Gaussian at 64 chains, half the [Z, 100] rows
written were padding when every block shared one. Under XLA the blocks
are therefore grouped into dispatches, each its own `tf.switch_case` in a
loop of its own (see `pc_vm`), and a block pads its writes only to its
dispatch's largest writer.

A block's class is the pair of powers of two at or above the elements
per member it writes to its largest register bank and to the stack banks.
The two are classed apart: a block that pushes much and writes few
registers (NUTS's block after a first half: 8 [d] vectors pushed, 3
written) would pad its register writes to a block writing many (a
trajectory's doubling, 16) if one sum classed them together. The
registers by their largest bank, not their sum: the padding that costs
is the large bank's rows, and NUTS's leaf block on a 32-d model (8 [32]
vectors and 3 scalars, 259 elements) summed into the class of a block
writing 13 [32] vectors and padded its writes to 13 rows. One dispatch
per exact write size was tried and was no faster: the extra loops cost
what the padding saved.
"""
import collections

import numpy as np

from tfp_autobatch.runtime import register_file


class Dispatch(collections.namedtuple(
    "Dispatch", ["blocks", "bank_capacity", "stack_capacity", "writes"])):
  """A set of blocks the VM's loop runs through one `tf.switch_case`.

  `blocks`: their indices; `bank_capacity` and `stack_capacity`: the rows
  each of them writes per register and stack bank (the most any of them
  writes; see `register_file.RegisterBanks` and `stack_banks.StackBanks`);
  `writes`: the packing of their stack writes.
  """


def size_class(elements):
  """The power of two at or above `elements` (as its exponent; 0 for 0)."""
  return int(elements - 1).bit_length() if elements else 0


def _elements(written):
  """Per bank of `written` ({bank key: rows}), the elements per member
  its rows hold."""
  return [n * int(np.prod(key[1], dtype=np.int64))
          for key, n in written.items()]


def group_blocks(changed, pushed, banks, stacks, batch_size, pack):
  """The blocks split into dispatches, one per class of what they write
  back, each with its bank writes sized for its own blocks.

  Args:
    changed: per block, the register positions it may change (see
      `register_file.RegisterBanks.written`).
    pushed: per block, the names of the stacks it pushes to.
    banks: the VM's `register_file.RegisterBanks`.
    stacks: the VM's `stack_banks.StackBanks`.
    batch_size: the batch size where it is known statically, else None.
    pack: whether registers and stack writes are packed (under XLA only).
      Without packing and stack banks nothing is padded, and every block
      goes into one dispatch.
  """
  num_blocks = len(changed)
  classes = [(0, 0)] * num_blocks
  if pack and stacks.enabled:
    for i in range(num_blocks):
      classes[i] = (
          size_class(max(_elements(banks.written(changed[i])), default=0)),
          size_class(sum(_elements(stacks.written(pushed[i])))))
  members = {}   # class -> its blocks, in order
  for i, c in enumerate(classes):
    members.setdefault(c, []).append(i)
  # The VM's loop runs the dispatches' loops in this order, each while the
  # next block is one of its, so a block whose successor's dispatch comes
  # later in the order saves a round of the outer loop (one loop condition
  # per dispatch). Of the simple orders, from the program's last dispatch
  # to its first (by their lowest block) follows a recursive program's
  # flow best: a NUTS transition on the 100-d Gaussian ran its loop
  # conditions 358 times at one chain, where the dispatches sorted by
  # class ran them 428 times (4,075 and 4,831 fused over 10 trajectories
  # at 4 chains; `benchmarks.nuts_profile`, docs/internals.md).
  dispatches = []
  for blocks in sorted(map(tuple, members.values()), key=lambda b: -b[0]):
    stack_capacity = stacks.capacity([pushed[i] for i in blocks])
    # Banked writes are a few [K * Z, ...] tensors, not rows of the batch.
    writes = register_file.RegisterFile(
        stacks.packed_spec(batch_size, stack_capacity),
        enabled=pack and not stacks.enabled)
    dispatches.append(Dispatch(
        blocks, banks.capacity([changed[i] for i in blocks]),
        stack_capacity, writes))
  return dispatches
