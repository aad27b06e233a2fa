"""Frontend: Python source -> IR-1, on small inline functions."""
import collections
import dataclasses
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.frontend import convert
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.ir import verify
from tfp_autobatch.operators import pyops

_LIMIT = 100   # a Python number bound outside the functions under test


def ir_of(fn):
  return pipeline.convert_program(tab.batch(fn))


def test_fib_prints_as_blocks_golden():
  def fib(n):
    if n <= 1:
      return n
    return fib(n - 1) + fib(n - 2)
  fib = tab.batch(fib)
  assert str(fib.ir()) == textwrap.dedent("""\
      def fib(n) -> _result:
        entry:
          _cond0 = primitive(n) { _cond0 = __tab_ops__.truthy(n <= 1) }
          branch _cond0 ? then1 : endif3
        then1:
          _result = primitive(n) { _result = n }
          return
        endif3:
          _t4 = primitive(n) { _t4 = n - 1 }
          _t5 = call fib(_t4)
          _t6 = primitive(n) { _t6 = n - 2 }
          _t7 = call fib(_t6)
          _result = primitive(_t5, _t7) { _result = _t5 + _t7 }
          return""")


def test_typed_program_prints_types_after_a_call():
  @tab.batch
  def double(x):
    return x * 2.0
  double(np.ones([2, 3], np.float32))
  assert str(double.ir()).endswith(
      "types: _result: float32[3], x: float32[3]")


def test_while_loop_golden():
  def count(n):
    steps = 0
    while n > 0:
      n = n - 1
      steps += 1
    return steps
  assert str(ir_of(count)) == textwrap.dedent("""\
      def count(n) -> _result:
        entry:
          steps = primitive() { steps = 0 }
          jump while0
        while0:
          _cond1 = primitive(n) { _cond1 = __tab_ops__.truthy(n > 0) }
          branch _cond1 ? body2 : endloop3
        body2:
          n, steps = primitive(n, steps) { n = n - 1; steps += 1 }
          jump while0
        endloop3:
          _result = primitive(steps) { _result = steps }
          return""")


def test_for_range_break_continue_structure():
  def f(n):
    total = 0
    for i in range(n):
      if i == 2:
        continue
      if i > 5:
        break
      total += i
    return total
  fn = ir_of(f).entry
  terminators = {b.label: b.terminator for b in fn.blocks}
  header = next(label for label in terminators if label.startswith("for"))
  exits = [t for t in terminators.values() if isinstance(t, ir1.Jump)]
  # `continue` jumps back to the loop header, `break` to the loop exit.
  assert ir1.Jump(header) in exits
  assert any(isinstance(t, ir1.Jump) and t.target.startswith("endloop")
             for t in exits)
  verify.verify(ir_of(f), "test")


def test_batched_calls_are_hoisted_in_evaluation_order():
  @tab.batch
  def g(x):
    return x + 1
  def f(x):
    return g(x) * g(x + 2)
  ops = ir_of(f).entry.blocks[0].ops
  kinds = [type(op).__name__ for op in ops]
  assert kinds == ["Call", "Primitive", "Call", "Primitive"]


def test_mutual_recursion_with_function_defined_later():
  program = pipeline.convert_program(_is_even)
  assert [f.name for f in program.functions] == ["_is_even", "_is_odd"]


@tab.batch
def _is_even(n):
  if n == 0:
    return True
  return _is_odd(n - 1)


@tab.batch
def _is_odd(n):
  if n == 0:
    return False
  return _is_even(n - 1)


def test_conditional_expression_and_boolean_operators_become_branches():
  def f(a, b, xs):
    c = a if a > b else b
    return (c > 0 and xs[a] < 3) or not xs[b] > 1
  blocks = ir_of(f).entry.blocks
  branches = [b for b in blocks if isinstance(b.terminator, ir1.Branch)]
  assert len(branches) == 3   # the ternary, `and`, `or`
  verify.verify(ir_of(f), "test")


