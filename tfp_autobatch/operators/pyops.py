"""Helpers that converted code calls, for Python operators on tensors.

Python's `not`, chained comparisons and loop bounds do not work on symbolic
tensors, so the converter rewrites them into calls of these functions. They
are written for one example and work on Python values too.

`as_assigned` is the one that is not an operator: after each statement the
converted code passes every variable the statement assigned through it, so
that the value has its variable's inferred dtype in the rest of the
primitive too (see `as_assigned`, `assigning`).
"""
import ast
import contextlib
import contextvars
import math

import tensorflow as tf

from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.operators import subscripts

NAME = "__tab_ops__"   # what converted code calls this module

# The `_Assignments` of the primitive whose code runs now (see `assigning`);
# None outside one, as when a function runs unbatched.
_assigned = contextvars.ContextVar("tfp_autobatch_assigned", default=None)


def call(name, args):
  """The expression `__tab_ops__.name(*args)`: converted code calling the
  function `name` of this module."""
  return ast.Call(ast.Attribute(ast.Name(NAME, ast.Load()), name, ast.Load()),
                  list(args), [])


def truthy(x):
  """Python truthiness of a per-example scalar, as a bool tensor."""
  if isinstance(x, (bool, int, float)):
    return tf.constant(bool(x))
  x = tf.convert_to_tensor(x)
  if x.shape.rank != 0:
    raise ValueError(
        f"a condition must be a scalar for each example, got shape {x.shape}; "
        "reduce it first (e.g. tf.reduce_any(...))")
  return x if x.dtype == tf.bool else tf.not_equal(x, tf.zeros_like(x))


def and_values(*values):
  """Python's `a and b and ...` without short-circuiting: the first value
  that is not truthy, else the last."""
  result = values[-1]
  for value in reversed(values[:-1]):
    result = _pick(value, result, value)
  return result


def or_values(*values):
  """Python's `a or b or ...` without short-circuiting: the first truthy
  value, else the last."""
  result = values[-1]
  for value in reversed(values[:-1]):
    result = _pick(value, value, result)
  return result


def _pick(test, if_true, if_false):
  """`if_true if test else if_false` for a per-example scalar `test`."""
  if isinstance(test, (bool, int, float)):
    return if_true if test else if_false
  return tf.where(truthy(test), *_same_dtype(if_true, if_false))


def logical_not(x):
  """Python's `not x`. Written `x == False`: Grappler's arithmetic
  optimiser rewrites `LogicalNot(LessEqual(a, b))` in a graph as
  `Greater(a, b)`, which is False where `not (a <= b)` is True for a NaN
  (TF 2.21)."""
  return tf.equal(truthy(x), False)


def equal(a, b):
  """Python's `a == b`, elementwise where either side is a tensor.

  TensorFlow's own `Tensor.__eq__` compares elementwise only while
  executing eagerly outside functions: in a function traced inside a
  `tf.compat.v1` graph (a `tf.function` run by a `Session`) it compares
  the tensors as objects, so `depth == 0` is False for every depth. The
  converter therefore calls this for `==` in every primitive: the same
  elementwise op in every mode (`Equal` without an error for shapes that
  do not broadcast, as `tf.__operators__.eq`)."""
  return _compare(a, b, lambda x, y: x == y, tf.raw_ops.Equal)


def not_equal(a, b):
  """Python's `a != b`, elementwise where either side is a tensor (see
  `equal`)."""
  return _compare(a, b, lambda x, y: x != y, tf.raw_ops.NotEqual)


def _compare(a, b, python_compare, raw_op):
  """`python_compare(a, b)` for Python values, else `raw_op` of both as
  tensors, elementwise."""
  if a is None or b is None or not (
      _is_dense_tensor(a) or _is_dense_tensor(b)):
    return python_compare(a, b)
  a, b = _as_tensors(a, b)
  return raw_op(x=a, y=b, incompatible_shape_error=False)


def _is_dense_tensor(x):
  return isinstance(x, (tf.Tensor, tf.Variable))


def _as_tensors(a, b):
  """`a` and `b` as tensors, the one that is not a tensor taking the
  other's dtype where it can (as a Python number does in `==`)."""
  if not _is_dense_tensor(a):
    b = tf.convert_to_tensor(b)
    return tf.convert_to_tensor(a, dtype_hint=b.dtype), b
  a = tf.convert_to_tensor(a)
  return a, tf.convert_to_tensor(b, dtype_hint=a.dtype)


def all_of(*conditions):
  """`a < b < c` as `(a < b) and (b < c)` without short-circuiting."""
  result = truthy(conditions[0])
  for c in conditions[1:]:
    result = tf.logical_and(result, truthy(c))
  return result


def minimum(*values):
  """Python's `min(a, b, ...)` of per-example values, elementwise: a
  value replaces the one so far only if it is smaller, so the first of
  equal ones wins and a NaN after a number does not (`max` likewise)."""
  return _fold(lambda value, so_far: value < so_far, min, values)


