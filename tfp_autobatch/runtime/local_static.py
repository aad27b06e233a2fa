"""Local static autobatching (paper Algorithm 1) of an IR-1 program.

Control runs in Python: each function invocation ("frame") holds the batch
members that called it, a program counter per member (a NumPy array) and
the batched variables. Each step runs the earliest block any member waits at,
for just the members waiting there (the locally active set); a `Call` recurses
on the Python stack with those members gathered into a smaller frame.

A block runs on its members by gathering (take the active rows, run, scatter
back) or masking (run on every row, keep the active rows). With masking,
inactive rows are first replaced by a copy of an active row, so junk data
(say an out-of-range index) can never raise or poison the results.

After a segment with rewritten subscripts, its members' fault records
(`subscripts`) are read, and one out of range raises
`IndexOutOfRangeError` before anything else runs (also under XLA, whose
gathers clamp): each frame knows which example of the batch each of its
rows is, for the message.
"""
import functools

import numpy as np
import tensorflow as tf

from tfp_autobatch import errors
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.operators import subscripts
from tfp_autobatch.runtime import batch_state
from tfp_autobatch.runtime import python_stack
from tfp_autobatch.runtime import segments
from tfp_autobatch.runtime import stats as stats_lib


# Python frames a level of recursion takes (`_call`, `_Frame.run`, and
# room for what runs between them).
_FRAMES_PER_LEVEL = 6


def _next_power_of_two(n):
  return 1 if n <= 1 else 1 << (n - 1).bit_length()


class LocalStaticRuntime:
  """Runs a typed IR-1 program on a batch with Python-stack recursion.

  Args:
    program: typed IR-1 program.
    kernels: a `vectorize.KernelCache` (its execution mode: graph or XLA).
    max_stack_depth: recursion bound.
    strategy: "gather" or "mask".
    bucket: pad subsets to powers of two so XLA compiles few shapes.
  """

  stats = stats_lib.PerThread()   # of this thread's last run

  def __init__(self, program, kernels, max_stack_depth, strategy="gather",
               bucket=False):
    if strategy not in ("gather", "mask"):
      raise ValueError(f"strategy must be 'gather' or 'mask', not {strategy!r}")
    self.program = program
    self.kernels = kernels
    self.max_stack_depth = max_stack_depth
    self.strategy = strategy
    self.bucket = bucket
    self._blocks = {}   # (function, label) -> compiled parts

  def run(self, args, batch_size):
    """Runs the entry function on `args`, nests with `batch_size` rows."""
    self.stats = stats_lib.RunStats(batch_size=batch_size)
    padded = self._padded(batch_size) if batch_size else 0
    rows = np.concatenate([np.arange(batch_size),
                           np.zeros(padded - batch_size, np.int64)])
    if padded != batch_size:
      args = [batch_state.gather(a, rows) for a in args]
    with python_stack.room_for(self.max_stack_depth, _FRAMES_PER_LEVEL):
      result = self._call(self.program.entry, list(args), batch_size,
                          padded, depth=1, examples=rows)
    return batch_state.take(result, batch_size)

  def _padded(self, n):
    return _next_power_of_two(n) if self.bucket else n

  def _parts(self, fn, block):
    """The block split into compiled Segments, Calls and batched primitives."""
    key = (fn.name, block.label)
    if key not in self._blocks:
      cond = (block.terminator.cond
              if isinstance(block.terminator, ir1.Branch) else None)
      var_type = functools.partial(self.program.var_type, fn.name)
      self._blocks[key] = [
          segments.Segment(part, var_type, self.kernels.jit_compile, cond)
          if isinstance(part, list) else part
          for part in segments.split_block(block)]
    return self._blocks[key]

  def _call(self, fn, args, real_size, size, depth, examples):
    """Runs `fn` on a frame of `size` rows; the first `real_size` are real,
    row r example `examples[r]` of the batch."""
    if depth > self.max_stack_depth:
      raise errors.StackOverflowError(
          f"recursion in '{fn.shown_name}' went deeper than max_stack_depth="
          f"{self.max_stack_depth}; pass a larger one to "
          "@tab.batch(max_stack_depth=...)")
    if real_size:
      self.stats.max_stack_depth = max(self.stats.max_stack_depth, depth)
    frame = _Frame(self, fn, dict(zip(fn.params, args)), size, examples)
    labels = fn.block_index()
    done = len(fn.blocks)
    pc = np.full(size, done, np.int64)
    pc[:real_size] = 0
    while True:
      waiting = pc[pc < done]
      if waiting.size == 0:
        break
      index = int(waiting.min())
      block = fn.blocks[index]
      members = np.nonzero(pc == index)[0]
      self.stats.record_block(f"{fn.name}/{block.label}", members.size)
      frame.members = members
      for part in self._parts(fn, block):
        frame.run(part, depth)
      match block.terminator:
        case ir1.Jump(target):
          pc[members] = labels[target]
        case ir1.Branch(cond, then_label, else_label):
          taken = frame.members_value(cond)
          pc[members] = np.where(taken.astype(bool), labels[then_label],
                                 labels[else_label])
        case ir1.Return():
          pc[members] = done
        case _:
          raise errors.IRError(f"unknown terminator {block.terminator!r}")
    return frame.read(fn.result)