def test_boolean_operators_on_plain_tests_are_selects():
  # Names, attributes, constants, comparisons and `not` cannot fail, so
  # `and`/`or` of them need no short circuit: no branch, one block.
  def f(a, b):
    return (a > 0 and a < 3) or not b > 1
  fn = ir_of(f).entry
  assert len(fn.blocks) == 1
  assert "and_values" in fn.blocks[0].ops[0].code.source


@pytest.mark.parametrize("op, values, want", [
    (pyops.and_values, (2, 0, 3), 0),
    (pyops.and_values, (2, 5, 3), 3),
    (pyops.or_values, (0, 0, 7), 7),
    (pyops.or_values, (0, 4, 7), 4),
])
def test_selected_boolean_operators_keep_python_values(op, values, want):
  assert op(*values) == want
  tensors = [tf.constant(v) for v in values]
  assert int(op(*tensors)) == want
  # Mixed Python literals and tensors take the tensor's dtype.
  mixed = op(tf.constant(values[0], tf.int64), *values[1:])
  assert int(mixed) == want


def test_for_over_a_constant_range_is_unrolled():
  def f(x):
    for i in range(UNROLLED_TRIPS):
      if x > i:
        x = x - 1
    return x
  fn = ir_of(f).entry
  assert not any(b.label.startswith(("for", "body")) for b in fn.blocks)
  assert sum(isinstance(b.terminator, ir1.Branch)
             for b in fn.blocks) == UNROLLED_TRIPS
  batched = tab.batch(f)
  x = np.array([0, 2, 5, 9], np.int32)
  np.testing.assert_array_equal(batched(x, backend="local:eager"),
                                [0, 1, 2, 6])


def test_for_loops_that_stay_loops():
  @tab.batch
  def g(x):
    return x + 1

  def calls_batched(x):
    for _ in range(3):
      x = g(x)
    return x

  def breaks(x):
    for _ in range(3):
      if x > 2:
        break
      x = x + 1
    return x

  def long_range(x):
    for _ in range(convert.MAX_UNROLLED_ITERATIONS + 1):
      x = x + 1
    return x

  def local_bound(x, n):
    for _ in range(n):
      x = x + 1
    return x

  for f in (calls_batched, breaks, long_range, local_bound):
    labels = [b.label for b in ir_of(f).entry.blocks]
    assert any(label.startswith("for") for label in labels), f.__name__


UNROLLED_TRIPS = 3


def test_chained_comparison_is_rewritten():
  def f(a):
    return 0 < a < 3
  source = ir_of(f).entry.blocks[0].ops[0].code.source
  assert "all_of" in source


def _min_max_of_three(a, b):
  return min(a, b, 1.0) + 10.0 * max(a, 0.5, b)


def _is_odd_digit_below_six(x):
  if x in (1, 3, 5):
    return 1
  return 0


def _membership_chained_and_negated(x):
  return (tf.cast(x not in [2, 3], tf.int32)
          + 10 * tf.cast(0 < x in (1, 2), tf.int32))


def _min_max_keep_python_order(x):
  # Python keeps the first value unless a later one compares smaller
  # (larger): min(1.0, nan) is 1.0, min(nan, 1.0) nan, min(0.0, -0.0) 0.0.
  return (min(1.0, x), min(x, 1.0), max(1.0, x), max(x, 1.0),
          min(x, -0.0, 0.0))


@pytest.mark.parametrize("backend", ["local:eager", "pc:graph"])
@pytest.mark.parametrize("fn, args", [
    (_min_max_of_three, (np.array([1., -2., 3., 0.7]),
                         np.array([0., 5., 3., 0.6]))),
    (_min_max_keep_python_order, (np.array([np.nan, 0.5, 2., 0.]),)),
    (_is_odd_digit_below_six, (np.arange(7),)),
    (_membership_chained_and_negated, (np.arange(5),)),
])
def test_min_max_and_in_work_as_in_python(backend, fn, args):
  # They compared symbolic tensors as Python bools: a TypeInferenceError
  # saying to use eager execution or tf.function.
  want = [fn(*[tf.constant(a[i]) for a in args]) for i in range(len(args[0]))]
  got = tab.batch(fn)(*args, backend=backend)
  if isinstance(got, tuple):   # one row of results per example
    got = np.stack(got, -1)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
  np.testing.assert_allclose(got, want)