def maximum(*values):
  """Python's `max(a, b, ...)` of per-example values (see `minimum`)."""
  return _fold(lambda value, so_far: value > so_far, max, values)


def _fold(replaces, python_op, values):
  result = values[0]
  for value in values[1:]:
    if isinstance(result, (bool, int, float)) and isinstance(
        value, (bool, int, float)):
      result = python_op(result, value)
    else:
      value, result = _same_dtype(value, result)
      result = tf.where(replaces(value, result), value, result)
  return result


def _same_dtype(a, b):
  """Two values as tensors of one dtype, a Python number taking the
  other's."""
  if isinstance(a, (bool, int, float)):
    b = tf.convert_to_tensor(b)
    return tf.convert_to_tensor(a, dtype_hint=b.dtype), b
  a = tf.convert_to_tensor(a)
  return a, tf.convert_to_tensor(b, dtype_hint=a.dtype)


def is_one_of(x, *values):
  """Python's `x in (a, b, ...)` for a per-example scalar `x`: whether it
  equals one of the values."""
  if all(isinstance(v, (bool, int, float)) for v in (x,) + values):
    return tf.constant(x in values)
  result = tf.constant(False)
  for value in values:
    a, b = _same_dtype(x, value)
    result = tf.logical_or(result, truthy(tf.equal(a, b)))
  return result


def range_init(*args):
  """(start, stop, step) of `range(*args)`, as tensors of one integer
  dtype, or as the Python ints they are if all are (so the loop variable
  is typed as a literal, and takes the dtype of what it is compared with;
  see `passes.infer_types`)."""
  if len(args) == 1:
    start, stop, step = 0, args[0], 1
  elif len(args) == 2:
    (start, stop), step = args, 1
  else:
    start, stop, step = args
  if all(isinstance(a, int) for a in (start, stop, step)):
    return start, stop, step
  dtype = next((tf.convert_to_tensor(a).dtype for a in (start, stop, step)
                if not isinstance(a, int)), tf.int32)
  return tuple(tf.cast(a, dtype) for a in (start, stop, step))


def range_continues(counter, stop, step):
  return tf.where(step > 0, counter < stop, counter > stop)


def getitem(value, index, site=None):
  """`value[index]`, as `tf.gather` when a tensor is indexed by a tensor.

  pfor cannot vectorise a subscript whose index differs per example, but it
  vectorises `tf.gather`; Python containers and constant indices are left
  to Python. A Python container indexed by a tensor whose value is known
  when the code is traced (`i = 0` for an int64 `i`, which `as_assigned`
  makes a constant tensor) takes that value, as the literal would.

  `site`: the subscript's number among its code's `subscripts` (the
  frontend passes it): its gather's index is checked, since XLA's gather
  clamps an index out of range where TensorFlow's raises
  (`subscripts.checked_indices`).
  """
  if not isinstance(value, (tf.Tensor, tf.Variable)) and not hasattr(
      value, "dtype"):
    if tf.is_tensor(index) and index.dtype.is_integer:
      known = tf.get_static_value(index)
      if known is not None and known.ndim == 0:
        index = int(known)
    return value[index]
  indices = index if isinstance(index, tuple) else (index,)
  if all(isinstance(i, int) for i in indices) or any(
      isinstance(i, slice) or i is None or i is Ellipsis for i in indices):
    return _checked_slice(value, index, indices)
  value = tf.convert_to_tensor(value)
  indices = [tf.convert_to_tensor(i) for i in indices]
  sizes = _leading_sizes(value, len(indices))
  wrapped = [tf.where(i < 0, i + tf.cast(d, i.dtype), i)
             for i, d in zip(indices, sizes)]
  if site is not None:
    wrapped = subscripts.checked_indices(site, indices, wrapped, sizes)
    empty = [isinstance(d, int) and d == 0 for d in sizes]
    if any(empty):
      # No index is in range, as the fault record says (the call raises):
      # read a row of zeros instead, which keeps the result's shape, where
      # TensorFlow's gather from nothing raises its own error and XLA's
      # fails to compile.
      value = tf.pad(value, [[0, int(e)] for e in empty]
                     + [[0, 0]] * (value.shape.rank - len(sizes)))
      sizes = [1 if e else d for e, d in zip(empty, sizes)]
  if len(wrapped) == 1:
    return tf.gather(value, wrapped[0])
  return _gather_at(value, wrapped, sizes)


def _gather_at(value, indices, sizes):
  """`value[i0, i1, ...]` for in-range scalar `indices` into the axes of
  `sizes`, as one `tf.gather` at the row-major flat index from `value`
  with those axes merged. Not a `tf.gather_nd`: pfor has no batched
  GatherNd of a value shared by all examples (a closure constant) and ran
  such a subscript as a loop over the batch, where it vectorises a
  gather."""
  big = sizes if all(isinstance(d, int) for d in sizes) else None
  # int64 where the merged axes might hold more elements than int32 counts.
  dtype = (tf.int32 if big is not None and math.prod(big) < 2**31
           and all(i.dtype == tf.int32 for i in indices) else tf.int64)
  flat = tf.cast(indices[0], dtype)
  for i, d in zip(indices[1:], sizes[1:]):
    flat = flat * tf.cast(d, dtype) + tf.cast(i, dtype)
  rest = tf.shape(value)[len(indices):]
  merged = tf.reshape(value, tf.concat([[-1], rest], 0))
  return tf.gather(merged, flat)


