"""Index checks for the subscripts the frontend rewrote into gathers.

`v[i]` and `m[i, j]` with per-example indices become `tf.gather`s
(`pyops.getitem`). TensorFlow's gather raises on an index out of range,
but XLA's clamps it, so under `pc:xla` and `local:eager_xla` a bad index
read a wrong row with no error. Each rewritten subscript therefore checks
its index itself, the same way on every backend: while a primitive's code
runs inside `checking(code)`, the subscript gathers with its index clamped
into range, and the code gives each example a *fault record*, that of the
first index out of range:

    [key, index]   int32; [0, 0] when every index was in range

`key` numbers the subscript's `ir1.SubscriptSite`, the axis and the
axis's size in this process (`_key`), and `index` is the index as the
code computed it (before a negative one is counted from the end;
saturated to int32). The checks are a few integer ops per subscript,
which pfor vectorises, and code without rewritten subscripts has none.

The runtimes carry the records out of their computations, as the pc VM
does its stack overflow flags: the pc VM keeps one per member in its state
and halts a member at its first fault; the local backends read them after
each segment. Called eagerly, a fault raises `tab.IndexOutOfRangeError`
(`raise_first`); in a user's graph an assertion fails
(`assert_no_fault`), and under a user's XLA, which drops assertions, the
faulted members' results are poisoned.
"""
import contextlib
import contextvars
import threading

import numpy as np
import tensorflow as tf

from tfp_autobatch import errors

# The columns of a fault record.
KEY, INDEX = range(2)
WIDTH = 2

# Every (site, axis, size) checked in this process, numbered from 1 (0 is
# no fault); the size None where it is known only when the code runs.
_keys = []
_key_numbers = {}
_keys_lock = threading.Lock()

# The checks of the primitive whose code runs now (see `checking`); None
# outside one, as while types are inferred.
_running = contextvars.ContextVar("tfp_autobatch_subscript_checks",
                                  default=None)


def _key(site, axis, size):
  """The number of (`site`, `axis`, `size`) in fault records."""
  with _keys_lock:
    key = (site, axis, size)
    if key not in _key_numbers:
      _keys.append(key)
      _key_numbers[key] = len(_keys)
    return _key_numbers[key]


def _keyed(number):
  with _keys_lock:
    return _keys[number - 1]


class _Checks:
  """The fault record of one run of a primitive's code, per example, as
  its two columns, kept apart until the code is done (a record packed
  per subscript costs pfor a few ops more each)."""

  def __init__(self, sites):
    self.sites = sites
    self.key = self.index = None   # None until a subscript checks

  def record(self, bad, key, index):
    """Notes the fault (`key`, `index`) where `bad`, unless the example
    has one already."""
    if self.key is not None:
      bad = tf.logical_and(bad, tf.equal(self.key, 0))
    bad = tf.cast(bad, tf.int32)
    key, index = bad * key, bad * index
    if self.key is not None:
      key, index = self.key + key, self.index + index
    self.key, self.index = key, index

  def fault(self):
    if self.key is None:
      return tf.zeros([WIDTH], tf.int32)
    return tf.stack([self.key, self.index])


@contextlib.contextmanager
def checking(code):
  """Within it, the rewritten subscripts of `code` (an `ir1.Code`) check
  their indices (`checked_indices`). Yields a callable that gives, once
  the code has run, its fault record for the example, or None if `code`
  has no rewritten subscripts."""
  if not code.subscripts:
    yield lambda: None
    return
  checks = _Checks(code.subscripts)
  token = _running.set(checks)
  try:
    yield checks.fault
  finally:
    _running.reset(token)


def checked_indices(k, indices, wrapped, sizes):
  """The indices a rewritten subscript gathers with: `wrapped` (one per
  axis, a negative index counted from the end), clamped into each axis of
  `sizes`; the running code's fault record notes the first axis out of
  range, for its `k`-th subscript (`indices` as computed, for the message).
  Outside `checking` (type inference), and for indices that are not
  integers (which the gather rejects), `wrapped` as it is."""
  checks = _running.get()
  if checks is None or not all(w.dtype.is_integer for w in wrapped):
    return wrapped
  clamped = []
  for axis, (index, w, size) in enumerate(zip(indices, wrapped, sizes)):
    known = size if isinstance(size, int) else None
    if known is None:
      size = tf.cast(size, w.dtype)
    bad, first = _first_bad(tf.logical_or(w < 0, w >= size), index)
    checks.record(bad, _key(checks.sites[k], axis, known), _int32(first))
    # (Still out of range for an axis of size 0: the gather raises, but
    # for XLA's, which clamps.)
    clamped.append(tf.maximum(tf.minimum(w, size - 1), 0))
  return clamped


