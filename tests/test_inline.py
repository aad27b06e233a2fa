"""Tests of inlining (`passes/inline.py`)."""
import numpy as np
import pytest
import tensorflow as tf

import example_programs as programs
import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.passes import infer_types
from tfp_autobatch.passes import inline
from tfp_autobatch.passes import lower
from tfp_autobatch.passes import tail_duplicate

INT = [types_lib.TensorType(tf.int32, ())]


digit_sum = programs.PROGRAMS_BY_NAME["digit_sum"].fn     # calls a helper once
fib = programs.PROGRAMS_BY_NAME["fib"].fn                 # recursive


@tab.batch
def _twice(x):
  return x * 2


@tab.batch
def _calls_twice_twice(x):
  return _twice(x) + _twice(x + 1)


@tab.batch
def _halve_odd(x):
  if x % 2 == 1:
    x = x // 2
  return x


@tab.batch
def _calls_halve_odd_twice(x):
  return _halve_odd(x) + _halve_odd(x + 1)


def test_a_function_called_from_one_place_is_inlined():
  untyped = pipeline.convert_program(digit_sum)
  assert [f.name for f in untyped.functions] == ["digit_sum", "_take_digits"]
  program = pipeline.typed_program(digit_sum, INT)
  assert [f.name for f in program.functions] == ["digit_sum"]
  ops = [op for b in program.entry.blocks for op in b.ops]
  assert not any(isinstance(op, ir1.Call) for op in ops)
  # The helper's variables live on in the caller, renamed, with its types.
  assert program.var_type("digit_sum", "_take_digits.total") == INT[0]
  # Loop header, unrolled helper and its return are one block per iteration.
  assert len(program.entry.blocks) <= 3
  x = np.array([0, 9, 10, 1234567, 2_000_000_000], np.int32)
  for backend in ("local:eager", "pc:xla"):
    np.testing.assert_array_equal(digit_sum(x, backend=backend),
                                  [0, 9, 1, 28, 2])


def test_a_straight_line_function_is_inlined_at_every_call_site():
  program = pipeline.typed_program(_calls_twice_twice, INT)
  assert [f.name for f in program.functions] == ["_calls_twice_twice"]
  # One copy per call site, each under its own names, in one block.
  assert len(program.entry.blocks) == 1
  for copy in ("_twice.x", "_twice.2.x"):
    assert program.var_type("_calls_twice_twice", copy) == INT[0]
  x = np.array([0, 3, -5], np.int32)
  for backend in ("local:eager", "pc:eager", "pc:xla"):
    np.testing.assert_array_equal(
        _calls_twice_twice(x, backend=backend), 4 * x + 2)
  _calls_twice_twice(x, backend="pc:eager")
  assert _calls_twice_twice.last_stats.steps == 1   # was 5: 2 calls + entry


def test_recursive_and_shared_branching_functions_are_not_inlined():
  assert [f.name for f in pipeline.typed_program(fib, INT).functions] == [
      "fib"]
  shared = pipeline.typed_program(_calls_halve_odd_twice, INT)
  assert [f.name for f in shared.functions] == ["_calls_halve_odd_twice",
                                                "_halve_odd"]
  x = np.array([0, 3, 6], np.int32)
  np.testing.assert_array_equal(
      _calls_halve_odd_twice(x, backend="pc:xla"), [0 + 0, 1 + 4, 6 + 3])


def test_inlining_fewer_vm_steps():
  x = np.array([5, 123456789], np.int32)
  digit_sum(x, backend="pc:eager")
  inlined = digit_sum.last_stats.steps
  untyped = pipeline.convert_program(digit_sum)
  typed = infer_types.infer_types(untyped, INT)
  plain = lower.lower_to_stack_program(tail_duplicate.tail_duplicate(typed))
  inlined_program = pipeline.stack_program(digit_sum, INT)
  assert len(inlined_program.blocks) < len(plain.blocks)
  # The entry, 3 iterations (9 digits, 3 per call) of one step, the exit.
  assert inlined == 5


def test_inline_needs_types():
  with pytest.raises(tab.IRError, match="typed"):
    inline.inline(pipeline.convert_program(digit_sum))


@tab.batch
def _plus_one(x):
  return x + 1


@tab.batch
def plus_two(x):
  return _plus_one(_plus_one(x))


PLUS_TWO_BEFORE = """\
def plus_two(x) -> _result:
  entry:
    _t0 = call _plus_one(x)
    _t1 = call _plus_one(_t0)
    _result = primitive(_t1) { _result = _t1 }
    return
  types: _result: int32[], _t0: int32[], _t1: int32[], x: int32[]
def _plus_one(x) -> _result:
  entry:
    _result = primitive(x) { _result = x + 1 }
    return
  types: _result: int32[], x: int32[]"""

PLUS_TWO_AFTER = """\
def plus_two(x) -> _result:
  entry:
    _plus_one.x = primitive(x) { copy }
    jump _plus_one.entry
  _plus_one.entry:
    _plus_one._result = primitive(_plus_one.x) { _result = x + 1 }
    jump _plus_one.done
  _plus_one.done:
    _t0 = primitive(_plus_one._result) { copy }
    _plus_one.2.x = primitive(_t0) { copy }
    jump _plus_one.2.entry
  _plus_one.2.entry:
    _plus_one.2._result = primitive(_plus_one.2.x) { _result = x + 1 }
    jump _plus_one.2.done
  _plus_one.2.done:
    _t1 = primitive(_plus_one.2._result) { copy }
    _result = primitive(_t1) { _result = _t1 }
    return
  types: _plus_one.2._result: int32[], _plus_one.2.x: int32[], _plus_one._result: int32[], _plus_one.x: int32[], _result: int32[], _t0: int32[], _t1: int32[], x: int32[]"""


def test_golden_inline():
  # Each call of the straight-line `_plus_one` becomes a copy of its
  # blocks under its own names, entered and left by jumps.
  before = infer_types.infer_types(pipeline.convert_program(plus_two), INT)
  assert str(before) == PLUS_TWO_BEFORE
  assert str(inline.inline(before)) == PLUS_TWO_AFTER
