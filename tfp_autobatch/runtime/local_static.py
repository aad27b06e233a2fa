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
"""
import numpy as np
import tensorflow as tf

from tfp_autobatch import errors
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.runtime import batch_state
from tfp_autobatch.runtime import stats as stats_lib
from tfp_autobatch.runtime import vectorize


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

  def __init__(self, program, kernels, max_stack_depth, strategy="gather",
               bucket=False):
    if strategy not in ("gather", "mask"):
      raise ValueError(f"strategy must be 'gather' or 'mask', not {strategy!r}")
    self.program = program
    self.kernels = kernels
    self.max_stack_depth = max_stack_depth
    self.strategy = strategy
    self.bucket = bucket
    self.stats = None

  def run(self, args, batch_size):
    """Runs the entry function on `args`, nests with `batch_size` rows."""
    self.stats = stats_lib.RunStats(batch_size=batch_size)
    padded = self._padded(batch_size) if batch_size else 0
    if padded != batch_size:
      rows = np.concatenate([np.arange(batch_size),
                             np.zeros(padded - batch_size, np.int64)])
      args = [batch_state.gather(a, rows) for a in args]
    result = self._call(self.program.entry, list(args), batch_size, padded,
                        depth=1)
    return batch_state.take(result, batch_size)

  def _padded(self, n):
    return _next_power_of_two(n) if self.bucket else n

  def _type(self, fn, var):
    return self.program.var_type(fn.name, var)

  def _call(self, fn, args, real_size, size, depth):
    """Runs `fn` on a frame of `size` rows; the first `real_size` are real."""
    if depth > self.max_stack_depth:
      raise errors.StackOverflowError(
          f"recursion in '{fn.name}' went deeper than max_stack_depth="
          f"{self.max_stack_depth}; pass a larger one to "
          "@tab.batch(max_stack_depth=...)")
    self.stats.max_stack_depth = max(self.stats.max_stack_depth, depth)
    env = dict(zip(fn.params, args))
    labels = fn.block_index()
    done = len(fn.blocks)
    pc = np.full(size, done, np.int64)
    pc[:real_size] = 0
    arange = np.arange(size)

    def read(var):
      if var not in env:
        env[var] = types_lib.zeros(self._type(fn, var), size)
      return env[var]

    while True:
      waiting = pc[pc < done]
      if waiting.size == 0:
        break
      index = int(waiting.min())
      block = fn.blocks[index]
      members = np.nonzero(pc == index)[0]
      self.stats.record_block(f"{fn.name}/{block.label}", members.size)
      for op in block.ops:
        self._run_op(fn, op, env, read, members, size, arange, depth)
      match block.terminator:
        case ir1.Jump(target):
          pc[members] = labels[target]
        case ir1.Branch(cond, then_label, else_label):
          taken = self._read_rows(read(cond), members, size).numpy()
          pc[members] = np.where(taken.astype(bool), labels[then_label],
                                 labels[else_label])
        case ir1.Return():
          pc[members] = done
        case _:
          raise errors.IRError(f"unknown terminator {block.terminator!r}")
    return read(fn.result)

  @staticmethod
  def _read_rows(value, members, size):
    if members.size == size:
      return value
    return batch_state.gather(value, members)

  def _subset(self, read, ins, members, size):
    """Inputs `ins` for just `members`, padded to a bucket size; and that size."""
    if members.size == size:
      return [read(v) for v in ins], size
    n = self._padded(members.size)
    rows = np.concatenate([members, np.full(n - members.size, members[0])])
    return [batch_state.gather(read(v), rows) for v in ins], n

  def _run_op(self, fn, op, env, read, members, size, arange, depth):
    def write(var, value):
      value = batch_state.take(value, members.size)
      if members.size == size:
        env[var] = value
      else:
        env[var] = batch_state.scatter(read(var), tf.constant(members), value)

    match op:
      case ir1.Call(outs, callee, ins):
        args, n = self._subset(read, ins, members, size)
        result = self._call(self.program.function(callee), args, members.size,
                            n, depth + 1)
        write(outs[0], result)
      case ir1.Primitive(outs, _, ins):
        kernel = self.kernels.get(op, [self._type(fn, v) for v in ins],
                                  [self._type(fn, v) for v in outs])
        if members.size == size or self.strategy == "gather":
          inputs, n = self._subset(read, ins, members, size)
          for var, value in zip(outs, kernel(tf.constant(n, tf.int32),
                                             *inputs)):
            write(var, value)
        else:   # mask: run every row on a copy of active data, keep active rows
          active = np.isin(arange, members)
          source = np.where(active, arange, members[0])
          inputs = [batch_state.gather(read(v), source) for v in ins]
          results = kernel(tf.constant(size, tf.int32), *inputs)
          mask = tf.constant(active)
          for var, value in zip(outs, results):
            env[var] = batch_state.where(mask, value, read(var))
      case _:
        raise errors.IRError(f"unknown IR-1 op {op!r}")
