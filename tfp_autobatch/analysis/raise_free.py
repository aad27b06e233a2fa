"""Which primitives leave the rows of inactive members harmless outside XLA.

A block runs each primitive on all Z rows and keeps the active members'
results (`block_runner`). Outside XLA the inactive rows' inputs are junk
that user code may raise on (an index past the end, a division by zero),
so those rows are first given an active row's inputs (a gather per value
read), and a guarded primitive runs inside a `tf.cond` on a guarded
member's inputs. Both cost every VM step (`python -m benchmarks.programs
--programs=collatz --backends=pc:graph` shows how much).

Code made only of integer and boolean ops that compute on any inputs
without raising (sums, comparisons, selects; a division by a constant
with no zero) needs neither: junk rows compute junk, which the block
discards. Floating-point code is never counted harmless: a junk row's NaN
or infinity would turn the discarded branch's zero gradient into NaN
(`0 * inf`) for `pc:graph`'s gradients.

If-conversion for a backend no gradient goes through (`pc:xla`) asks
with `floats=True`: there a floating-point op that computes NaN or an
infinity on some values (a division, `log`, `sqrt`) is as harmless as a
sum, since the select discards it and nothing differentiates the select.
Ops that may raise, have effects or draw random numbers (`CheckNumerics`,
`Assert`, `PrintV2`, a gather, a random op) are on neither list.
"""
import tensorflow as tf

from tfp_autobatch.ir import ir2
from tfp_autobatch.operators import single_example

# Ops that raise on no integer or boolean values of their inputs.
_TOTAL_OPS = frozenset({
    "Placeholder", "Const", "Identity", "IdentityN", "NoOp", "Cast",
    "AddV2", "Add", "Sub", "Mul", "Neg", "Abs", "Sign", "Square",
    "Maximum", "Minimum", "Less", "LessEqual", "Greater", "GreaterEqual",
    "Equal", "NotEqual", "LogicalAnd", "LogicalOr", "LogicalNot",
    "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Invert", "Select",
    "SelectV2", "ZerosLike", "OnesLike", "Pack",
})
# Floating-point ops that raise on no values: each computes NaN or an
# infinity where it has no finite answer (counted harmless only with
# `floats=True`; on integers TensorFlow has no kernel for most of them).
_FLOAT_TOTAL_OPS = frozenset({
    "RealDiv", "DivNoNan", "Reciprocal", "Inv", "Exp", "Expm1", "Log",
    "Log1p", "Sqrt", "Rsqrt", "Pow", "SquaredDifference", "Floor", "Ceil",
    "Round", "Rint", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Atan2",
    "Sinh", "Cosh", "Tanh", "Asinh", "Acosh", "Atanh", "Sigmoid",
    "Softplus", "Softsign", "Relu", "Elu", "Erf", "Erfc", "Lgamma",
    "Digamma", "Xlogy", "Xlog1py", "Xdivy", "IsNan", "IsInf", "IsFinite",
})
# Integer divisions: they raise on a zero divisor (their second input).
_DIVISIONS = frozenset({"FloorDiv", "FloorMod", "TruncateDiv",
                        "TruncateMod", "Div"})
# Ops whose other inputs (axes, bounds) must be constants: reductions over
# fixed axes, slices at fixed places.
_CONSTANT_OPERANDS = {"Sum": [1], "Prod": [1], "Max": [1], "Min": [1],
                      "All": [1], "Any": [1],
                      "StridedSlice": [1, 2, 3]}


def _is_integer_or_bool(dtype):
  return dtype.is_integer or dtype == tf.bool


def _constant(tensor):
  """The value of `tensor` if a `Const` op makes it, else None."""
  if tensor.op.type != "Const":
    return None
  return tf.get_static_value(tensor)


def _allowed_dtype(dtype, floats):
  return _is_integer_or_bool(dtype) or (floats and dtype.is_floating)


def _op_cannot_raise(op, floats):
  tensors = list(op.inputs) + list(op.outputs)
  if not all(_allowed_dtype(t.dtype, floats) for t in tensors):
    return False
  on_floats = any(t.dtype.is_floating for t in tensors)
  if op.type in _TOTAL_OPS or (on_floats and op.type in _FLOAT_TOTAL_OPS):
    return True
  if op.type in _DIVISIONS:
    if op.inputs[1].dtype.is_floating:   # x / 0 is an infinity or NaN
      return True
    divisor = _constant(op.inputs[1])
    return divisor is not None and bool((divisor != 0).all())
  if op.type in _CONSTANT_OPERANDS:
    return all(_constant(op.inputs[i]) is not None
               for i in _CONSTANT_OPERANDS[op.type])
  return False


def cannot_raise(op, in_types, out_types):
  """Whether primitive `op` (IR-1 or IR-2, not batched), on per-example
  inputs of `in_types`, is integer and boolean code that raises on no
  values (see the module docstring). Traces its code once, for one
  example, unless its inputs or outputs already rule it out."""
  return computations_if_harmless(op, in_types, out_types) is not None


# Ops that compute nothing: what a trace holds besides the code's work.
_NOT_COMPUTING = frozenset({"Placeholder", "Const", "Identity", "IdentityN",
                            "NoOp"})


def computations_if_harmless(op, in_types, out_types, floats=False):
  """The number of ops that compute in `op`'s code, traced for one example,
  if it cannot raise (`cannot_raise`), else None. With `floats`, code on
  floating-point values counts too, where it raises on no values though
  it may compute NaN or infinities (see the module docstring)."""
  if not all(_allowed_dtype(t.dtype, floats)
             for t in tf.nest.flatten([in_types, out_types])):
    return None
  try:
    graph = single_example.trace_in_scratch_graph(
        single_example.single_example_fn(op, out_types),
        [tf.nest.map_structure(lambda t: t.spec(), t) for t in in_types])
  except Exception:  # pylint: disable=broad-except
    return None   # the runtime's own trace reports it
  ops = graph.get_operations()
  if not all(_op_cannot_raise(o, floats) for o in ops):
    return None
  return sum(o.type not in _NOT_COMPUTING for o in ops)


def block_cannot_raise(program, block):
  """Whether every primitive of IR-2 `block` that runs on all rows raises
  on no values (`cannot_raise`). A `@batched_primitive` runs on its
  members' rows only, and the VM's own ops (pushes, pops, moves, the
  terminator) on any rows."""
  types = program.types
  return all(
      cannot_raise(op, [types[v] for v in op.ins],
                   [types[v] for v in op.outs])
      for op in map(ir2.unguarded, block.ops)
      if isinstance(op, ir2.Primitive) and not op.batched)
