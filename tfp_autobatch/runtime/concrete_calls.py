"""Calling a traced `tf.function` (a concrete function) at its flat inputs.

A concrete function's own call binds its arguments to its structured
signature (a Python `inspect`-style binding, then a flattening and a
check of every argument against its spec) before it runs the function:
for collatz on one member under pc:xla that was 35 us of a 76 us call
(scratch timing on this project's 2-core CPU). The runtimes call their
traces with arguments whose structure, dtypes and static shapes already
chose the trace, so `call` passes them flattened straight to the
function instead, through `ConcreteFunction._call_flat`: a private
method of TensorFlow's, which setup.py pins to 2.21. It still records
the call on a tape that watches its inputs and, in a graph, checks
their shapes.
"""
import tensorflow as tf


def call(concrete, args):
  """`concrete(*args)` without the binding: `args` must be laid out as
  the signature `concrete` was traced for (a list of nested structures
  of tensors of its dtypes and shapes)."""
  return concrete._call_flat(   # pylint: disable=protected-access
      tf.nest.flatten(args), concrete.captured_inputs)