class _Frame:
  """The batched variables of one invocation, and how a part updates them."""

  def __init__(self, runtime, fn, env, size, examples):
    self.runtime, self.fn, self.env, self.size = runtime, fn, env, size
    self.examples = examples   # of the batch, per row (for messages)
    self.members = None
    self.last_result = None    # (var, its values for `members`) of a segment

  def read(self, var):
    if var not in self.env:
      self.env[var] = types_lib.zeros(
          self.runtime.program.var_type(self.fn.name, var), self.size)
    return self.env[var]

  def rows(self):
    """The members, padded with repeats of the first to a bucket size."""
    n = self.runtime._padded(self.members.size)   # pylint: disable=protected-access
    return np.concatenate([self.members,
                           np.full(n - self.members.size, self.members[0])])

  def members_value(self, var):
    """The values of `var` for the current members, as NumPy."""
    if self.last_result is not None and self.last_result[0] == var:
      return self.last_result[1][:self.members.size]
    value = self.read(var)
    if self.members.size != self.size:
      value = batch_state.gather(value, self.members)
    return value.numpy()

  def write(self, var, value):
    """Stores `value`'s first rows as `var` of the current members."""
    value = batch_state.take(value, self.members.size)
    if self.members.size == self.size:
      self.env[var] = value
    else:
      self.env[var] = batch_state.scatter(self.read(var),
                                          tf.constant(self.members), value)

  def run(self, part, depth):
    full = self.members.size == self.size
    self.last_result = None
    match part:
      case segments.Segment():
        reads = [self.read(v) for v in part.reads]
        if full:
          new, result, *faults = part.full(tf.constant(self.size, tf.int32),
                                           *reads)
        elif self.runtime.strategy == "gather":
          olds = [self.read(v) for v in part.writes]
          new, result, *faults = part.gathered(
              tf.constant(self.rows(), tf.int32), *reads, *olds)
        else:
          active = np.zeros(self.size, bool)
          active[self.members] = True
          source = np.where(active, np.arange(self.size), self.members[0])
          olds = [self.read(v) for v in part.writes]
          new, result, *faults = part.masked(tf.constant(active),
                                             tf.constant(source, tf.int32),
                                             *reads, *olds)
          result = tf.gather(result, self.members) if part.result else result
          faults = [tf.gather(f, self.members) for f in faults]
        for f in faults:   # (one, for a segment with subscripts)
          # The members' rows come first (gathered, the padding after).
          subscripts.raise_first(f.numpy()[:self.members.size],
                                 self.examples[self.members])
        self.env.update(zip(part.writes, new))
        if part.result is not None:
          self.last_result = (part.result, result.numpy())
      case ir1.Call(outs, callee, ins):
        rows = self.rows()
        args = [self.read(v) if full and rows.size == self.size
                else batch_state.gather(self.read(v), rows) for v in ins]
        result = self.runtime._call(self.runtime.program.function(callee),   # pylint: disable=protected-access
                                    args, self.members.size, rows.size,
                                    depth + 1, self.examples[rows])
        self.write(outs[0], result)
      case ir1.Primitive(outs, _, ins, batched=True):
        fn_name = self.fn.name
        var_type = self.runtime.program.var_type
        kernel = self.runtime.kernels.get(
            part, [var_type(fn_name, v) for v in ins],
            [var_type(fn_name, v) for v in outs])
        rows = self.rows()
        inputs = [self.read(v) if full and rows.size == self.size
                  else batch_state.gather(self.read(v), rows) for v in ins]
        for var, value in zip(outs, kernel(tf.constant(rows.size, tf.int32),
                                           *inputs)):
          self.write(var, value)
      case _:
        raise errors.IRError(f"unknown IR-1 op {part!r}")