def _first_bad(bad, index):
  """`(any of bad, the first element of index where bad)` for an index
  of any rank (a vector of indices gathers several rows)."""
  if bad.shape.rank == 0:
    return bad, index
  bad, index = tf.reshape(bad, [-1]), tf.reshape(index, [-1])
  if bad.shape[0] == 0:
    return tf.constant(False), tf.zeros([], index.dtype)
  first = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int32)
  return tf.reduce_any(bad), tf.gather(index, first)


def _int32(x):
  """`x` as int32, saturating (an int64 index may be past int32's range)."""
  if x.dtype == tf.int32:
    return x
  limit = np.iinfo(np.int32)
  if x.dtype.max > limit.max or x.dtype.min < limit.min:
    x = tf.clip_by_value(x, tf.cast(limit.min, x.dtype),
                         tf.cast(limit.max, x.dtype))
  return tf.cast(x, tf.int32)


def first_fault(a, b):
  """Per example (a record, or rows of them), `a` if it records a fault,
  else `b`."""
  return tf.where(tf.not_equal(a[..., KEY:KEY + 1], 0), a, b)


def faulted(faults):
  """[Z] bool: the rows of `faults` ([Z, 2]) that record a fault."""
  return tf.not_equal(faults[:, KEY], 0)


def no_faults(z):
  """The fault records of `z` rows that have none."""
  return tf.zeros([z, WIDTH], tf.int32)


def sites_of(codes):
  """The `SubscriptSite`s of `codes` (`ir1.Code`s), each once, in order."""
  return list(dict.fromkeys(s for code in codes for s in code.subscripts))


def _describe(site, axis, size):
  return (f"in function '{site.function}' ({site.filename}, line "
          f"{site.lineno}), `{site.source}`, axis {axis} of size "
          f"{'unknown' if size is None else size}")


def error(record, example=None):
  """The `IndexOutOfRangeError` of a fault record (NumPy or a list);
  `example`: the faulted example's row in the batch, if known."""
  key, index = (int(x) for x in record)
  site, axis, size = _keyed(key)
  limit = np.iinfo(np.int32)
  shown = {limit.max: f"at least {limit.max}",
           limit.min: f"at most {limit.min}"}.get(index, str(index))
  for_example = "" if example is None else (
      f" for example {example} of the batch")
  if size is None:
    valid = ""
  elif size:
    valid = f" of size {size} (valid indices are {-size} to {size - 1}"
  else:
    valid = f" of size {size} (it has no valid index"
  return errors.IndexOutOfRangeError(
      f"in function '{site.function}' ({site.filename}, line "
      f"{site.lineno}): the index of `{site.source}` is {shown}"
      f"{for_example}, out of range for axis {axis}{valid}; a negative "
      "index counts from the end). Test it before the subscript (`if 0 "
      "<= i < n:`), or clamp it (tf.clip_by_value) if that is what you "
      "mean", function=site.function, filename=site.filename,
      lineno=site.lineno, source=site.source, index=index, axis=axis,
      size=size, example=example)


def raise_first(faults, examples=None):
  """Raises the error of the faulted row of `faults` ([n, 2] NumPy) with
  the first example (`examples[row]`, the row itself if None), if any."""
  rows = np.nonzero(faults[:, KEY])[0]
  if rows.size == 0:
    return
  if examples is None:
    examples = np.arange(faults.shape[0])
  row = rows[np.argmin(examples[rows])]
  raise error(faults[row], int(examples[row]))


def assert_no_fault(faults, sites):
  """An assertion for a graph that no row of `faults` ([Z, 2]) records a
  fault; the message names the first faulted example's subscript (one of
  `sites`, traced: its keys are numbered), axis, size and index."""
  with _keys_lock:
    keys = [(n, key) for n, key in enumerate(_keys, 1) if key[0] in sites]
  rows = faulted(faults)
  if not keys:   # (no subscript of `sites` gathers)
    return tf.no_op()
  # (A row past the end of an empty batch reads the appended zeros.)
  row = tf.argmax(tf.concat([tf.cast(rows, tf.int32), [1]], 0),
                  output_type=tf.int32)
  record = tf.gather(tf.concat([faults, no_faults(1)], 0), row)
  numbers = tf.constant([n for n, _ in keys], tf.int32)
  text = tf.gather(tf.constant([_describe(*key) for _, key in keys]),
                   tf.argmax(tf.cast(tf.equal(numbers, record[KEY]),
                                     tf.int32), output_type=tf.int32))
  return tf.debugging.Assert(
      tf.logical_not(tf.reduce_any(rows)),
      ["tfp_autobatch: a subscript's index is out of range:", text,
       "example", row, "index", record[INDEX]])
