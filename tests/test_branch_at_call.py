"""Tests of running a callee's entry test at its call sites
(`passes/branch_at_call.py`)."""
import numpy as np

from pc_testing import (
    INT, fib, fib_np, model_first, steps_on_graph_vm, sum_to, typed_program)
import example_programs as programs
from tfp_autobatch import pipeline
from tfp_autobatch.passes import branch_at_call


def test_callers_run_the_callee_entry_test():
  before = pipeline.stack_program_before(typed_program(fib),
                                         "branch_at_call_sites")
  after = branch_at_call.branch_at_call_sites(before)
  assert "pushjump" in str(before) and "pushjump" not in str(after)
  assert ("    fib.n = move(fib._t4)\n"
          "    fib._cond0 = primitive(fib.n) { _cond0 = __tab_ops__.truthy(n <= 1) }\n"
          "    pushbranch fib._cond0 ? fib/then1 : fib/endif3, "
          "return to fib/endif3.1\n") in str(after)
  n = np.arange(12)
  got_before, steps_before = steps_on_graph_vm(before, n)
  got_after, steps_after = steps_on_graph_vm(after, n)
  np.testing.assert_array_equal(got_before, [fib_np(i) for i in n])
  np.testing.assert_array_equal(got_after, got_before)
  # Every call but the first skips the step of fib/entry.
  assert steps_after < 0.8 * steps_before


def test_callee_entry_reached_only_by_calls_is_dropped():
  program = pipeline.stack_program(programs.is_even, INT)
  labels = [b.label for b in program.blocks]
  assert "is_even/entry" in labels          # the program's entry
  assert "is_odd/entry" not in labels       # every caller runs its test
  n = np.arange(9)
  got, _ = steps_on_graph_vm(program, n)
  np.testing.assert_array_equal(got, n % 2 == 0)


def test_callee_entry_calling_the_model_keeps_its_step():
  # The schedule gathers members at blocks that call a batched primitive;
  # running one inside every caller's step would split them.
  program = pipeline.stack_program(model_first, INT)
  assert "pushjump model_first/entry" in str(program)
  n = np.array([0, 1, 4])
  got, _ = steps_on_graph_vm(program, n)
  np.testing.assert_array_equal(got, [0, 2, 20])


SUM_TO_BEFORE = """\
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

SUM_TO_AFTER = """\
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
    sum_to._cond0 = primitive(sum_to.n) { _cond0 = __tab_ops__.truthy(n <= 0) }
    pushbranch sum_to._cond0 ? sum_to/then1 : sum_to/endif3, return to sum_to/endif3.1
  3 sum_to/endif3.1:
    sum_to._t5 = move(sum_to._result)
    pop sum_to.n
    sum_to._result = primitive(sum_to.n, sum_to._t5) { _result = n + _t5 }
    return"""


def test_golden_branch_at_call_sites():
  # The call's `pushjump sum_to/entry` becomes the entry's test and a
  # `pushbranch` to its two targets.
  before = pipeline.stack_program_before(typed_program(sum_to),
                                         "branch_at_call_sites")
  assert str(before) == SUM_TO_BEFORE
  assert str(branch_at_call.branch_at_call_sites(before)) == SUM_TO_AFTER
