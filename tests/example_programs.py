"""Single-example programs that every backend must batch correctly.

Each program is written for ONE example in plain Python with TensorFlow ops,
the way a user would write it, and decorated with `@tab.batch`. Together they
cover the control flow the frontend accepts: direct and mutual recursion,
`while` loops whose trip counts differ ~1000x across a batch, `for` over
`range` and `tf.range`, `break`, `continue`, early and multiple `return`s,
nested loops, `if/elif/else`, conditional expressions, `and`/`or`/`not`,
augmented assignment, tuple unpacking, tuple and namedtuple arguments and
results, per-example reductions and gathers, all four numeric dtypes, plain
Python helpers and lambdas, and values captured by closure.

The registry `PROGRAMS` holds one `Program` per function:

  name         the test id
  fn           the `@tab.batch` function
  make_inputs  `make_inputs(batch_size, rng) -> tuple` of positional arguments,
               each a NumPy array (or a namedtuple of them) whose leading
               dimension is `batch_size`; for batch_size >= 2 the extreme
               inputs (members that finish at once, the longest runs) are
               always present
  out_dtypes   the expected output dtypes, shaped like the output (a dtype, a
               tuple or a namedtuple of dtypes)
  oracle       a pure NumPy/Python function of one example that computes the
               expected output independently of TensorFlow and tfp_autobatch
  batch_sizes  the batch sizes the differential test runs: a mixed batch of 7
               for every program, batches of 1, 2 and 64 for some (each
               batch size is a fresh XLA compilation, so they are rationed)

Recursion depth stays below 15 and only `count_loop` and `collatz_steps` run
hundreds of iterations, so the whole suite compiles and runs quickly.
"""
import collections
import math

import numpy as np
import tensorflow as tf

import tfp_autobatch as tab

Program = collections.namedtuple(
    "Program", ["name", "fn", "make_inputs", "out_dtypes", "oracle", "batch_sizes"])

MIXED = (7,)                   # most programs: one batch of mixed members
WITH_ONE = (1, 7)              # some: also a batch of one
ALL_BATCHES = (1, 2, 7, 128)   # a few: every batch size (128: pc:xla's
                               # register files as rows, register_file)

PROGRAMS = []


def register(make_inputs, out_dtypes, oracle, batch_sizes=MIXED, name=None):
  """Adds the decorated function below to `PROGRAMS`; returns it unchanged."""
  def add(fn):
    PROGRAMS.append(Program(name or fn.__name__, fn, make_inputs, out_dtypes,
                            oracle, tuple(batch_sizes)))
    return fn
  return add


# ---------------------------------------------------------------------------
# Input makers.


def ints(lo, hi, dtype=np.int32, extremes=None):
  """Uniform integers in [lo, hi]; `extremes` (default lo, hi) lead the batch."""
  extremes = (lo, hi) if extremes is None else extremes

  def make(batch_size, rng):
    x = rng.integers(lo, hi, size=batch_size, endpoint=True)
    if batch_size >= 2:
      k = min(len(extremes), batch_size)
      x[:k] = extremes[:k]
    return x.astype(dtype)
  return make


def floats(lo, hi, dtype=np.float32, shape=(), extremes=()):
  """Uniform floats in [lo, hi) of per-example `shape`; `extremes` lead."""
  def make(batch_size, rng):
    x = rng.uniform(lo, hi, size=(batch_size,) + tuple(shape))
    if batch_size >= 2 and extremes:
      k = min(len(extremes), batch_size)
      x[:k] = np.asarray(extremes[:k]).reshape((k,) + (1,) * len(shape))
    return x.astype(dtype)
  return make


def args(*makers):
  """Combines one maker per positional argument into `make_inputs`."""
  def make_inputs(batch_size, rng):
    return tuple(m(batch_size, rng) for m in makers)
  return make_inputs


# ---------------------------------------------------------------------------
# Direct recursion.


@register(args(ints(0, 10, extremes=(0, 10, 1))), tf.int32,
          oracle=lambda n: _fib_oracle(int(n)), batch_sizes=ALL_BATCHES)
@tab.batch
def fib(n):
  if n <= 1:
    return n
  return fib(n - 1) + fib(n - 2)


def _fib_oracle(n):
  a, b = 0, 1
  for _ in range(n):
    a, b = b, a + b
  return a


