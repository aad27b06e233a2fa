"""Tests of lowering IR-1 to the stack program, IR-2 (`passes/lower.py`),
and of IR-2's printing and verification (paper section 3)."""
import numpy as np
import pytest
import tensorflow as tf

from pc_testing import (
    INT, count_ops, fib, fib_np, run_on_graph_vm, sum_to, typed_program)
import tfp_autobatch as tab
from tfp_autobatch import errors
from tfp_autobatch import pipeline
from tfp_autobatch.ir import ir2
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.passes import lower


@tab.batch
def count_down(n):
  total = 0
  while n > 0:
    total += n
    n -= 1
  return total


FIB_IR2 = """\
program(fib.n) -> fib._result  [halt = 5; stacks with cached top]
  stacked:     fib._t5, fib.n
  registers:   fib._result
  temporaries: fib._cond0, fib._t4, fib._t6, fib._t7
  0 fib/entry:
    fib._cond0 = primitive(fib.n) { _cond0 = __tab_ops__.truthy(n <= 1) }
    branch fib._cond0 ? fib/then1 : fib/endif3
  1 fib/then1:
    fib._result = primitive(fib.n) { _result = n }
    return
  2 fib/endif3:
    fib._t4 = primitive(fib.n) { _t4 = n - 1 }
    push fib.n
    fib.n = move(fib._t4)
    fib._cond0 = primitive(fib.n) { _cond0 = __tab_ops__.truthy(n <= 1) }
    pushbranch fib._cond0 ? fib/then1 : fib/endif3, return to fib/endif3.1
  3 fib/endif3.1:
    fib._t5 = move(fib._result)
    pop fib.n
    fib._t6 = primitive(fib.n) { _t6 = n - 2 }
    push fib._t5
    fib.n = move(fib._t6)
    fib._cond0 = primitive(fib.n) { _cond0 = __tab_ops__.truthy(n <= 1) }
    pushbranch fib._cond0 ? fib/then1 : fib/endif3, return to fib/endif3.1.2
  4 fib/endif3.1.2:
    fib._t7 = move(fib._result)
    pop fib._t5
    fib._result = primitive(fib._t5, fib._t7) { _result = _t5 + _t7 }
    return"""


def test_golden_fib():
  assert str(pipeline.stack_program(fib, INT)) == FIB_IR2


LOOP_IR2 = """\
program(count_down.n) -> count_down._result  [halt = 3; stacks with cached top]
  stacked:     -
  registers:   count_down._result, count_down.n, count_down.total
  temporaries: count_down._cond1
  0 count_down/entry:
    count_down.total = primitive() { total = 0 }
    count_down._cond1 = primitive(count_down.n) { _cond1 = __tab_ops__.truthy(n > 0) }
    branch count_down._cond1 ? count_down/body2 : count_down/endloop3
  1 count_down/body2:
    count_down.total, count_down.n = primitive(count_down.total, count_down.n) { total += n; n -= 1 }
    count_down._cond1 = primitive(count_down.n) { _cond1 = __tab_ops__.truthy(n > 0) }
    branch count_down._cond1 ? count_down/body2 : count_down/endloop3
  2 count_down/endloop3:
    count_down._result = primitive(count_down.total) { _result = total }
    return"""


def test_golden_loop_has_no_variable_stacks():
  program = pipeline.stack_program(count_down, INT)
  assert program.stacked == frozenset()
  assert str(program) == LOOP_IR2


def test_ir_level_2_through_the_api():
  fib(np.array([3, 4], np.int32), backend="pc:graph")
  assert str(fib.ir(level=2)) == FIB_IR2


def test_opt1_per_variable_caller_saves():
  naive = lower.lower_to_stack_program(typed_program(fib), save="all")
  live = lower.lower_to_stack_program(typed_program(fib), save="live")
  assert "push fib._cond0" in str(naive)        # saves every variable
  assert "push fib._cond0" not in str(live)     # saves only live ones
  assert count_ops(live, ir2.Push) == 2 < count_ops(naive, ir2.Push)
  n = np.arange(8)
  want = [fib_np(i) for i in n]
  np.testing.assert_array_equal(run_on_graph_vm(naive, n), want)
  np.testing.assert_array_equal(run_on_graph_vm(live, n), want)


def test_verify_rejects_a_guarded_pop():
  # The VM pops only for all of a block's members (pops follow calls).
  t = types_lib.TensorType(tf.int32, ())
  block = ir2.Block("f/entry", (
      ir2.Guarded("f.c", True, ir2.Pop("f.n")),), ir2.Return())
  program = ir2.Program((block,), ("f.n",), "f.n",
                        {"f.n": t, "f.c": types_lib.TensorType(tf.bool, ())},
                        {"f": "f.n"})
  with pytest.raises(errors.IRError, match="guarded op"):
    ir2.verify_ir2(program, "test")


# -- golden: typed IR-1 in, IR-2 out.

SUM_TO_IR1 = """\
def sum_to(n) -> _result:
  entry:
    _cond0 = primitive(n) { _cond0 = __tab_ops__.truthy(n <= 0) }
    branch _cond0 ? then1 : endif3
  then1:
    _result = primitive() { _result = 0 }
    return
  endif3:
    _t4 = primitive(n) { _t4 = n - 1 }
    _t5 = call sum_to(_t4)
    _result = primitive(n, _t5) { _result = n + _t5 }
    return
  types: _cond0: bool[], _result: int32[], _t4: int32[], _t5: int32[], n: int32[]"""

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


def test_golden_lower():
  # Each call becomes a push of what is live across it, a move into the
  # callee's parameter and a pushjump to its entry; the continuation
  # (`endif3.1`) moves the result out and pops. Every variable is a
  # register or a stack until the stack optimisations.
  typed = typed_program(sum_to)
  assert str(typed) == SUM_TO_IR1
  assert str(lower.lower_to_stack_program(typed)) == SUM_TO_LOWERED
