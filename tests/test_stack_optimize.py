"""Tests of the stack optimisations of IR-2 (`passes/stack_optimize.py`):
one test per optimisation, its effect on the printed program, and the
results do not change."""
import numpy as np

from pc_testing import (
    INT, count_ops, fib, fib_np, run_on_graph_vm, sum_to, typed_program)
import example_programs as programs
import tfp_autobatch as tab
from tfp_autobatch.ir import ir2
from tfp_autobatch.passes import lower
from tfp_autobatch.passes import stack_optimize


@tab.batch
def tree(height, depth):
  if height == 0:
    return depth
  left = tree(height - 1, depth + 1)
  right = tree(height - 1, depth + 1)
  return depth + left + right


@tab.batch
def square(x):
  # Two blocks (a straight-line helper would be inlined at each call).
  if x < 0:
    x = -x
  return x * x


@tab.batch
def sum_squares(n):
  a = square(n)
  b = square(n + 1)
  return a + b + n


def _tree_np(h, d):
  return d if h == 0 else d + 2 * _tree_np(h - 1, d + 1)


def test_opt2_temporaries():
  before = lower.lower_to_stack_program(typed_program(fib))
  after = stack_optimize.find_temporaries(before)
  assert "temporaries: -" in str(before)
  assert ("temporaries: fib._cond0, fib._t4, fib._t6, fib._t7"
          in str(after))
  n = np.arange(7)
  np.testing.assert_array_equal(run_on_graph_vm(before, n),
                                run_on_graph_vm(after, n))


def test_opt3_no_stack_without_recursion():
  before = lower.lower_to_stack_program(typed_program(sum_squares))
  after = stack_optimize.drop_unclobbered_saves(before)
  assert "push sum_squares.n" in str(before)
  assert "stacked:     sum_squares.a, sum_squares.n" in str(before)
  assert "stacked:     -" in str(after)
  assert count_ops(after, ir2.Push) == count_ops(after, ir2.Pop) == 0
  n = np.arange(-3, 5)
  want = n * n + (n + 1) * (n + 1) + n
  np.testing.assert_array_equal(run_on_graph_vm(before, n), want)
  np.testing.assert_array_equal(run_on_graph_vm(after, n), want)


def test_opt3_a_parameter_only_passed_on_is_neither_moved_nor_saved():
  # `k` is live across scaled_fib's first recursive call (the second one
  # reads it), but every call passes it on unchanged: the calls move
  # nothing into it, and no callee assigns it, so it needs no stack.
  scaled_fib = programs.scaled_fib
  before = lower.lower_to_stack_program(typed_program(scaled_fib, INT * 2))
  after = stack_optimize.drop_unclobbered_saves(before)
  assert "scaled_fib.k = " not in str(before)
  assert "push scaled_fib.k" in str(before)
  assert "scaled_fib.k" in before.stacked
  assert "scaled_fib.k" not in after.stacked
  assert "push scaled_fib.k" not in str(after)
  n, k = np.arange(9), np.array([1, -2, 3, 0, 2, -1, 3, 1, -3])
  want = [fib_np(a) * b for a, b in zip(n, k)]
  np.testing.assert_array_equal(run_on_graph_vm(before, n, k), want)
  np.testing.assert_array_equal(run_on_graph_vm(after, n, k), want)


def test_opt3_keeps_saving_a_parameter_some_call_changes():
  # `depth + 1` goes into the callee's `depth`: a call assigns it, so the
  # caller's value must be saved around the first call.
  program = stack_optimize.drop_unclobbered_saves(
      lower.lower_to_stack_program(typed_program(tree, INT * 2)))
  assert "tree.depth" in program.stacked
  h, d = np.array([0, 1, 2, 3, 4]), np.array([0, 2, 1, 0, 3])
  np.testing.assert_array_equal(run_on_graph_vm(program, h, d),
                                [_tree_np(a, b) for a, b in zip(h, d)])


