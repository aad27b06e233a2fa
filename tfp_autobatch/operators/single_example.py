"""Calling a primitive's converted code on one example.

The runtimes vectorise these calls; type inference and `if_to_select` trace
them once in a scratch graph to learn types and ops. While single-example
code runs, `inside_vectorized_code` is set, so that a batched function or
primitive called from it (hidden in a helper) can say it must be called
directly.
"""
import contextvars

import tensorflow as tf

from tfp_autobatch.operators import pyops
from tfp_autobatch.operators import subscripts


# Set while tracing single-example code, so batched primitives called from
# inside it (hidden in a helper) can say they must be called directly.
inside_vectorized_code = contextvars.ContextVar("inside_vectorized_code",
                                                default=False)


def conform(value, var_type):
  """Converts a primitive's output to its variable's inferred type."""
  def leaf(t, v):
    v = tf.convert_to_tensor(v, dtype_hint=t.dtype)
    return v if v.dtype == t.dtype else tf.cast(v, t.dtype)
  return tf.nest.map_structure(leaf, var_type, value)


def call_single_example_code(op, *ins, out_types=None):
  """Runs a primitive's code, marking it as code for one example.

  `out_types`: the types of its outputs, which the frontend's code gives
  what it assigns as it goes (`pyops.as_assigned`, a tensor of another
  dtype cast too); None leaves that to the caller's `pyops.assigning`, as
  type inference does.
  """
  token = inside_vectorized_code.set(not op.batched)
  try:
    if out_types is None:
      return op.code.fn(*ins)
    with pyops.assigning(out_types, casts_tensors=True):
      return op.code.fn(*ins)
  finally:
    inside_vectorized_code.reset(token)


def call_checking_subscripts(op, *ins, out_types):
  """`(outputs, fault record)` of a primitive's code on one example
  (`call_single_example_code`), its rewritten subscripts checking their
  indices (`subscripts`); the record is None for code without them."""
  with subscripts.checking(op.code) as fault:
    outs = call_single_example_code(op, *ins, out_types=out_types)
    return outs, fault()


def single_example_fn(op, out_types):
  """`run(*ins)`: primitive `op`'s code on one example's inputs, its
  outputs conformed to `out_types`, then, for code with rewritten
  subscripts (`op.code.subscripts`), its fault record (`subscripts`)."""
  def run(*ins):
    outs, fault = call_checking_subscripts(op, *ins, out_types=out_types)
    outs = tuple(conform(v, t) for v, t in zip(outs, out_types))
    return outs if fault is None else outs + (fault,)
  return run


def trace_in_scratch_graph(fn, args):
  """The graph of `fn` called on `args` (TensorSpecs as placeholders) in a
  fresh FuncGraph, which captures the eager tensors the code closes over
  (and tensors of an enclosing graph) as `tf.function` would; what `fn`
  raises propagates. For what tracing tells (types, shapes, ops): a
  `tf.function` made and traced for each primitive (a function object, a
  signature, automatic control dependencies, a function definition in the
  runtime) took three quarters of type inference."""
  graph = tf.__internal__.FuncGraph("tab_scratch")
  with graph.as_default():
    fn(*tf.nest.map_structure(
        lambda a: (tf.compat.v1.placeholder(a.dtype, a.shape)
                   if isinstance(a, tf.TensorSpec) else a), args))
  return graph