@dataclasses.dataclass
class _Scale:
  """A callable, unhashable (a dataclass with eq), as a model may be."""
  factor: float

  def __call__(self, x):
    return self.factor * x


_SCALE = _Scale(2.0)


def test_an_unhashable_callable_is_called_per_example():
  # Looking up min/max by hashing the callee raised "unhashable type".
  @tab.batch
  def scaled(x):
    return _SCALE(x)
  np.testing.assert_allclose(scaled(np.array([3.0, 0.5]),
                                    backend="local:eager"), [6.0, 1.0])


def test_literals_meeting_different_dtypes_take_one_each():
  # One dtype for all of a primitive's literal inputs was tried, so this
  # was a TypeInferenceError though Python runs it.
  @tab.batch
  def two(n, x):
    a = 0
    b = 1.5
    if n > 0:
      a = 1
    return a + n, b + x
  a, b = two(np.array([1, -2]), np.array([0.5, 1.0]))
  assert a.dtype == tf.int64 and b.dtype == tf.float64
  np.testing.assert_array_equal(a, [2, -2])
  np.testing.assert_allclose(b, [2.0, 2.5])


def test_a_function_called_with_literals_meeting_two_dtypes_is_explained():
  # One function has one result type: ident(1) used as int64 and ident(2)
  # as int32 cannot both be; the error says which literals took which.
  @tab.batch
  def f(n, m):
    a = _identity(1)
    b = _identity(2)
    return a + n, b + m
  with pytest.raises(tab.TypeInferenceError,
                     match=r"(?s)after Python literals took the dtypes.*"
                     r"'_result' of '_identity'.*tf.constant\(1, tf.int64\)"):
    f(np.array([1, 2]), np.array([3, 4], np.int32))


def test_a_literal_past_int32_keeps_its_value():
  # TensorFlow types 2**31 int64; its variable was typed int32 (a Python 0
  # stood for it in type inference) and the value wrapped.
  @tab.batch
  def big(x):
    i = 0
    if x > 0:
      i = 2147483648
    return i
  out = big(np.array([1, -2]), backend="local:eager")
  assert out.dtype == tf.int64
  np.testing.assert_array_equal(out, [2147483648, 0])


def test_min_max_of_one_sequence_and_in_a_tensor_are_clear_errors():
  def min_of_a_vector(v):
    return min(v)
  _rejected(min_of_a_vector, "min() of one sequence")

  def in_a_tensor(x, v):
    return x in v
  _rejected(in_a_tensor, "`in` over something other than a literal tuple")


def _rejected(fn, construct):
  with pytest.raises(tab.ConversionError) as info:
    ir_of(fn)
  message = str(info.value)
  assert fn.__name__ in message
  assert __file__ in message
  assert f"line {info.value.lineno}" in message
  assert construct in message
  return info.value


def test_rejects_try():
  def f(x):
    try:
      y = x
    except ValueError:
      y = x
    return y
  err = _rejected(f, "try/except")
  assert err.lineno == f.__code__.co_firstlineno + 1


def test_rejects_with():
  def f(x):
    with tf.name_scope("a"):
      y = x
    return y
  _rejected(f, "with")


def test_rejects_generators():
  def f(x):
    yield x
  _rejected(f, "yield")


def test_rejects_global_and_nonlocal():
  def f(x):
    global _G  # pylint: disable=global-variable-undefined
    return x
  _rejected(f, "global")
  z = 1
  def g(x):
    nonlocal z
    return x + z
  _rejected(g, "nonlocal")


def test_rejects_mutation_and_side_effects():
  def f(x):
    x[0] = 1
    return x
  _rejected(f, "assigning to an element")
  def g(x):
    items = []
    items.append(x)
    return x
  _rejected(g, "expression statement")


def test_rejects_batched_function_as_value():
  @tab.batch
  def h(x):
    return x
  def f(x):
    k = h
    return k(x)
  _rejected(f, "as a value")


def test_rejects_async_and_lambdas_as_batched_functions():
  async def f(x):
    return x
  with pytest.raises(tab.ConversionError, match="async"):
    ir_of(f)
  with pytest.raises(tab.ConversionError, match="lambda"):
    ir_of(lambda x: x)


