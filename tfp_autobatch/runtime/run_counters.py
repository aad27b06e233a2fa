"""The program-counter VM's run statistics, counted inside its loop.

The counters travel in the VM's loop state, so they are counted alike
eagerly, in graph mode and under XLA; when the loop ends they become a
`RunStats` (called eagerly) or a dict of tensors of the caller's graph
(traced). Counters bounded by the steps are int32; the two that sum
members or rows over the steps are int64, since they pass 2**31 in
reach (131,072 members each taking 17,000 steps):

  steps []            blocks executed (VM steps)
  executions [B]      executions per block
  active [] int64     summed over steps, the members of the block run
  high []             deepest stack reached (the pc's stack pointer)
  rows [] int64       rows the `@batched_primitive` calls computed
  members [Z + 1]     histogram: entry k counts the `@batched_primitive`
                      calls made for k members
"""
import numpy as np
import tensorflow as tf

from tfp_autobatch.runtime import stats as stats_lib


def initial(z, num_blocks):
  """The counters before the first step, for a batch of `z` (a scalar
  tensor) and a program of `num_blocks` blocks."""
  return {
      "steps": tf.constant(0, tf.int32),
      "executions": tf.zeros([num_blocks], tf.int32),
      "active": tf.constant(0, tf.int64),
      "high": tf.reduce_max(tf.concat([tf.ones([z], tf.int32), [0]], 0)),
      "rows": tf.constant(0, tf.int64),
      "members": tf.zeros([z + 1], tf.int32),
  }


def after_step(counters, block, num_blocks, pc_top, pc_sp, rows, members):
  """The counters after block `block` ran.

  `pc_top`: where each member waited before the step; `pc_sp`: the pc's
  stack pointers after it; `rows`: the rows its model calls computed;
  `members`: the members of each of its model calls, as a vector (-1, no
  call, counts nothing), or None when the block's dispatch makes no model
  calls (the histogram is then left alone).
  """
  histogram = counters["members"]
  if members is not None:
    histogram += tf.reduce_sum(
        tf.one_hot(members, tf.shape(histogram)[0], dtype=tf.int32), 0)
  return {
      "steps": counters["steps"] + 1,
      "executions": counters["executions"] + tf.one_hot(
          block, num_blocks, dtype=tf.int32),
      "active": counters["active"] + tf.reduce_sum(
          tf.cast(tf.equal(pc_top, block), tf.int64)),
      "high": tf.maximum(counters["high"], tf.reduce_max(
          tf.concat([pc_sp, [0]], 0))),
      "rows": counters["rows"] + tf.cast(rows, tf.int64),
      "members": histogram,
  }


def to_stats(counters, batch_size, labels):
  """The `RunStats` of final counters (eager tensors or arrays); `labels`
  are the program's block labels, in block order."""
  c = {k: np.asarray(v) for k, v in counters.items()}
  return stats_lib.RunStats(
      batch_size=int(batch_size), steps=int(c["steps"]),
      active_members=int(c["active"]), max_stack_depth=int(c["high"]),
      batched_primitive_rows=int(c["rows"]),
      batched_primitive_members={k: int(n) for k, n in
                                 enumerate(c["members"]) if n},
      block_executions={label: int(n) for label, n in
                        zip(labels, c["executions"]) if n})


def to_tensors(counters, labels):
  """Final counters traced in a graph, under `RunStats`' field names
  (`block_executions` by block label, `batched_primitive_members` the
  histogram vector)."""
  return {
      "steps": counters["steps"],
      "active_members": counters["active"],
      "max_stack_depth": counters["high"],
      "batched_primitive_rows": counters["rows"],
      "batched_primitive_members": counters["members"],
      "block_executions": {label: counters["executions"][i]
                           for i, label in enumerate(labels)},
  }
