"""IR-1 passes other than type inference."""
import numpy as np
import pytest
import tensorflow as tf

import example_programs
import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.passes import infer_types
from tfp_autobatch.passes import inline
from tfp_autobatch.passes import lower
from tfp_autobatch.passes import tail_duplicate

INT = [types_lib.TensorType(tf.int32, ())]
collatz = example_programs.PROGRAMS_BY_NAME["collatz_steps"].fn   # a while around an if


def test_tail_duplication_copies_join_and_loop_header_into_predecessors():
  # On the converted program: the pipeline makes collatz's `if` a select
  # first (`if_to_select`), which leaves no join to copy.
  program = tail_duplicate.tail_duplicate(pipeline.convert_program(collatz))
  labels = [b.label for b in program.entry.blocks]
  # The `if` join (`endif`) and the loop header (`while`) are gone: each
  # branch of the `if` now ends by testing the loop condition itself.
  assert not [l for l in labels if l.startswith(("endif", "while"))], labels
  branches = [b for b in program.entry.blocks
              if isinstance(b.terminator, ir1.Branch)]
  assert len(branches) == 4    # entry, body, then, else
  x = np.array([1, 7, 27, 97], np.int32)
  for backend in ("local:eager", "pc:xla"):
    np.testing.assert_array_equal(collatz(x, backend=backend),
                                  [0, 16, 111, 118])


def test_tail_duplication_removes_blocks_within_its_growth_bound():
  before = pipeline.convert_program(collatz)
  after = tail_duplicate.tail_duplicate(before)
  assert len(after.entry.blocks) < len(before.entry.blocks)
  grown = sum(len(b.ops) for b in after.entry.blocks)
  assert grown <= tail_duplicate.MAX_GROWTH * sum(
      len(b.ops) + 1 for b in before.entry.blocks)



@tab.batch
def _six_arms(n):
  if n == 0:
    y = n + 1
  elif n == 1:
    y = n * 3
  elif n == 2:
    y = n - 7
  elif n == 3:
    y = n * n
  elif n == 4:
    y = n + 9
  else:
    y = n
  return y + 1


def test_tail_duplication_counts_predecessors_once_a_round(monkeypatch):
  # Recounted at every jump they made the pass quadratic in blocks (1 s
  # for an `if` of 160 arms); now counted once a round and kept up to
  # date, with the same result.
  before = pipeline.convert_program(_six_arms)
  counts = []
  count = tail_duplicate._predecessors
  monkeypatch.setattr(tail_duplicate, "_predecessors",
                      lambda blocks: counts.append(1) or count(blocks))
  after = tail_duplicate.tail_duplicate(before)
  assert len(after.entry.blocks) < len(before.entry.blocks)
  assert len(counts) == 4, len(counts)   # rounds (20 before: a jump each)
  n = np.arange(-1, 7, dtype=np.int32)
  np.testing.assert_array_equal(_six_arms(n, backend="pc:graph"),
                                [_six_arms.run_unbatched(i) for i in n])

# -- inlining --------------------------------------------------------------------

digit_sum = example_programs.PROGRAMS_BY_NAME["digit_sum"].fn     # calls a helper once
fib = example_programs.PROGRAMS_BY_NAME["fib"].fn                 # recursive


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
