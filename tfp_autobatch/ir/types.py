"""Per-example types of program variables.

A variable holds a nest (tuple, namedtuple, or a single leaf) of tensors; its
type is the same nest of `TensorType`s describing ONE example (no batch
dimension). A `weak` type comes from a Python literal (`0`, `1.5`, `True`) and
gives way to the dtype of any strong type it is joined with, as `0.0 + x`
would in TensorFlow.
"""
import dataclasses

import numpy as np
import tensorflow as tf

from tfp_autobatch import errors


@dataclasses.dataclass(frozen=True)
class TensorType:
  dtype: tf.DType
  shape: tuple
  weak: bool = False

  def __str__(self):
    dims = ",".join(str(d) for d in self.shape)
    return f"{self.dtype.name}[{dims}]" + ("~" if self.weak else "")

  def spec(self, batch_dim=()):
    """A `tf.TensorSpec` for this type, with leading `batch_dim` dimensions."""
    return tf.TensorSpec(tuple(batch_dim) + self.shape, self.dtype)


def type_of_value(value, batched=False):
  """The nest of TensorTypes of a value (strip the leading dim if batched)."""
  def leaf(x):
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
      return TensorType(tf.convert_to_tensor(x).dtype, (), weak=True)
    t = tf.convert_to_tensor(x)
    shape = tuple(t.shape.as_list())
    if batched:
      shape = shape[1:]
    if any(d is None for d in shape):
      raise errors.TypeInferenceError(
          f"per-example shapes must be static, got {t.shape}")
    return TensorType(t.dtype, shape)
  return tf.nest.map_structure(leaf, value)


def hashable(var_type):
  """A hashable stand-in for a nest of types, for the caches keyed by
  types (a value held in a list or dict has a list or dict type, which
  Python cannot hash). Two nests get equal stand-ins iff they are equal."""
  if isinstance(var_type, list):
    return (list,) + tuple(hashable(t) for t in var_type)
  if isinstance(var_type, dict):
    return (dict,) + tuple((k, hashable(t))
                           for k, t in sorted(var_type.items()))
  if isinstance(var_type, tuple):
    return (type(var_type),) + tuple(hashable(t) for t in var_type)
  return var_type


def _join_leaf(a, b, what):
  if a == b:
    return a
  if a.shape == b.shape:
    if a.weak and not b.weak and compatible_kind(a.dtype, b.dtype):
      return b
    if b.weak and not a.weak and compatible_kind(b.dtype, a.dtype):
      return a
    if a.weak and b.weak:
      # int literal joined with float literal: float wins; two of one kind:
      # the wider (a literal past int32's range is int64, as TF types it).
      if a.dtype.is_floating != b.dtype.is_floating:
        return a if a.dtype.is_floating else b
      return a if a.dtype.size >= b.dtype.size else b
  raise errors.TypeInferenceError(
      f"{what} gets two different types on different paths: {a} and {b}. "
      "Give it one dtype and shape on every path (e.g. with tf.cast).")


def compatible_kind(weak_dtype, strong_dtype):
  """Can a Python literal of `weak_dtype` take `strong_dtype`?"""
  if weak_dtype == tf.bool:
    return strong_dtype == tf.bool
  if weak_dtype.is_integer:
    return strong_dtype.is_integer or strong_dtype.is_floating
  return strong_dtype.is_floating or strong_dtype.is_complex


def join(a, b, what="a variable"):
  """Least upper bound of two variable types; None means 'not known yet'."""
  if a is None:
    return b
  if b is None:
    return a
  try:
    # With the containers' types: a tuple is not a list, nor a namedtuple
    # another one (map_structure below would raise a bare TypeError).
    tf.nest.assert_same_structure(a, b)
  except (ValueError, TypeError):
    raise errors.TypeInferenceError(
        f"{what} gets two different structures on different paths: "
        f"{format_type(a)} and {format_type(b)}; build the same container "
        "(tuple, list, dict or namedtuple type) of the same length on every "
        "path.") from None
  return tf.nest.map_structure(lambda x, y: _join_leaf(x, y, what), a, b)


def format_type(t):
  if t is None:
    return "?"
  if isinstance(t, TensorType):
    return str(t)
  if isinstance(t, tuple) and hasattr(t, "_fields"):
    inner = ", ".join(f"{k}={format_type(v)}" for k, v in zip(t._fields, t))
    return f"{type(t).__name__}({inner})"
  if isinstance(t, list):
    return "[" + ", ".join(format_type(x) for x in t) + "]"
  if isinstance(t, tuple):
    return "(" + ", ".join(format_type(x) for x in t) + ")"
  if isinstance(t, dict):
    return "{" + ", ".join(f"{k!r}: {format_type(v)}"
                           for k, v in t.items()) + "}"
  return str(t)


def zeros(var_type, *leading_dims, cache=None):
  """Zeros of the given variable type, with leading dims (e.g. the batch).

  With a `cache` (a dict, for one set of leading dims), leaves of one dtype
  and shape share one tensor: the VM's initial state zeroes a few hundred
  variables of a handful of types, and each `tf.zeros` of a batch size
  known only at run time is three or four ops to trace."""
  def fresh(t):
    return tf.zeros(tuple(leading_dims) + t.shape, t.dtype)
  def shared(t):
    key = (t.dtype, t.shape)
    if key not in cache:
      cache[key] = fresh(t)
    return cache[key]
  return tf.nest.map_structure(fresh if cache is None else shared, var_type)