def test_rejects_for_over_non_range():
  def f(x):
    for v in x:
      x = v
    return x
  _rejected(f, "for loop over something other than range")


def test_rejects_falling_off_the_end():
  def f(x):
    if x > 0:
      return x
  _rejected(f, "without `return`")


def test_rejects_a_variable_assigned_on_some_paths_only():
  # Python raises UnboundLocalError for n <= 1; batched, `y` was a register
  # of zeros and those examples silently returned 0.
  def after_if(n):
    if n > 1:
      y = n * 10
    return y
  error = _rejected(after_if, "'y' may be read before it is assigned")
  assert error.lineno == after_if.__code__.co_firstlineno + 3

  def after_loop(n):      # the loop may run zero times
    i = 0
    while i < n:
      last = i
      i += 1
    return last
  _rejected(after_loop, "'last' may be read before it is assigned")

  def passed_to_a_call(n):
    if n > 1:
      m = n - 1
    return _is_even(m)
  error = _rejected(passed_to_a_call, "'m' may be read before it is assigned")
  assert error.lineno == passed_to_a_call.__code__.co_firstlineno + 3

  def read_on_a_later_line(n):    # the read, not the primitive's first line
    if n > 1:
      y = n
    a = n + 1
    b = a + y
    return b
  error = _rejected(read_on_a_later_line, "'y' may be read")
  assert error.lineno == read_on_a_later_line.__code__.co_firstlineno + 4


def _batched_adder():
  @tab.batch
  def inner(n):
    return n + 1
  return inner


def _batched_unassigned_read():
  @tab.batch
  def inner(n):
    if n > 1:
      y = n
    return y
  return inner


def test_errors_name_the_python_function_when_two_share_a_name():
  # The program renames the second `inner` it meets to `inner_2`; a
  # message names the function the user wrote.
  first, second = _batched_adder(), _batched_unassigned_read()

  @tab.batch
  def outer(n):
    return first(n) + second(n)

  with pytest.raises(tab.ConversionError) as info:
    outer(np.array([1, 2]))
  assert info.value.function == "_batched_unassigned_read.<locals>.inner"
  assert "inner_2" not in str(info.value)


def test_variables_assigned_on_every_path_are_accepted():
  def both_branches(n):
    if n > 1:
      y = n
    else:
      y = -n
    return y

  def first_pass_of_while_true(n):   # the body always runs once
    while True:
      last = n
      n = n - 1
      if n < 0:
        break
    return last

  def assigned_before_any_return(n):
    if n > 1:
      return n
    y = n + 1
    return y
  def after_a_long_range(n):        # a range of Python ints, not empty
    for i in range(20):              # and too long to unroll
      last = n + i
    return last + i

  def after_a_range_left_by_break(n):
    for i in range(4):
      last = n + i
      if last > 2:
        break
    return last

  def under_if_true(n):
    if True:  # pylint: disable=using-constant-test
      y = n
    return y

  def after_a_while_its_literals_enter(n):   # i = 0 makes i < 3 true
    i = 0
    while i < 3:
      y = n * i
      i += 1
    return y

  def after_a_while_not_done(n):
    done = False
    k = 0
    while not done and k < _LIMIT:
      last = n + k
      k = k + 1
      done = k >= n
    return last
  for f in (both_branches, first_pass_of_while_true,
            assigned_before_any_return, after_a_long_range,
            after_a_range_left_by_break, under_if_true,
            after_a_while_its_literals_enter, after_a_while_not_done):
    verify.verify(ir_of(f), "test")
    batched = tab.batch(f)
    np.testing.assert_array_equal(
        batched(np.array([0, 1, 3]), backend="local:eager"),
        [f(n) for n in (0, 1, 3)])


