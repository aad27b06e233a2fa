"""Which block the program-counter VM runs next (paper section 3).

Each VM step runs one block for the members waiting at it. A schedule
picks that block from the members' program counters:

- "lowest_pc" (the paper's): the lowest block any member waits at;
- "most_waiting": the block most members wait at (the lowest of ties);
- "crowded_lowest_pc": the lowest block holding at least half as many
  members as the most crowded one; on collatz it takes about as few
  steps as most_waiting (about half of lowest_pc's), on fib a few more
  than lowest_pc, and it is what NUTS runs, under primitives_last (each
  call's `RunStats` counts its steps);
- "primitives_last" (the backends' default): crowded_lowest_pc, except
  that blocks calling a `@batched_primitive` run only when no other block
  has members, so the model runs on as many members as can reach it, and
  the program's halting blocks (`halting_blocks`) only when no block
  outside them has members: a member there has nothing left but that
  block, so it runs once for all of them at the end. Without either it is
  crowded_lowest_pc.
"""
import numpy as np
import tensorflow as tf

from tfp_autobatch.ir import ir2
from tfp_autobatch.runtime import _tf_private

SCHEDULES = ("lowest_pc", "most_waiting", "crowded_lowest_pc",
             "primitives_last")


class Schedule:
  """`next_block(pc_top)` of an IR-2 program under one of `SCHEDULES`."""

  def __init__(self, program, schedule):
    if schedule not in SCHEDULES:
      raise ValueError(f"schedule must be one of {SCHEDULES}, not {schedule!r}")
    self.name = schedule
    self._halt = program.halt
    # The schedule's constants, as NumPy arrays: each a constant of the
    # graph where a step is traced (computed there, they were a few ops
    # each, in every dispatch loop's step).
    # primitives_last's tiers, each a mask of the blocks that may run while
    # one of them has members, the first tier first (see `next_block`):
    # the blocks outside the model and the halting blocks, then those
    # outside the halting blocks; the rest run last.
    self._tiers = []
    if schedule == "primitives_last":
      calls_model = np.array(
          [ir2.calls_batched_primitive(b) for b in program.blocks], bool)
      halting = np.zeros(self._halt, bool)
      halting[list(halting_blocks(program))] = True
      for deferred in (calls_model | halting, halting):
        if deferred.any() and not any(
            np.array_equal(1 - deferred, t) for t in self._tiers):
          self._tiers.append((1 - deferred).astype(np.int32))
    self._blocks = np.arange(self._halt, dtype=np.int32)

  def next_block(self, pc_top):
    """The index of the block to run next (a scalar tensor), or the halt
    label once no member waits at a block; `pc_top` [Z] holds the block
    each member waits at."""
    halt = self._halt
    if pc_top.shape[0] == 1:
      # One member: every schedule picks the block it waits at (the halt
      # label once it is done).
      return tf.reshape(pc_top, [])
    if self.name == "lowest_pc":
      return tf.reduce_min(tf.concat([pc_top, [halt]], 0))
    # Each schedule is maxima over the blocks' member counts, then the
    # lowest block index that qualifies (the halt label if none does).
    if _tf_private.in_xla_context():
      # XLA fuses the one-hot into the sum.
      counts = tf.reduce_sum(tf.one_hot(pc_top, halt, dtype=tf.int32), 0)
    else:
      # TensorFlow builds the [Z, blocks] one-hot, a noticeable part of a
      # `pc:graph` step on thousands of members. An integer segment sum, not
      # bincount, which TF refuses on a GPU under op determinism; the
      # halted members' segment is dropped.
      counts = tf.math.unsorted_segment_sum(
          tf.ones_like(pc_top), pc_top, halt + 1)[:halt]
    if not self._tiers:
      most = tf.reduce_max(counts)
    else:
      # A tier's blocks wait while the tier before it has members: the
      # model (the expensive part) runs for as many members as can reach
      # it, and a halting block once, at the end. Every tier's maximum in
      # one reduction, the masks applied inside it: under XLA each
      # reduction, and a masked count that two of them read, was a kernel
      # launched every VM step.
      maxima = tf.unstack(tf.reduce_max(
          counts * np.stack([np.ones(halt, np.int32)] + self._tiers), 1))
      tier_counts, most = counts, maxima[0]
      for mask, tier_most in reversed(list(zip(self._tiers, maxima[1:]))):
        waiting = tier_most > 0
        tier_counts = tf.where(waiting, counts * mask, tier_counts)
        most = tf.where(waiting, tier_most, most)
      counts = tier_counts
    if self.name in ("crowded_lowest_pc", "primitives_last"):
      # The lowest block holding at least half as many members as the most
      # crowded one: keeps lowest-pc's depth-first recursion, but does not
      # starve a crowded block behind a loop that a few members keep taking.
      picked = tf.logical_and(counts > 0, 2 * counts >= most)
    else:
      picked = tf.logical_and(counts > 0, counts >= most)
    return tf.reduce_min(tf.where(picked, self._blocks, halt))


def halting_blocks(program):
  """The blocks after which a member halts: those of the entry function
  (the program's first block's) that return, where no call enters that
  function again. Running one waits for nothing and nothing waits for it.
  """
  entry = ir2.function_of(program.blocks[0].label)
  if any(ir2.call_of(b.terminator) is not None
         and ir2.callee_of(ir2.call_of(b.terminator)) == entry
         for b in program.blocks):
    return frozenset()
  return frozenset(i for i, b in enumerate(program.blocks)
                   if ir2.function_of(b.label) == entry
                   and isinstance(b.terminator, ir2.Return))
