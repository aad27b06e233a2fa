"""Helpers that converted code calls, for Python operators on tensors.

Python's `not`, chained comparisons and loop bounds do not work on symbolic
tensors, so the converter rewrites them into calls of these functions. They
are written for one example and work on Python values too.
"""
import ast

import tensorflow as tf

NAME = "__tab_ops__"   # what converted code calls this module


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


def getitem(value, index):
  """`value[index]`, as `tf.gather` when a tensor is indexed by a tensor.

  pfor cannot vectorise a subscript whose index differs per example, but it
  vectorises `tf.gather`; Python containers and constant indices are left
  to Python.
  """
  if not isinstance(value, (tf.Tensor, tf.Variable)) and not hasattr(
      value, "dtype"):
    return value[index]
  indices = index if isinstance(index, tuple) else (index,)
  if all(isinstance(i, int) for i in indices) or any(
      isinstance(i, slice) or i is None or i is Ellipsis for i in indices):
    return value[index]
  value = tf.convert_to_tensor(value)
  indices = [tf.convert_to_tensor(i) for i in indices]
  if len(indices) == 1:
    i = indices[0]
    return tf.gather(value, tf.where(i < 0, i + tf.cast(tf.shape(value)[0],
                                                        i.dtype), i))
  dims = tf.shape(value)[:len(indices)]
  wrapped = [tf.where(i < 0, i + tf.cast(d, i.dtype), i)
             for i, d in zip(indices, tf.unstack(dims))]
  common = wrapped[0].dtype
  return tf.gather_nd(value, tf.stack([tf.cast(i, common) for i in wrapped]))