def test_a_while_its_literals_may_not_enter_is_not_counted_as_entered():
  def test_false_at_entry(n):
    i = 5
    while i < 3:
      y = n
      i += 1
    return y
  _rejected(test_false_at_entry, "'y' may be read before it is assigned")

  def literal_replaced(n):          # the last assignment is not a literal
    i = 0
    i = n
    while i < 3:
      y = n
      i += 1
    return y
  _rejected(literal_replaced, "'y' may be read before it is assigned")

  def test_reads_an_argument(n):
    i = 0
    while i < n:
      y = n
      i += 1
    return y
  _rejected(test_reads_an_argument, "'y' may be read before it is assigned")

  def float_test(n):         # true in Python's float64, false in float32
    a = 0.1 + 0.2
    while a != 0.3:
      y = n
      a = 0.3
    return y
  _rejected(float_test, "'y' may be read before it is assigned")


def test_loop_forever_with_return_inside_is_fine():
  def f(x):
    while True:
      if x > 3:
        return x
      x = x + 1
  verify.verify(ir_of(f), "test")


def test_type_conflict_names_variable_and_types():
  @tab.batch
  def f(x):
    if x > 0:
      y = tf.cast(x, tf.float32)
    else:
      y = tf.cast(x, tf.int32)
    return y
  with pytest.raises(tab.TypeInferenceError, match=r"'y'.*float32.*int32"):
    f(np.array([1, -1]))


def test_literal_takes_the_dtype_it_is_joined_with():
  @tab.batch
  def f(v):
    acc = 0.0
    for i in range(3):
      acc = acc + v
    return acc
  out = f(np.ones([2], np.float64))
  assert out.dtype == tf.float64
  np.testing.assert_allclose(out, [3.0, 3.0])


@tab.batch
def _count_to(n):
  i = 0
  while i < n:
    i += 1
  return i


@tab.batch
def _halves_to(t):
  x = 0.0
  halves = 0     # compared with nothing: TensorFlow's default, int32
  while x < t:
    x += 0.5
    halves += 1
  return tf.cast(halves, t.dtype) * 0.5   # x, counted


@pytest.mark.parametrize("backend", ["local:eager", "pc:graph"])
@pytest.mark.parametrize("fn, batch, want", [
    (_count_to, np.array([0, 3], np.int64), [0, 3]),
    (_halves_to, np.array([0.9, 2.0]), [1.0, 2.0])])
def test_literal_takes_the_dtype_it_is_compared_with(backend, fn, batch, want):
  # NumPy's default integers are int64 (floats float64); `i = 0` alone is
  # TensorFlow's int32, and `i < n` used to fail at run time (the
  # differential suite's `count_up_int64` and `capped_range` run every
  # backend).
  out = fn(batch, backend=backend)
  assert out.dtype == batch.dtype
  np.testing.assert_allclose(out, want)


def test_literal_with_no_dtype_that_runs_is_a_clear_error():
  @tab.batch
  def f(v, x):
    k = 0
    while k < 1:
      return tf.gather(v, k) + x * k   # an index and a float factor at once
    return x
  with pytest.raises(tab.TypeInferenceError,
                     match=r"'k', typed by Python literals.*tf.cast"):
    f(np.ones([2, 3], np.float32), np.ones([2], np.float32))


@pytest.mark.parametrize("n, match", [
    (np.array([3, 20], np.int8), r"'i'.*n: int8"),         # would wrap
    (np.array([0.5, 2.0]), r"'i'.*n: float64.*tf.cast"),   # stays an int
])
def test_an_integer_literal_takes_no_narrow_or_float_dtype(n, match):
  # A counter promoted to int8 wrapped silently; one promoted to float32
  # stopped counting past 2**24 (a loop that never ended).
  with pytest.raises(tab.TypeInferenceError, match=match):
    _count_to(n)


@pytest.mark.parametrize("dtype", [np.float16, tf.bfloat16])
def test_a_float_literal_takes_a_half_precision_dtype(dtype):
  # Only integer literals keep 32 bits; `x * scale` was rejected with a
  # message about integers.
  @tab.batch
  def scaled(x):
    scale = 2.0
    if x > 0:
      scale = 3.0
    return x * scale
  out = scaled(tf.constant([1., -1.], dtype), backend="pc:graph")
  assert out.dtype == dtype
  np.testing.assert_allclose(tf.cast(out, tf.float32), [3., -2.])


