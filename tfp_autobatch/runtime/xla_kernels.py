"""Operations XLA has no kernel for, found in a traced program before XLA
compiles it.

`pc:xla` compiles the whole VM with XLA, the code of every primitive and
`@batched_primitive` with it, also where the caller's own `tf.function`
does not ask for XLA. Code that XLA cannot compile (`tf.numpy_function`,
`tf.py_function`, string formatting, `tf.print`) then failed when the
program first ran, with XLA's error about one of the VM's blocks,
thousands of lines long. `check` looks through the traced VM for such
operations instead: an operation type XLA has a kernel for is registered
for an XLA device, and the lookup is a set of registry reads per type
(milliseconds for a VM of thousands of operations), where lowering the VM
to HLO to find out takes seconds. An operation without one is confirmed by
that lowering before it is reported, so that XLA's own handling of some
unregistered operation never becomes an error here, and the error names
each operation and, where its trace shows one, the user's line that made
it (a `@batched_primitive`'s: pfor makes a primitive's operations anew).
"""
import functools
import os

import tensorflow as tf

from tfp_autobatch import errors
from tfp_autobatch.runtime import _tf_private

# Operation types that need no kernel: a function's inputs.
_NO_KERNEL_NEEDED = frozenset({"Placeholder"})

# Where an operation's trace is TensorFlow's or ours, not the user's.
_TENSORFLOW = os.path.dirname(tf.__file__) + os.sep
_TFP_AUTOBATCH = os.path.dirname(os.path.dirname(__file__)) + os.sep


@functools.lru_cache(maxsize=None)
def _compilable(op_type):
  return op_type in _NO_KERNEL_NEEDED or _tf_private.has_xla_kernel(op_type)


def unsupported_ops(graph):
  """One operation of each type that XLA has no kernel for, in `graph`
  and the functions its operations call (loop bodies, branches, calls,
  at any depth), in the order met."""
  found, seen = {}, set()
  pending = [graph]
  while pending:
    g = pending.pop()
    for op in g.get_operations():
      if op.type not in found and not _compilable(op.type):
        found[op.type] = op
      for inner in _tf_private.called_graphs(op, graph):
        if id(inner) not in seen:
          seen.add(id(inner))
          pending.append(inner)
  return list(found.values())


def check(compiled, concrete, what, instead):
  """Raises `tab.XlaUnsupportedError` if `concrete`, the trace of the
  `tf.function` `compiled` (with an input signature) that XLA is to
  compile, has operations XLA cannot compile. `what` names the backend
  as the message should ("pc:xla"); `instead`, what to use instead
  ("backend='pc:graph'")."""
  ops = unsupported_ops(concrete.graph)
  if not ops:
    return
  try:
    # Outside the caller's graph: given specs, the lowering makes inputs
    # with random ops, which would otherwise run in the caller's graph.
    with tf.init_scope():
      compiled.experimental_get_compiler_ir(
          *compiled.input_signature)(stage="hlo")
  except Exception as e:  # pylint: disable=broad-except
    if "Detected unsupported operations" not in str(e):
      return   # another failure (a capture of the caller's graph): XLA's
    error = errors.XlaUnsupportedError(
        f"{what} compiles the batched program with XLA, which has no "
        f"kernel for {'; '.join(_described(op) for op in ops)}. Use "
        f"{instead}, or write that code with operations XLA has")
    error.ops = ops
    raise error from e


def _described(op):
  """An operation's type and the user's line that made it, where its
  trace shows one: not for an operation pfor made in vectorising a
  primitive, made by our runtime (the innermost frame outside TensorFlow
  is then ours, and the next the user's call of the batched function)."""
  for frame in reversed(op.traceback):
    if frame.filename.startswith(_TENSORFLOW):
      continue
    if frame.filename.startswith(_TFP_AUTOBATCH):
      return op.type
    return (f"{op.type} (made at {frame.filename}, line {frame.lineno}, "
            f"in {frame.name})")
  return op.type