def test_opt4_cached_top():
  before = stack_optimize.find_temporaries(
      stack_optimize.drop_unclobbered_saves(
          lower.lower_to_stack_program(typed_program(fib))))
  after = stack_optimize.cache_stack_tops(before)
  assert "stacks with top in the stack" in str(before)
  assert "stacks with cached top" in str(after)
  n = np.arange(9)
  want = [fib_np(i) for i in n]
  np.testing.assert_array_equal(run_on_graph_vm(before, n), want)
  np.testing.assert_array_equal(run_on_graph_vm(after, n), want)


def test_opt5_pop_push_becomes_update():
  two_ints = INT * 2
  before = stack_optimize.drop_unclobbered_saves(
      lower.lower_to_stack_program(typed_program(tree, two_ints)))
  after = stack_optimize.fuse_pop_push(before)
  assert "update" not in str(before)
  assert "    update tree.depth\n" in str(after)
  assert count_ops(after, ir2.Push) == count_ops(before, ir2.Push) - 1
  h, d = np.array([0, 1, 2, 3, 4]), np.array([0, 2, 1, 0, 3])
  want = [_tree_np(a, b) for a, b in zip(h, d)]
  np.testing.assert_array_equal(run_on_graph_vm(before, h, d), want)
  np.testing.assert_array_equal(run_on_graph_vm(after, h, d), want)


SUM_TO_LOWERED = """\
program(sum_to.n) -> sum_to._result  [halt = 4; stacks with top in the stack]
  stacked:     sum_to.n
  registers:   sum_to._cond0, sum_to._result, sum_to._t4, sum_to._t5
  temporaries: -
  0 sum_to/entry:
    sum_to._cond0 = primitive(sum_to.n) { _cond0 = __tab_ops__.truthy(n <= 0) }
    branch sum_to._cond0 ? sum_to/then1 : sum_to/endif3
  1 sum_to/then1:
    sum_to._result = primitive() { _result = 0 }
    return
  2 sum_to/endif3:
    sum_to._t4 = primitive(sum_to.n) { _t4 = n - 1 }
    push sum_to.n
    sum_to.n = move(sum_to._t4)
    pushjump sum_to/entry, return to sum_to/endif3.1
  3 sum_to/endif3.1:
    sum_to._t5 = move(sum_to._result)
    pop sum_to.n
    sum_to._result = primitive(sum_to.n, sum_to._t5) { _result = n + _t5 }
    return"""

SUM_TO_OPTIMIZED = """\
program(sum_to.n) -> sum_to._result  [halt = 4; stacks with cached top]
  stacked:     sum_to.n
  registers:   sum_to._result
  temporaries: sum_to._cond0, sum_to._t4, sum_to._t5
  0 sum_to/entry:
    sum_to._cond0 = primitive(sum_to.n) { _cond0 = __tab_ops__.truthy(n <= 0) }
    branch sum_to._cond0 ? sum_to/then1 : sum_to/endif3
  1 sum_to/then1:
    sum_to._result = primitive() { _result = 0 }
    return
  2 sum_to/endif3:
    sum_to._t4 = primitive(sum_to.n) { _t4 = n - 1 }
    push sum_to.n
    sum_to.n = move(sum_to._t4)
    pushjump sum_to/entry, return to sum_to/endif3.1
  3 sum_to/endif3.1:
    sum_to._t5 = move(sum_to._result)
    pop sum_to.n
    sum_to._result = primitive(sum_to.n, sum_to._t5) { _result = n + _t5 }
    return"""


def test_golden_stack_optimize():
  # `n` is saved across the call (the call assigns it): it stays stacked,
  # its top cached in a register. The values no block reads after its own
  # become temporaries.
  before = lower.lower_to_stack_program(typed_program(sum_to))
  assert str(before) == SUM_TO_LOWERED
  assert str(stack_optimize.optimize(before)) == SUM_TO_OPTIMIZED