def test_a_literal_dividing_traces_past_zero():
  # Literal-typed values trace as 0 first, and `1.0 / scale` raised
  # ZeroDivisionError there: a valid program rejected.
  @tab.batch
  def inverse(x):
    scale = 2.0
    if x > 0:
      scale = 4.0
    k = 1
    if x > 0:
      k = 2
    return x * (1.0 / scale) + tf.cast(1 // k, x.dtype)
  np.testing.assert_allclose(
      inverse(np.array([1., -1.], np.float32), backend="pc:graph"),
      [0.25, 0.5])


@tab.batched_primitive
def _doubled(v):
  return v * 2.0


def _third_over(x, b):
  b = 1.0 / 3.0
  return b                  # `_result = b` in the same primitive


def _squared_over(n, k):
  k = 2**20
  return tf.square(k)       # int32 (Python's 2**20): 2**40 wrapped to 0


def _sqrt_over(x, b):
  b = 0.5
  return tf.sqrt(b) * x     # float32 * float64: a TypeInferenceError


def _doubled_over(x, b):
  b = 0.1
  c = b
  return _doubled(c)        # a batched primitive's input


_F64 = np.array([1.0, 2.0])
_I64 = np.array([3, 4])


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_a_literal_over_a_float64_parameter_reads_as_float64(backend):
  # The variable was float64 (its parameter's type), but the code after
  # the assignment in the same primitive read the Python float, so `_result`
  # was typed a float32 literal: 0.3333333433 on every backend.
  out = tab.batch(_third_over)(_F64, _F64, backend=backend)
  assert out.dtype == tf.float64
  np.testing.assert_array_equal(out, [1.0 / 3.0] * 2)


@pytest.mark.parametrize("backend", ["local:eager", "pc:xla"])
@pytest.mark.parametrize("fn, batch, want", [
    (_squared_over, _I64, 2**40),
    (_sqrt_over, _F64, np.sqrt(0.5) * _F64),
    (_doubled_over, _F64, 0.2),
])
def test_a_literal_over_a_parameter_computes_in_its_dtype(
    backend, fn, batch, want):
  out = tab.batch(fn)(batch, batch, backend=backend)
  assert out.dtype == batch.dtype
  np.testing.assert_array_equal(out, np.broadcast_to(want, batch.shape))


def test_variables_a_literal_reaches_in_one_primitive_are_typed_as_it():
  @tab.batch
  def f(x, b):
    b = 0.1
    c = b          # float64, as `b` is
    d = 0.5
    e = d          # literals alone: still a literal's type
    return c * e
  f(_F64, _F64, backend="local:eager")
  types = str(f.ir()).rsplit("types:", 1)[1]
  assert "c: float64[]," in types and "e: float32[]~" in types


@pytest.mark.parametrize("backend", ["local:eager", "pc:graph"])
def test_a_literal_typed_input_takes_the_dtype_of_what_it_is_assigned_to(
    backend):
  # Type inference traces `a` as a Python float, which `b = a` makes
  # float64; when the code runs, `a` is a float32 tensor and is cast as
  # well, so `tf.sqrt` computes in float64 there too.
  @tab.batch
  def f(x, b):
    a = 0.1
    if x > 0:
      a = 0.2
    b = a
    return tf.sqrt(b)
  out = f(np.array([1.0, -1.0]), _F64, backend=backend)
  assert out.dtype == tf.float64
  np.testing.assert_array_equal(
      out, np.sqrt(np.float32([0.2, 0.1]).astype(np.float64)))


@pytest.mark.parametrize("backend", ["local:eager", "pc:graph", "pc:xla"])
def test_a_literal_of_strong_type_still_indexes_a_python_tuple(backend):
  # `i = 0` becomes an int64 constant where it is assigned (the loop
  # compares `i` with an int64 `n`); a tuple indexed by it was a
  # TypeInferenceError (tuple indices must be integers).
  @tab.batch
  def f(x, n):
    values = (x, x * 2.0)
    i = 1
    picked = values[i]
    while i < n:
      i += 1
    return picked + tf.cast(i, x.dtype)
  out = f(_F64, _I64, backend=backend)
  assert out.dtype == tf.float64
  np.testing.assert_array_equal(out, 2.0 * _F64 + _I64)


@pytest.mark.parametrize("backend", ["local:eager", "pc:xla"])
def test_a_slice_with_per_example_bounds_is_a_clear_error(backend):
  # `v[i:i + 2]` is empty where `i` is -1 (v[-1:1]): its length differs by
  # example. pfor fell back to a loop over the batch, which failed with an
  # obscure TensorListStack error on the other backends and, compiled by
  # XLA, returned 5.0 for the member [-1, 0, 5] (Python: 0.0).
  @tab.batch
  def f(v, i):
    return tf.reduce_sum(v[i:i + 2])
  v = np.array([[1., 2., 3.], [-1., 0., 5.]], np.float32)
  with pytest.raises(tab.TypeInferenceError,
                     match=r"line \d+\) .*slice whose bounds are computed per "
                           r"example.*tf\.gather"):
    f(v, np.array([0, -1], np.int32), backend=backend)


def _float32_over(x, b):
  b = tf.constant(1.0, tf.float32)   # a tensor of another dtype
  return b


def _int_over(x, b):
  b = 2                              # an int literal for a bool
  return b


@pytest.mark.parametrize("fn, b", [(_float32_over, _F64),
                                   (_int_over, np.array([True, False]))])
def test_a_variable_is_not_cast_to_hide_a_type_conflict(fn, b):
  # Only a literal of a kind the variable's dtype admits takes it.
  with pytest.raises(tab.TypeInferenceError, match="'b'.*two different types"):
    tab.batch(fn)(_F64, b)


def test_as_assigned_gives_only_literals_of_strong_types_a_dtype():
  f64 = types_lib.TensorType(tf.float64, ())
  weak = types_lib.TensorType(tf.float32, (), weak=True)
  assert pyops.as_assigned(0, 0.5) == 0.5           # outside a primitive
  f32 = tf.constant(0.5)
  with pyops.assigning([f64, weak, (f64, weak)], casts_tensors=False) as record:
    assert pyops.as_assigned(0, f32) is f32         # inference: no cast
    assert not record.numbers_met
    assert pyops.as_assigned(1, 0.5) == 0.5         # a weak variable's
    assert record.numbers_met
    typed = pyops.as_assigned(0, 0.5)
    assert typed.dtype == tf.float64 and float(typed) == 0.5
    pair = pyops.as_assigned(2, (1, 2))
    assert pair[0].dtype == tf.float64 and pair[1] == 2
  with pyops.assigning([f64], casts_tensors=True):
    assert pyops.as_assigned(0, f32).dtype == tf.float64
    same = tf.constant(0.5, tf.float64)
    assert pyops.as_assigned(0, same) is same       # no op


_Pair = collections.namedtuple("_Pair", "a b")
_Other = collections.namedtuple("_Other", "a b")


def _tuple_or_list(x):
  if x > 0:
    r = (x, x)
  else:
    r = [x, x]
  return r


def _tuple_or_namedtuple(x):
  if x > 0:
    r = (x, x)
  else:
    r = _Pair(x, x)
  return r


def _two_namedtuples(x):
  if x > 0:
    r = _Other(x, x)
  else:
    r = _Pair(x, x)
  return r


@pytest.mark.parametrize("fn", [_tuple_or_list, _tuple_or_namedtuple,
                                _two_namedtuples])
def test_containers_differing_by_path_are_a_type_error(fn):
  # A tuple and a list, or two namedtuple types, passed the structure
  # check and failed later with a bare TypeError from tf.nest.
  with pytest.raises(tab.TypeInferenceError,
                     match="'r'.*two different structures.*same container"):
    tab.batch(fn)(np.array([1., -1.], np.float32), backend="pc:graph")


def test_a_literal_inside_a_tuple_takes_the_dtype_it_is_compared_with():
  @tab.batch
  def count_to(n):
    state = (0, n)
    while state[0] < n:
      state = (state[0] + 2, n)
    return state[0]
  out = count_to(np.array([0, 5], np.int64), backend="pc:graph")
  assert out.dtype == tf.int64
  np.testing.assert_array_equal(out, [0, 6])


@tab.batch
def _identity(x):
  return x


@tab.batch
def _square(i):
  return i * i


@tab.batch
def _literal_through_a_call(n):
  j = _identity(1)       # the call is inlined: its result is copied
  return j + n


@tab.batch
def _float_literal_through_a_call(v):
  a = 0.5
  return _identity(a) + v


@tab.batch
def _root_floor(n):
  i = 0                     # meets only _square's result: stays int32
  while _square(i) <= n:    # that result meets n: takes int64
    i += 1
  return i - 1


@pytest.mark.parametrize("backend", ["local:eager", "pc:graph"])
@pytest.mark.parametrize("fn, batch, want, dtype", [
    (_literal_through_a_call, np.array([0, 3]), [1, 4], tf.int64),
    (_float_literal_through_a_call, np.array([1., 2.]), [1.5, 2.5],
     tf.float64),
    (_root_floor, np.array([0, 3, 10]), [0, 1, 3], tf.int32),
])
def test_a_literal_promoted_after_a_call_returns_through_it(backend, fn, batch,
                                                           want, dtype):
  # The caller's variable took int64 (float64), the callee's result stayed
  # a literal's int32: the pc backends failed binding the inlined call's
  # copy ("Can not cast TensorSpec ... int32 to ... int64").
  out = fn(batch, backend=backend)
  assert out.dtype == dtype
  np.testing.assert_allclose(out, want)


def test_a_list_indexed_per_example_says_to_stack_it():
  @tab.batch
  def pick(x, k):
    values = [x, 2 * x, 3 * x]
    return values[k]
  with pytest.raises(tab.TypeInferenceError, match=r"tf.stack.*tf.gather"):
    pick(np.ones([2], np.float32), np.array([0, 2], np.int32))


def test_verify_catches_a_broken_program():
  program = ir_of(lambda_free_identity)
  fn = program.entry
  broken_block = ir1.Block("entry", fn.blocks[0].ops, ir1.Jump("nowhere"))
  broken = ir1.Program((ir1.Function(fn.name, fn.params, fn.result,
                                     (broken_block,)),))
  with pytest.raises(tab.IRError, match="after pass 'mypass'.*nowhere"):
    verify.verify(broken, "mypass")


def lambda_free_identity(x):
  return x


def _in_v1_graph(build, in_function):
  """`build()`'s tensors from a `tf.compat.v1` graph run by a Session,
  built in the graph itself or in a `tf.function` traced there (where
  TensorFlow's `Tensor.__eq__` compares objects, not values)."""
  with tf.Graph().as_default():
    out = (tf.function(build, autograph=False)() if in_function
           else build())
    with tf.compat.v1.Session() as session:
      return session.run(out)


@pytest.mark.parametrize("backend", ["pc:graph", "pc:xla"])
@pytest.mark.parametrize("where", ["eager", "v1 graph", "v1 graph function"])
def test_equality_compares_values_in_a_v1_graph_too(backend, where):
  """`n == 0` and `n != 0` are elementwise in every mode: inside a
  tf.compat.v1 graph TensorFlow's `==` on tensors is object identity
  (False), which made NUTS build two leaves for every depth-0 subtree."""
  def steps(n):
    if n == 0:
      return n
    return steps(n - 1) + tf.where(n % 3 != 0, 1, 10)
  steps = tab.batch(steps)
  build = lambda: steps(tf.constant([0, 1, 4, 6]), backend=backend)  # pylint: disable=unnecessary-lambda-assignment
  if where == "eager":
    got = build().numpy()
  else:
    got = _in_v1_graph(build, in_function=where == "v1 graph function")
  np.testing.assert_array_equal(got, [0, 1, 13, 24])


def test_equality_keeps_python_semantics_for_python_values():
  assert pyops.equal(2, 2) is True and pyops.not_equal("a", "a") is False
  assert pyops.equal(tf.constant(1.), None) is False
  assert pyops.equal(1, tf.constant([1., 2.])).dtype == tf.bool
  # Shapes that do not broadcast: False, as TensorFlow's `==` eagerly.
  assert not pyops.equal(tf.constant([1, 2]), tf.constant([1, 2, 3]))
