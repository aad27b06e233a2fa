"""Straight-line segments of a block, compiled as one batched kernel each.

A segment is a maximal run of single-example `Primitive`s in a block (calls
and batched primitives end it). Its code is composed into one single-example
function, vectorised once with pfor, and wrapped with the reads and writes of
the batch state, so running a segment for some members is ONE call of a
compiled function:

    full(*reads)                      all members active: no gather, no scatter
    gathered(rows, *reads, *olds)     gather `rows`, compute, scatter back
    masked(active, rows, *reads, *olds)
                                      compute on every row (inactive rows read
                                      a copy of an active row), keep active rows

Each also returns the segment's value of one `result` variable (the branch
condition of the block, if any) for just the rows it ran, and for a
segment with rewritten subscripts (`checks_indices`; no more outputs for
one without) the fault records of the rows it ran (`subscripts`), which
the runtime reads before it goes on.
"""
import functools

import tensorflow as tf

from tfp_autobatch.ir import ir1
from tfp_autobatch.operators import single_example
from tfp_autobatch.operators import subscripts
from tfp_autobatch.runtime import _tf_private
from tfp_autobatch.runtime import batch_state
from tfp_autobatch.runtime import vectorize


def split_block(block):
  """The block's ops as a list of Primitive-runs (lists) and single ops."""
  parts, run = [], []
  for op in block.ops:
    if isinstance(op, ir1.Primitive) and not op.batched:
      run.append(op)
      continue
    if run:
      parts.append(run)
      run = []
    parts.append(op)
  if run:
    parts.append(run)
  return parts


class _CalledConcrete:
  """A `tf.function` with an input signature, called through its one
  concrete function, traced on the first call. A `tf.function`'s own call
  binds the arguments to its signature and looks up its trace each time,
  about half of a small segment call, and a segment call is most of what
  a local step costs at small batches. The
  concrete function's own call binds them too
  (`_tf_private.call_concrete`)."""

  def __init__(self, function):
    self._function = function
    self._concrete = None

  def __call__(self, *args):
    if self._concrete is None:
      self._concrete = self._function.get_concrete_function()
    return _tf_private.call_concrete(self._concrete, args)


class Segment:
  """A compiled run of primitives of one function (see module docstring)."""

  def __init__(self, ops, var_type, jit_compile, result=None):
    self.ops = ops
    self.reads, self.writes = [], []
    for op in ops:
      self.reads += [v for v in op.ins
                     if v not in self.writes and v not in self.reads]
      self.writes += [v for v in op.outs if v not in self.writes]
    self.result = result if result in self.writes else None
    self.checks_indices = any(op.code.subscripts for op in ops)
    self.var_type = var_type
    read_specs = [self._spec(v) for v in self.reads]
    write_specs = [self._spec(v) for v in self.writes]
    rows = tf.TensorSpec([None], tf.int32)
    def compile_(fn, input_signature):
      return _CalledConcrete(tf.function(
          fn, input_signature=input_signature, jit_compile=jit_compile,
          autograph=False))

    self.full = compile_(functools.partial(self._full),
                         input_signature=[tf.TensorSpec([], tf.int32)]
                         + read_specs)
    self.gathered = compile_(functools.partial(self._gathered),
                             input_signature=[rows] + read_specs + write_specs)
    self.masked = compile_(functools.partial(self._masked),
                           input_signature=[tf.TensorSpec([None], tf.bool),
                                            rows] + read_specs + write_specs)

  def _spec(self, var):
    return tf.nest.map_structure(lambda t: t.spec((None,)), self.var_type(var))

  def _per_example(self, *values):
    """The writes on one example, then its fault record if the segment
    checks indices: the first of its primitives'."""
    env = dict(zip(self.reads, values))
    faults = []
    for op in self.ops:
      outs, fault = single_example.call_checking_subscripts(
          op, *[env[v] for v in op.ins],
          out_types=[self.var_type(v) for v in op.outs])
      for var, value in zip(op.outs, outs):
        env[var] = single_example.conform(value, self.var_type(var))
      if fault is not None:
        faults.append(fault)
    writes = tuple(env[v] for v in self.writes)
    if faults:
      return writes + (functools.reduce(subscripts.first_fault, faults),)
    return writes

  def _vectorized(self, n, reads):
    """`(writes, fault records or None)` on `n` rows."""
    if not reads:
      outs = self._per_example()
      outs = tf.nest.map_structure(
          lambda x: tf.broadcast_to(x, tf.concat([[n], tf.shape(x)], 0)), outs)
    else:
      outs = vectorize.vectorized_map(self._per_example, reads,
                                      self.ops[0].code)
    if self.checks_indices:
      return tuple(outs[:-1]), outs[-1]
    return tuple(outs), None

  def _result_of(self, new):
    if self.result is None:
      return tf.zeros([0], tf.bool)
    return new[self.writes.index(self.result)]

  def _outputs(self, updated, new, faults):
    """What `full`, `gathered` and `masked` return: the updated writes,
    the result, and the fault records if the segment checks indices."""
    return (updated, self._result_of(new)) + (
        (faults,) if self.checks_indices else ())

  def _full(self, n, *reads):
    new, faults = self._vectorized(n, list(reads))
    return self._outputs(new, new, faults)

  def _gathered(self, rows, *args):
    reads, olds = args[:len(self.reads)], args[len(self.reads):]
    new, faults = self._vectorized(tf.size(rows),
                                   [batch_state.gather(r, rows) for r in reads])
    # Padding rows repeat the first member (`_Frame.rows`), so their
    # scatters write equal values again; their copies are cut from the
    # gradient, which would otherwise reach that member once per copy.
    padding = tf.logical_and(tf.equal(rows, rows[0]),
                             tf.range(tf.size(rows)) > 0)
    updated = tuple(
        batch_state.scatter(o, rows, batch_state.where(
            padding, tf.nest.map_structure(tf.stop_gradient, v), v))
        for o, v in zip(olds, new))
    return self._outputs(updated, new, faults)

  def _masked(self, active, rows, *args):
    reads, olds = args[:len(self.reads)], args[len(self.reads):]
    new, faults = self._vectorized(tf.size(rows),
                                   [batch_state.gather(r, rows) for r in reads])
    updated = tuple(batch_state.where(active, v, o) for o, v in zip(olds, new))
    return self._outputs(updated, new, faults)