@register(args(ints(0, 10, extremes=(0, 10, 1)), ints(-3, 3, extremes=(-3, 2))),
          tf.int32, oracle=lambda n, k: _fib_oracle(int(n)) * int(k),
          batch_sizes=WITH_ONE)
@tab.batch
def scaled_fib(n, k):
  """fib(n) * k, with `k` passed on unchanged by both recursive calls (as
  NUTS's `build_tree` passes on its step size): live across the first."""
  if n <= 1:
    return n * k
  return scaled_fib(n - 1, k) + scaled_fib(n - 2, k)


@register(args(ints(0, 12, np.int64)), tf.int64,
          oracle=lambda n: math.factorial(int(n)))
@tab.batch
def factorial(n):
  if n <= 1:
    return tf.ones_like(n)
  return n * factorial(n - 1)


def _ackermann_oracle(m, n):
  if m == 0:
    return n + 1
  if n == 0:
    return _ackermann_oracle(m - 1, 1)
  return _ackermann_oracle(m - 1, _ackermann_oracle(m, n - 1))


@register(args(ints(0, 2, extremes=(0, 2, 2, 1)), ints(0, 3, extremes=(0, 3, 0, 2))),
          tf.int32, oracle=lambda m, n: _ackermann_oracle(int(m), int(n)),
          batch_sizes=WITH_ONE)
@tab.batch
def ackermann(m, n):
  if m == 0:
    return n + 1
  elif n == 0:
    return ackermann(m - 1, tf.ones_like(n))
  else:
    return ackermann(m - 1, ackermann(m, n - 1))


@register(args(ints(0, 5), ints(0, 3, extremes=(0, 0))), tf.int32,
          oracle=lambda h, d: sum((int(d) + k) * 2**k for k in range(int(h) + 1)),
          batch_sizes=WITH_ONE)
@tab.batch
def tree_depth_sum(height, depth):
  """Sum of the depths of all nodes of a complete binary tree."""
  if height == 0:
    return depth
  left = tree_depth_sum(height - 1, depth + 1)
  right = tree_depth_sum(height - 1, depth + 1)
  return depth + left + right


@register(args(ints(0, 400, np.int64, extremes=(0, 377, 5)),
               ints(0, 400, np.int64, extremes=(0, 233, 0))),
          tf.int64, oracle=lambda a, b: math.gcd(int(a), int(b)), batch_sizes=ALL_BATCHES)
@tab.batch
def gcd(a, b):
  if b == 0:
    return a
  return gcd(b, a % b)


@register(args(floats(0.5, 1.5, np.float64, extremes=(1.25, 0.75, 1.0)),
               ints(0, 1000, extremes=(0, 1000, 1))),
          tf.float64, oracle=lambda x, n: float(x) ** int(n), batch_sizes=WITH_ONE)
