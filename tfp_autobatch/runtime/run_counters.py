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

When the loop ends, `ended` appends the members that overflowed their
stack and those that faulted on a subscript, so that an eager call reads
everything it checks in one transfer (`split_ended`).

One vector, updated by one expression, because under XLA every counter
kept apart was a kernel of its own launched on every VM step: six
counters, five or six launches a step, where the vector takes two (a NUTS
transition on 4 chains runs 27 steps).
"""
import numpy as np
import tensorflow as tf

from tfp_autobatch.runtime import batch_state
from tfp_autobatch.runtime import stats as stats_lib

STEPS, ACTIVE, ROWS, HIGH, EXECUTIONS = range(5)


def initial(z, num_blocks):
  """The counters before the first step, for a batch of `z` (a scalar
  tensor) and a program of `num_blocks` blocks."""
  # The entry frame: depth 1 if there is a member at all.
  high = tf.cast(tf.minimum(z, 1), tf.int64)
  return tf.concat([tf.zeros([HIGH], tf.int64), high[None],
                    tf.zeros([num_blocks], tf.int64),
                    tf.zeros(tf.reshape(z + 1, [1]), tf.int64)], 0)


def after_step(counters, block, num_blocks, pc_top, pc_sp, rows, members):
  """The counters after block `block` ran.

  `pc_top`: where each member waited before the step; `pc_sp`: the pc's
  stack pointers after it; `rows`: the rows its model calls computed;
  `members`: the members of each of its model calls, as a vector (-1, no
  call, counts nothing), or None when the block's dispatch makes no model
  calls (the histogram is then left alone).
  """
  i64 = tf.int64
  bins = tf.size(pc_top) + 1
  if members is None:
    histogram = tf.zeros([bins], i64)
  else:
    histogram = tf.reduce_sum(tf.one_hot(members, bins, dtype=i64), 0)
  step = tf.concat([
      tf.ones([1], i64),
      tf.reduce_sum(tf.cast(tf.equal(pc_top, block), i64))[None],
      tf.cast(rows, i64)[None],
      tf.cast(tf.reduce_max(tf.concat([pc_sp, [0]], 0)), i64)[None],
      tf.one_hot(block, num_blocks, dtype=i64),
      histogram], 0)
  # Elementwise in `counters`, so that XLA updates them in place, in one
  # kernel with the reductions above.
  return batch_state.where(tf.equal(tf.range(tf.size(counters)), HIGH),
                           tf.maximum(counters, step), counters + step)


def ended(counters, overflow, faulted):
  """The final counters followed by the counts of members that
  overflowed (`overflow`, [Z] bool) and that faulted on a subscript
  (`faulted`, [Z] bool): an eager caller reads all three in one
  `.numpy()`, where each read of another of the VM's results is a
  device-to-host copy of its own, noticeable on a small program's call."""
  def count(flags):
    return tf.reduce_sum(tf.cast(flags, tf.int64))[None]
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
