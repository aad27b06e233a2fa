"""The program-counter VM's run statistics, counted inside its loop.

The counters travel in the VM's loop state, so they are counted alike
eagerly, in graph mode and under XLA; when the loop ends they become a
`RunStats` (called eagerly) or a dict of tensors of the caller's graph
(traced). They are one int64 vector (sums of members or rows over the steps
pass 2**31 in reach: 131,072 members each taking 17,000 steps), laid out
as

  [STEPS]             blocks executed (VM steps)
  [ACTIVE]            summed over steps, the members of the block run
  [ROWS]              rows the `@batched_primitive` calls computed
  [HIGH]              deepest stack reached (the pc's stack pointer)
  [EXECUTIONS:][:B]   executions per block, for a program of B blocks
  [EXECUTIONS + B:]   histogram of Z + 1 entries: entry k counts the
                      `@batched_primitive` calls made for k members

The two counts over members, ACTIVE and HIGH, are kept per member during
the run instead (`MEMBER_REGISTERS`: the steps each member took part in,
the deepest its stack went), in registers that every block writes with
the pc, so their updates cost no kernel of their own under XLA; `ended`
sums them into the vector. A step then updates the vector by one
addition of what needs no reduction over the members (one kernel, where
reducing the members at every step took five or six:
`python -m benchmarks.nuts_profile`).

When the loop ends, `ended` also appends the members that overflowed
their stack and those that faulted on a subscript, so that an eager call
reads everything it checks in one transfer (`split_ended`).
"""
import numpy as np
import tensorflow as tf

from tfp_autobatch.runtime import batch_state
from tfp_autobatch.runtime import stats as stats_lib

STEPS, ACTIVE, ROWS, HIGH, EXECUTIONS = range(5)


# The per-member registers the VM keeps for the counts over members: the
# steps each member took part in, and the deepest its pc stack went.
MEMBER_REGISTERS = ("member_steps", "member_depth")


def initial(z, num_blocks):
  """The counters before the first step, for a batch of `z` (a scalar
  tensor) and a program of `num_blocks` blocks."""
  return tf.zeros(tf.reshape(EXECUTIONS + num_blocks + z + 1, [1]), tf.int64)


def initial_member_registers(z):
  """`MEMBER_REGISTERS` before the first step: no steps taken, and the
  entry frame on every member's stack (depth 1)."""
  return {"member_steps": tf.zeros([z], tf.int32),
          "member_depth": tf.ones([z], tf.int32)}


def member_registers_after(before, after, block):
  """`MEMBER_REGISTERS` of `after`, the state block `block` left, from
  `before`, the state it ran on (dicts holding them, `pc_top` and
  `pc_sp`)."""
  ran = tf.cast(tf.equal(before["pc_top"], block), tf.int32)
  return {"member_steps": before["member_steps"] + ran,
          "member_depth": tf.maximum(before["member_depth"],
                                     after["pc_sp"])}


def after_step(counters, block, num_blocks, rows, members):
  """The counters after block `block` ran.

  `rows`: the rows its model calls computed; `members`: the members of
  each of its model calls, as a vector (-1, no call, counts nothing), or
  None when the block's dispatch makes no model calls (the histogram is
  then left alone).
  """
  i64 = tf.int64
  bins = batch_state.size(counters) - EXECUTIONS - num_blocks
  if members is None:
    histogram = tf.zeros([bins], i64)
  else:
    histogram = tf.reduce_sum(tf.one_hot(members, bins, dtype=i64), 0)
  step = tf.concat([
      tf.ones([1], i64), tf.zeros([1], i64), tf.cast(rows, i64)[None],
      tf.zeros([1], i64), tf.one_hot(block, num_blocks, dtype=i64),
      histogram], 0)
  return counters + step


def ended(counters, member_registers, overflow, faulted):
  """The final counters, with the counts over members summed from
  `member_registers` (`MEMBER_REGISTERS`, [Z] each), followed by the
  counts of members that overflowed (`overflow`, [Z] bool) and that
  faulted on a subscript (`faulted`, [Z] bool): an eager caller reads all
  three in one `.numpy()`, where each read of another of the VM's results
  is a device-to-host copy of its own, noticeable on a small program's
  call."""
  def count(values):
    return tf.reduce_sum(tf.cast(values, tf.int64))[None]
  high = tf.cast(tf.reduce_max(tf.concat(
      [member_registers["member_depth"], [0]], 0)), tf.int64)
  counters = tf.concat([counters[:ACTIVE],
                        count(member_registers["member_steps"]),
                        counters[ACTIVE + 1:HIGH], high[None],
                        counters[HIGH + 1:]], 0)
  return tf.concat([counters, count(overflow), count(faulted)], 0)


def split_ended(ended_counters):
  """`(counters, members overflowed, members faulted)` of what `ended`
  returned (a tensor or a NumPy array)."""
  return ended_counters[:-2], ended_counters[-2], ended_counters[-1]


def _named(counters, labels):
  """The counters (NumPy values or tensors) under `RunStats`' field names:
  `block_executions` by block label, `batched_primitive_members` the
  histogram vector."""
  executions = counters[EXECUTIONS:EXECUTIONS + len(labels)]
  return {
      "steps": counters[STEPS],
      "active_members": counters[ACTIVE],
      "max_stack_depth": counters[HIGH],
      "batched_primitive_rows": counters[ROWS],
      "batched_primitive_members": counters[EXECUTIONS + len(labels):],
      "block_executions": {label: executions[i]
                           for i, label in enumerate(labels)},
  }


def to_stats(counters, batch_size, labels):
  """The `RunStats` of final counters (an eager tensor or array); `labels`
  are the program's block labels, in block order."""
  return stats_lib.RunStats.of_tensors(_named(np.asarray(counters), labels),
                                       batch_size)


def to_tensors(counters, labels):
  """Final counters traced in a graph, under `RunStats`' field names
  (`_named`). The sums over steps are int64, the rest int32."""
  named = _named(counters, labels)
  def small(x):
    return tf.cast(x, tf.int32)
  return dict(
      named, steps=small(named["steps"]),
      max_stack_depth=small(named["max_stack_depth"]),
      batched_primitive_members=small(named["batched_primitive_members"]),
      block_executions={label: small(n) for label, n in
                        named["block_executions"].items()})