@tab.batch
def power(x, n):
  """x ** n by repeated squaring."""
  if n == 0:
    return tf.ones_like(x)
  half = power(x, n // 2)
  if n % 2 == 0:
    return half * half
  return half * half * x


@register(args(ints(0, 12, np.int64)),
          (tf.int64, tf.int64), oracle=lambda n: (_fib_oracle(int(n)), _fib_oracle(int(n) + 1)),
          batch_sizes=WITH_ONE)
@tab.batch
def fib_pair(n):
  """(fib(n), fib(n + 1)) by linear recursion returning a tuple."""
  if n == 0:
    return tf.zeros_like(n), tf.ones_like(n)
  a, b = fib_pair(n - 1)
  return b, a + b


def _checked_halves_oracle(depth, x):
  depth, x = int(depth), int(x)
  if depth == 0:
    return x - 1
  first = _checked_halves_oracle(depth - 1, x)
  if first < 0:
    return first
  return _checked_halves_oracle(depth - 1, first) + depth


@register(args(ints(0, 5), ints(-2, 40, extremes=(-2, 40, 3))), tf.int32,
          oracle=_checked_halves_oracle, batch_sizes=WITH_ONE)
@tab.batch
def checked_halves(depth, x):
  """Two halves, the second only when the first is valid (the early return
  of NUTS's tree building)."""
  if depth == 0:
    return x - 1
  first = checked_halves(depth - 1, x)
  if first < 0:
    return first
  second = checked_halves(depth - 1, first)
  return second + depth


def _result_or_changed_oracle(n, x):
  n, x = int(n), int(x)
  if n == 0:
    return x
  y = _result_or_changed_oracle(n - 1, x + n)
  if y > 40:
    return y
  z, y = y, y - 3
  if z > 20:
    return y
  return z + _result_or_changed_oracle(n - 1, y)


@register(args(ints(0, 6), ints(-5, 40, extremes=(-5, 40, 21))), tf.int32,
          oracle=_result_or_changed_oracle, batch_sizes=WITH_ONE)
@tab.batch
def result_or_changed(n, x):
  """Returns what its own call returned (a copy of the callee's result the
  VM need not write back) or, from one statement on, a changed value under
  the same name (a write it must keep)."""
  if n == 0:
    return x
  y = result_or_changed(n - 1, x + n)
  if y > 40:
    return y
  z = y
  y = y - 3
  if z > 20:
    return y
  return z + result_or_changed(n - 1, y)


def _bisect_oracle(x, steps):
  lo, hi = 0.0, max(float(x), 1.0)
  for _ in range(int(steps)):
    mid = (lo + hi) / 2
    lo, hi = (lo, mid) if mid * mid > x else (mid, hi)
  return (lo + hi) / 2


@register(args(floats(0.0, 10.0, np.float64, extremes=(0.0, 9.5)), ints(0, 12)),
          tf.float64, oracle=_bisect_oracle)
@tab.batch
def bisect_sqrt(x, steps):
  """Square root of x by recursive bisection on [0, max(1, x)]."""
  return _bisect(x, tf.zeros_like(x), tf.maximum(x, 1.0), steps)


@tab.batch
def _bisect(x, lo, hi, steps):
  mid = (lo + hi) / 2
  if steps == 0:
    return mid
  if mid * mid > x:
    return _bisect(x, lo, mid, steps - 1)
  return _bisect(x, mid, hi, steps - 1)


# ---------------------------------------------------------------------------
# Mutual recursion: `is_even` calls `is_odd`, which is defined after it.


@register(args(ints(0, 12)), tf.bool, oracle=lambda n: int(n) % 2 == 0,
          batch_sizes=ALL_BATCHES)
@tab.batch
def is_even(n):
  if n == 0:
    return tf.constant(True)
  return is_odd(n - 1)


@tab.batch
def is_odd(n):
  if n == 0:
    return tf.constant(False)
  return is_even(n - 1)


PROGRAMS.append(Program("is_odd", is_odd, args(ints(0, 11)), tf.bool,
                        lambda n: int(n) % 2 == 1, MIXED))


# ---------------------------------------------------------------------------
# While loops with data-dependent trip counts.


def _collatz_oracle(n):
  n, steps = int(n), 0
  while n != 1:
    n = n // 2 if n % 2 == 0 else 3 * n + 1
    steps += 1
  return steps


@register(args(ints(1, 1000, extremes=(1, 871, 2))), tf.int32,
          oracle=_collatz_oracle, batch_sizes=WITH_ONE)
@tab.batch
def collatz_steps(n):
  steps = tf.zeros_like(n)
  while n != 1:
    if n % 2 == 0:
      n = n // 2
    else:
      n = 3 * n + 1
    steps += 1
  return steps


@register(args(ints(1, 1000, extremes=(1, 1000))), tf.int32,
          oracle=lambda n: sum(i % 7 for i in range(int(n))), batch_sizes=(7,))
@tab.batch
def count_loop(n):
  """Trip counts from 1 to 1000 across the batch."""
  i = tf.zeros_like(n)
  total = tf.zeros_like(n)
  while i < n:
    total += i % 7
    i += 1
  return total


@register(args(ints(0, 30, extremes=(0, 30)), ints(0, 200, extremes=(0, 200))), tf.int32,
          oracle=lambda n, limit: _while_and_oracle(int(n), int(limit)))
@tab.batch
def while_and(n, limit):
  """A loop condition made of two per-example tests joined by `and`."""
  i = tf.zeros_like(n)
  s = tf.zeros_like(n)
  while i < n and s < limit:
    s += i
    i += 1
  return s * 100 + i


def _while_and_oracle(n, limit):
  i = s = 0
  while i < n and s < limit:
    s += i
    i += 1
  return s * 100 + i


DIGITS_PER_CALL = 3


@tab.batch
def _take_digits(n, total):
  """Called from one place and not recursive: inlined into its caller. Its
  loop over a range of a Python int is unrolled."""
  for _ in range(DIGITS_PER_CALL):
    total = total + n % 10
    n = n // 10
  return n, total


@register(args(ints(0, 2_000_000_000, extremes=(0, 2_000_000_000, 9, 10))),
          tf.int32, oracle=lambda n: sum(int(d) for d in str(int(n))))
@tab.batch
def digit_sum(n):
  """An inlined helper with an unrolled loop, called in a loop whose
  condition joins two plain tests with `and` (a select, not a branch)."""
  total = tf.zeros_like(n)
  while n > 0 and total >= 0:
    n, total = _take_digits(n, total)
  return total


@register(args(ints(0, 6, extremes=(0, 0, 0, 6))), tf.int32,
          oracle=lambda n: 0 if n <= 0 else int(n).bit_length() * 1000 + int(n))
@tab.batch
def finish_at_once(n):
  """Most members return before the loop is ever reached."""
  if n <= 0:
    return n * 2
  bits = tf.zeros_like(n)
  m = n
  while m > 0:
    m //= 2
    bits += 1
  return bits * 1000 + n


def _newton_oracle(x):
  x = np.float32(x)
  y, iterations = max(x, np.float32(1.0)), 0
  while abs(y * y - x) > np.float32(1e-4) * max(x, np.float32(1.0)) and iterations < 50:
    y = np.float32(0.5) * (y + x / y)
    iterations += 1
  return y


@register(args(floats(0.0, 100.0, np.float32, extremes=(0.0, 99.0, 1.0))), tf.float32,
          oracle=_newton_oracle)
@tab.batch
def newton_sqrt(x):
  """Newton's method with a per-example convergence test."""
  y = tf.maximum(x, 1.0)
  iterations = tf.constant(0)
  while tf.abs(y * y - x) > 1e-4 * tf.maximum(x, 1.0) and iterations < 50:
    y = 0.5 * (y + x / y)
    iterations += 1
  return y


# ---------------------------------------------------------------------------
# For loops, break, continue, nesting.


@register(args(ints(0, 20)), tf.int32,
          oracle=lambda n: sum(i * i for i in range(int(n))))
@tab.batch
def sum_squares_range(n):
  s = tf.zeros_like(n)
  for i in range(n):
    s += i * i
  return s


@register(args(ints(0, 25, np.int64)), tf.int64,
          oracle=lambda n: sum(range(int(n))))
@tab.batch
def triangle_tf_range(n):
  s = tf.zeros_like(n)
  for i in tf.range(n):
    s += i
  return s


@register(args(ints(1, 12)), tf.int64, oracle=lambda n: math.factorial(int(n)))
@tab.batch
def factorial_loop(n):
  """`range` with two bounds and an int64 accumulator over int32 counters."""
  acc = tf.constant(1, tf.int64)
  for i in range(1, n + 1):
    acc *= tf.cast(i, tf.int64)
  return acc


def _first_divisor_oracle(n):
  n = int(n)
  for d in range(2, n + 1):
    if n % d == 0:
      return d
  return n


@register(args(ints(2, 100, extremes=(2, 97, 4))), tf.int32, oracle=_first_divisor_oracle)
@tab.batch
def first_divisor(n):
  """Smallest divisor >= 2, by a loop that stops with `break`."""
  d = tf.constant(2)
  result = n
  while d < n:
    if n % d == 0:
      result = d
      break
    d += 1
  return result


@register(args(ints(0, 30)), tf.int32,
          oracle=lambda n: sum(i for i in range(int(n)) if i % 2 == 1 and i % 5 != 0))
@tab.batch
def sum_odd_continue(n):
  s = tf.zeros_like(n)
  for i in range(n):
    if i % 2 == 0:
      continue
    if i % 5 == 0:
      continue
    s += i
  return s


@register(args(ints(0, 8), ints(0, 8, extremes=(8, 0))), tf.int32,
          oracle=lambda n, m: sum(1 for i in range(int(n)) for j in range(int(m))
                                  if (i + j) % 3 == 0))
@tab.batch
def nested_loops(n, m):
  count = tf.zeros_like(n)
  for i in range(n):
    for j in range(m):
      if (i + j) % 3 == 0:
        count += 1
  return count


@register(args(ints(0, 12, extremes=(0, 12)), ints(0, 9)), tf.int32,
          oracle=lambda n, k: _nested_break_oracle(int(n), int(k)))
@tab.batch
def nested_break(n, k):
  """`break` out of an inner loop only; the outer loop keeps going."""
  total = tf.zeros_like(n)
  i = tf.zeros_like(n)
  while i < n:
    j = tf.zeros_like(n)
    while j < i:
      if j >= k:
        break
      total += j
      j += 1
    i += 1
  return total


def _nested_break_oracle(n, k):
  total = 0
  for i in range(n):
    for j in range(i):
      if j >= k:
        break
      total += j
  return total


@register(args(floats(-1.0, 1.0, np.float32, shape=(5,)),
               floats(-1.0, 1.2, np.float32, extremes=(1.2, -1.5))),
          tf.int32, oracle=lambda v, t: next((i for i in range(5) if v[i] > t), -1),
          batch_sizes=ALL_BATCHES)
@tab.batch
def find_first(v, threshold):
  """Early `return` from inside a loop; per-example vector input."""
  i = tf.constant(0)
  while i < 5:
    if tf.gather(v, i) > threshold:
      return i
    i += 1
  return tf.constant(-1)


@register(args(floats(-5.0, 5.0, np.float32, shape=(5,)), ints(1, 5, extremes=(1, 5))),
          tf.float32, oracle=lambda v, n: np.max(v[:int(n)]))
@tab.batch
def subscript_max(v, n):
  """Python subscripts `v[i]` with a per-example loop index."""
  best = v[0]
  for i in range(1, n):
    if v[i] > best:
      best = v[i]
  return best


# ---------------------------------------------------------------------------
# Branches, conditional expressions, boolean operators.


def _piecewise_oracle(x):
  x = np.float32(x)
  if x < -1:
    return -2 * x
  if x < 0:
    return x * x
  elif x < 1:
    return x
  return np.sqrt(x)


@register(args(floats(-3.0, 3.0, np.float32, extremes=(-1.0, 0.0, 1.0, -3.0, 2.5))),
          tf.float32, oracle=_piecewise_oracle, batch_sizes=ALL_BATCHES)
@tab.batch
def piecewise(x):
  """Multiple returns and an `if/elif/else` chain."""
  if x < -1.0:
    return -2.0 * x
  if x < 0.0:
    return x * x
  elif x < 1.0:
    return x
  else:
    return tf.sqrt(x)


@register(args(floats(-10.0, 10.0, np.float32, extremes=(-10.0, -0.5, 0.5, 4.0, 9.0))),
          tf.int32, oracle=lambda x: int(np.digitize(x, [-1.0, 1.0, 5.0])))
@tab.batch
def bucket(x):
  """One variable assigned on every arm of an `if/elif/elif/else`."""
  if x < -1.0:
    b = tf.constant(0)
  elif x < 1.0:
    b = tf.constant(1)
  elif x < 5.0:
    b = tf.constant(2)
  else:
    b = tf.constant(3)
  return b


@register(args(floats(-2.0, 2.0, np.float64), floats(-2.0, 2.0, np.float64)),
          tf.float64, oracle=lambda a, b: abs(a - b) + (1.0 if a > 0 else 0.0))
@tab.batch
def ternary(a, b):
  d = a - b if a > b else b - a
  bonus = tf.constant(1.0, tf.float64) if a > 0 else tf.constant(0.0, tf.float64)
  return d + bonus


@register(args(ints(-3, 12, extremes=(5, -3, 0, 12)), ints(0, 10)), tf.int32,
          oracle=lambda x, y: _logic_oracle(int(x), int(y)))
@tab.batch
def logic(x, y):
  """`and`, `or` and `not` on per-example booleans, in `if` and as values."""
  r = tf.zeros_like(x)
  if x >= 0 and x <= 10 and not x == 5:
    r += 1
  if x < 0 or y > 7:
    r += 10
  if not (x > y or y == 0):
    r += 100
  inside = x > 2 and y > 2
  return r + 1000 * tf.cast(inside, tf.int32)


def _logic_oracle(x, y):
  r = 0
  if 0 <= x <= 10 and x != 5:
    r += 1
  if x < 0 or y > 7:
    r += 10
  if not (x > y or y == 0):
    r += 100
  return r + 1000 * int(x > 2 and y > 2)


@register(args(ints(-20, 20, extremes=(7, 0, -6)), ints(-5, 5, extremes=(0, 0, 3))),
          tf.int32, oracle=lambda a, b: 1 if b != 0 and a % b == 0 else 0,
          batch_sizes=ALL_BATCHES)
@tab.batch
def divides(a, b):
  """Short-circuit `and` guards `a % b` from b == 0, which TF rejects."""
  if b != 0 and a % b == 0:
    return tf.constant(1)
  return tf.constant(0)


@register(args(ints(-6, 6), floats(-1.0, 1.0, np.float32)), tf.float32,
          oracle=lambda n, x: (0.5 * x if n > 0 else x) if n != 0 else x + 1.0)
@tab.batch
def if_without_else(n, x):
  """A variable changed on one path only, and nested `if`s."""
  y = x
  if n != 0:
    if n > 0:
      y = y * 0.5
  else:
    y += 1.0
  return y


# ---------------------------------------------------------------------------
# Assignment forms, tuples and namedtuples.


@register(args(ints(0, 60, np.int64)), tf.int64, oracle=lambda n: _fib_oracle(int(n)))
@tab.batch
def fib_iter(n):
  """Tuple unpacking and augmented assignment in a counting loop."""
  a, b = tf.zeros_like(n), tf.ones_like(n)
  k = tf.zeros_like(n)
  while k < n:
    a, b = b, a + b
    k += 1
  return a


@register(args(ints(0, 60, extremes=(0, 60, 3)), ints(1, 20, extremes=(1, 1, 20))),
          (tf.int32, tf.int32), oracle=lambda a, b: divmod(int(a), int(b)),
          batch_sizes=WITH_ONE)
@tab.batch
def divmod_loop(a, b):
  """Returns a tuple; quotient by repeated subtraction."""
  q = tf.zeros_like(a)
  r = a
  while r >= b:
    r -= b
    q += 1
  return q, r


Point = collections.namedtuple("Point", ["x", "y"])


def _point_inputs(batch_size, rng):
  p = Point(x=floats(-2.0, 2.0)(batch_size, rng), y=floats(-2.0, 2.0)(batch_size, rng))
  return p, ints(0, 9, extremes=(0, 9))(batch_size, rng)


def _rotate_oracle(p, k):
  x, y = np.float32(p.x), np.float32(p.y)
  for _ in range(int(k)):
    x, y = -y, x
  return Point(x + np.float32(k), y)


@register(_point_inputs, Point(tf.float32, tf.float32), oracle=_rotate_oracle,
          batch_sizes=ALL_BATCHES)
@tab.batch
def rotate_point(p, k):
  """A namedtuple argument, loop variable and result."""
  for _ in range(k):
    p = Point(x=-p.y, y=p.x)
  return Point(x=p.x + tf.cast(k, tf.float32), y=p.y)


Stats = collections.namedtuple("Stats", ["count", "total"])


def _stats_inputs(batch_size, rng):
  return (floats(-1.0, 1.0, np.float64, shape=(5,))(batch_size, rng),
          floats(-0.5, 0.5, np.float64, extremes=(2.0, -2.0))(batch_size, rng))


@register(_stats_inputs, Stats(tf.int32, tf.float64),
          oracle=lambda v, t: Stats(int(np.sum(v > t)), float(np.sum(np.where(v > t, v, 0.0)))),
          batch_sizes=WITH_ONE)
@tab.batch
def stats_above(v, threshold):
  """A namedtuple of mixed dtypes (int32, float64) built in a loop."""
  s = Stats(count=tf.constant(0), total=tf.constant(0.0, tf.float64))
  for i in tf.range(5):
    x = tf.gather(v, i)
    if x > threshold:
      s = Stats(count=s.count + 1, total=s.total + x)
  return s


# ---------------------------------------------------------------------------
# Per-example vectors: reductions, gathers, vector-valued results.


@register(args(floats(-3.0, 3.0, np.float32, shape=(5,))), (tf.float32, tf.float32, tf.int64),
          oracle=lambda v: (np.sum(v), np.max(v), np.argmin(v)), batch_sizes=ALL_BATCHES)
@tab.batch
def vec_stats(v):
  """Reductions over one example's vector of shape [5] only."""
  return tf.reduce_sum(v), tf.reduce_max(v), tf.argmin(v)


def _halve_oracle(v):
  v, k = np.asarray(v, np.float32), 0
  while np.sum(v * v) > 1.0:
    v = v / np.float32(2.0)
    k += 1
  return v * np.float32(k)


@register(args(floats(-20.0, 20.0, np.float32, shape=(5,), extremes=(0.1, 20.0))),
          tf.float32, oracle=_halve_oracle, batch_sizes=WITH_ONE)
@tab.batch
def halve_until_small(v):
  """A vector loop variable and a per-example reduction in the loop test."""
  k = tf.constant(0.0)
  while tf.reduce_sum(v * v) > 1.0:
    v = v / 2.0
    k += 1.0
  return v * k


@register(args(floats(-2.0, 2.0), floats(-2.0, 2.0)), tf.float32,
          oracle=lambda a, b: a - b if a > b else b - a)
@tab.batch
def list_values(a, b):
  """A Python list of per-example values, indexed after a branch."""
  pair = [a, b]
  if a > b:
    return pair[0] - pair[1]
  return pair[1] - pair[0]


def _negated_comparisons_oracle(x):
  x = float(x)
  r = 0
  if not x <= 0.0:
    r += 1
  if not x < 1.0:
    r += 10
  if not x >= -1.0:
    r += 100
  k = 0
  while not x > 1.5 and k < 3:
    k += 1
  return r + 1000 * k


@register(args(floats(-2.0, 2.0, extremes=(np.nan, np.inf, -np.inf, 0.0))),
          tf.int32, oracle=_negated_comparisons_oracle)
@tab.batch
def negated_comparisons(x):
  """`not (a <= b)` is True for a NaN, where `a > b` is False: TensorFlow's
  graph optimiser rewrites the one into the other, so `not` must not be
  written as a `LogicalNot` of the comparison."""
  r = tf.constant(0)
  if not (x <= 0.0):
    r += 1
  if not (x < 1.0):
    r += 10
  if not (x >= -1.0):
    r += 100
  k = 0
  while not (x > 1.5) and k < 3:
    k += 1
  return r + 1000 * k


@register(args(ints(0, 30, np.int64)), tf.int64, oracle=lambda n: int(n))
@tab.batch
def count_up_int64(n):
  """A counter from a Python literal compared with an int64 input: it
  takes int64, as the literal would in Python."""
  i = 0
  while i < n:
    i += 1
  return i


@register(args(ints(0, 6, np.int64)), tf.int64,
          oracle=lambda n: 10 * min(int(n), 4))
@tab.batch
def capped_range(n):
  """A loop over a range of Python ints, left by `break` at an int64
  bound."""
  acc = n * 0
  for i in range(4):
    if i >= n:
      break
    acc += 10
  return acc


def _literal_sums_oracle(n):
  total, big = 0.0, 0
  for _ in range(int(n)):
    total += 0.1
    big += 2**30
  return total, big


@register(args(floats(-1.0, 1.0, np.float64), ints(0, 5, np.int64),
               ints(0, 9, extremes=(0, 9, 1))),
          (tf.float64, tf.int64), oracle=lambda x, k, n: _literal_sums_oracle(n),
          batch_sizes=WITH_ONE)
@tab.batch
def literals_over_params(x, k, n):
  """A float64 and an int64 parameter overwritten by Python literals and
  read in the same straight-line code: the sums they meet take their
  dtypes. (Read there as the Python numbers they were, they made `total`
  and `big` literal-typed, float32 and int32, on every backend: the sum
  of tenths was off in float32 and the int32 sum wrapped.)"""
  total = 0.0
  big = 0
  i = 0
  while i < n:
    x = 0.1
    total = total + x
    k = 2**30
    big = big + k
    i += 1
  return total, big


@register(args(floats(-1.0, 1.0, np.float64), ints(0, 6, extremes=(0, 6))),
          tf.float64, oracle=lambda x, depth: 2.0 ** int(depth) / 3.0)
@tab.batch
def literal_through_recursion(x, depth):
  """The value of a literal assigned over a float64 parameter, copied and
  returned through recursive calls: float64, not a float32 third."""
  if depth <= 0:
    x = 1.0 / 3.0
    third = x
    return third
  return literal_through_recursion(x, depth - 1) * 2.0


TABLE = np.array([3, 1, 4, 1, 5, 9, 2, 6], np.int32)


@register(args(floats(-1.0, 1.0, np.float32, shape=(5,)), ints(0, 4, extremes=(0, 4))),
          (tf.float32, tf.int32), oracle=lambda v, i: (2.0 * v[int(i)], TABLE[int(i) + 3]))
@tab.batch
def gather_lookup(v, i):
  """`tf.gather` with a per-example index, into an input and a closure table."""
  return tf.gather(v, i) * 2.0, tf.gather(TABLE, i + 3)


HEAD = tf.constant(3)


@register(args(floats(-1.0, 1.0, np.float32, shape=(5,)), ints(-4, 4, extremes=(-4, 4))),
          tf.float32,
          oracle=lambda v, i: (v[:3].sum() + v[1:-1].sum() + v[::-2].sum() + v[3:][0]
                               + v[int(i)] + v[:4][::-1][int(i) % 4]))
@tab.batch
def slices(v, i):
  """Slices with bounds known when traced (literals, a closure tensor, a
  local Python int, the length), the last indexed per example."""
  start = 3
  total = tf.reduce_sum(v[:HEAD]) + tf.reduce_sum(v[1:-1])
  total += tf.reduce_sum(v[::-2]) + v[start:][0]
  return total + v[i] + v[:tf.shape(v)[0] - 1][::-1][i % 4]


# ---------------------------------------------------------------------------
# Closures, helpers, lambdas, calls between batched functions.

SCALE = 3
OFFSETS = np.array([0.5, -1.0, 2.0], np.float32)
BIAS = tf.constant(0.25, tf.float32)


@register(args(floats(-2.0, 2.0, np.float32), ints(0, 2)), tf.float32,
          oracle=lambda x, k: np.float32(SCALE) * x + OFFSETS[int(k)] + np.float32(0.25)
          if x > 0 else x - np.float32(0.25))
@tab.batch
def closures(x, k):
  """Captures a Python number, a NumPy array and a TF constant."""
  if x > 0:
    return SCALE * x + tf.gather(OFFSETS, k) + BIAS
  return x - BIAS


def _square(t):
  return t * t


_affine = lambda t: 2 * t + 1  # noqa: E731  (a lambda on purpose)


@register(args(ints(-20, 20)), tf.int32,
          oracle=lambda x: (2 * int(x) + 1)**2 if x > 0 else int(x))
@tab.batch
def helpers(x):
  """Calls a plain Python helper and a module-level lambda."""
  if x > 0:
    return _square(_affine(x))
  return x


@register(args(ints(-20, 20)), tf.int32,
          oracle=lambda x: 3 * int(x) + 1 if x > 0 else int(x) - 1)
@tab.batch
def local_lambda(x):
  """A lambda bound to a local name, and one applied where it is written."""
  triple = lambda t: t * 3  # noqa: E731
  if x > 0:
    return triple(x) + 1
  return (lambda t: t - 1)(x)


@register(args(ints(0, 8, extremes=(0, 8))), tf.int32,
          oracle=lambda n: sum(_fib_oracle(i) for i in range(int(n))))
@tab.batch
def sum_fibs(n):
  """A recursive batched function called from inside a loop."""
  s = tf.zeros_like(n)
  for i in tf.range(n):
    s += fib(i)
  return s


@register(args(ints(0, 8), ints(0, 6, np.int64)), tf.int64,
          oracle=lambda a, b: _fib_oracle(int(a)) + math.factorial(int(b)))
@tab.batch
def call_two(a, b):
  """Calls two other batched functions of different dtypes."""
  return tf.cast(fib(a), tf.int64) + factorial(b)


PROGRAMS_BY_NAME = {p.name: p for p in PROGRAMS}
assert len(PROGRAMS_BY_NAME) == len(PROGRAMS), "program names must be unique"
