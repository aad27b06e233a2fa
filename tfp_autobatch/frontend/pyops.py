"""Helpers that converted code calls, for Python operators on tensors.

Python's `not`, chained comparisons and loop bounds do not work on symbolic
tensors, so the converter rewrites them into calls of these functions. They
are written for one example and work on Python values too.
"""
import tensorflow as tf


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


def logical_not(x):
  return tf.logical_not(truthy(x))


def all_of(*conditions):
  """`a < b < c` as `(a < b) and (b < c)` without short-circuiting."""
  result = truthy(conditions[0])
  for c in conditions[1:]:
    result = tf.logical_and(result, truthy(c))
  return result


def range_init(*args):
  """(start, stop, step) of `range(*args)`, as tensors of one integer dtype."""
  if len(args) == 1:
    start, stop, step = 0, args[0], 1
  elif len(args) == 2:
    (start, stop), step = args, 1
  else:
    start, stop, step = args
  dtype = next((tf.convert_to_tensor(a).dtype for a in (start, stop, step)
                if not isinstance(a, int)), tf.int32)
  return tuple(tf.cast(a, dtype) for a in (start, stop, step))


def range_continues(counter, stop, step):
  return tf.where(step > 0, counter < stop, counter > stop)