def _leading_sizes(value, n):
  """The sizes of `value`'s first `n` axes: Python ints where its shape
  knows them (so a check folds them in), else scalar tensors."""
  shape = value.shape
  if shape.rank is not None and all(d is not None for d in shape[:n]):
    return list(shape[:n])
  dynamic = tf.shape(value)
  return [dynamic[a] if shape.rank is None or shape[a] is None else shape[a]
          for a in range(n)]


def _checked_slice(value, index, indices):
  """`value[index]`, for an index with slices, `None` or `...`.

  A slice whose bounds are computed when the program runs (`v[i:]` for a
  per-example `i`) has a length that may differ by example, which no batch
  can hold: pfor cannot vectorise it, and its loop over the batch fails
  (or, compiled by XLA, returns wrong values). So such a slice is an error,
  found when the code is traced: its result's length is unknown then.
  """
  result = value[index]
  bounds = [b for i in indices if isinstance(i, slice)
            for b in (i.start, i.stop, i.step)]
  if (any(tf.is_tensor(b) for b in bounds)
      and value.shape.is_fully_defined()
      and not result.shape.is_fully_defined()):
    raise TypeError(
        "a slice whose bounds are computed per example (`v[i:j]` with "
        "per-example `i` or `j`): its length could differ from example to "
        "example, which a batch cannot hold. Slice with Python ints, or "
        "take a fixed number k of elements with `tf.gather(v, i + "
        "tf.range(k))` (and tf.where to mask those past the end)")
  return result


class _Assignments:
  """What `as_assigned` does in one run of a primitive's code."""

  def __init__(self, out_types, casts_tensors):
    self.out_types = tuple(out_types)
    self.casts_tensors = casts_tensors
    self.numbers_met = False   # whether a Python number was assigned


@contextlib.contextmanager
def assigning(out_types, casts_tensors):
  """Within it, `as_assigned(i, value)` gives `value` the type
  `out_types[i]` of the running primitive's `i`-th output (None: not known
  yet, as while types are being inferred). Yields a record whose
  `numbers_met` says afterwards whether the code assigned a Python number
  (only then can `out_types` have changed what it computed).

  `casts_tensors`: whether a tensor of another dtype is cast too, or only a
  Python number. Type inference traces with False: there a tensor of
  another dtype is a conflict for `types.join` to report, never to cast
  away (`x = tf.constant(1, tf.int32)` for an int64 `x`). At run time a
  weak-typed input arrives as a tensor of TensorFlow's default dtype where
  inference traced a Python number, and takes its variable's dtype as the
  number did (inference already rejected every other mismatch)."""
  record = _Assignments(out_types, casts_tensors)
  token = _assigned.set(record)
  try:
    yield record
  finally:
    _assigned.reset(token)


def as_assigned(index, value):
  """`value`, assigned to the running primitive's output `index`, with its
  variable's dtype where the type is strong (see `ir.types`).

  Within one primitive the code runs as written: after `b = 1.0 / 3.0`,
  `c = b` reads the Python float, which alone would type `c` as a float32
  literal, though `b` is float64 (a float64 parameter, say) and `c` holds
  its value. So every assignment passes through here: a Python number (or
  a nest of them) assigned to a variable of strong type becomes a tensor of
  that dtype, so what reads it later in the same code computes in that
  dtype, as it does in the next primitive. A value that already has its
  variable's dtype is returned as it is (no op), and so is one of a weak
  (literal-typed) variable: it takes the dtype of what it meets, as a
  Python literal does in TensorFlow."""
  assigned = _assigned.get()
  if assigned is None:
    return value
  try:
    if any(isinstance(v, (bool, int, float))
           for v in tf.nest.flatten(value)):
      assigned.numbers_met = True
    var_type = assigned.out_types[index]
    if var_type is None:
      return value
    return tf.nest.map_structure(
        lambda t, v: _as_type(v, t, assigned.casts_tensors), var_type, value)
  except (TypeError, ValueError):
    return value   # another structure: `types.join` reports it


def _as_type(value, var_type, casts_tensors):
  if var_type.weak:
    return value
  if hasattr(value, "dtype"):   # a tensor, or NumPy's (float64 is a float)
    if not casts_tensors:
      return value
    dtype = tf.as_dtype(value.dtype)
  elif isinstance(value, (bool, int, float)):
    dtype = tf.convert_to_tensor(value).dtype
  else:
    return value
  if dtype == var_type.dtype or not types_lib.compatible_kind(
      dtype, var_type.dtype):
    return value
  value = tf.convert_to_tensor(value, dtype_hint=var_type.dtype)
  return value if value.dtype == var_type.dtype else tf.cast(
      value, var_type.dtype)
