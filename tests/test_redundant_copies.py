"""Tests of dropping redundant copies from IR-2
(`passes/redundant_copies.py`)."""
import numpy as np
import pytest

from pc_testing import INT, run_on_graph_vm, typed_program
import example_programs as programs
import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.ir import ir2
from tfp_autobatch.passes import redundant_copies


def _before_copies_dropped(fn):
  """The IR-2 program of `fn(int, int)` from every pass up to the one that
  drops redundant copies."""
  return pipeline.stack_program_before(typed_program(fn, INT * 2),
                                       "drop_redundant_copies")


def test_stack_program_before_a_pass_is_what_that_pass_receives():
  typed = typed_program(programs.checked_halves, INT * 2)
  before = pipeline.stack_program_before(typed, "drop_redundant_copies")
  assert (str(redundant_copies.drop_redundant_copies(before))
          == str(pipeline.stack_program_of(typed)))
  with pytest.raises(ValueError, match="no IR-2 pass 'inline'.*return_early"):
    pipeline.stack_program_before(typed, "inline")


def _writes_of(program, label, var):
  """How many ops of block `label` write `var`."""
  block = next(b for b in program.blocks if b.label == label)
  return sum(var in ir2.writes(op) for op in block.ops)


# checked_halves returns `first`, what its own call has just returned: the
# result register already holds it, so the return's copy goes (under pc:xla
# every write is a row of the block's bank write). result_or_changed returns
# its call's result `y` (a copy: dropped), or `y` after `y = y - 3` in the
# same code as `z = y` (a new value: kept).
@pytest.mark.parametrize("name, writes_before, writes_after, n, x", [
    ("checked_halves", 1, 0, [0, 1, 3, 5, 2, 4], [4, 0, 2, 40, -2, 9]),
    ("result_or_changed", 2, 1, [0, 1, 2, 3, 4, 5, 6, 6, 3],
     [-5, 40, 21, 0, 7, -3, 12, 30, 19]),
])
def test_returning_the_callees_result_writes_no_copy_of_it(
    name, writes_before, writes_after, n, x):
  program = programs.PROGRAMS_BY_NAME[name]
  before = _before_copies_dropped(program.fn)
  after = redundant_copies.drop_redundant_copies(before)
  label, result = f"{name}/endif3.1", f"{name}._result"
  assert _writes_of(before, label, result) == writes_before
  assert _writes_of(after, label, result) == writes_after
  want = [program.oracle(a, b) for a, b in zip(n, x)]
  np.testing.assert_array_equal(run_on_graph_vm(before, n, x), want)
  np.testing.assert_array_equal(run_on_graph_vm(after, n, x), want)


@tab.batch
def capped(n):
  if n <= 0:
    return n
  y = capped(n - 1)
  if y > 5:
    return y
  return y + 1


CAPPED_BEFORE = """\
program(capped.n) -> capped._result  [halt = 4; stacks with cached top]
  stacked:     -
  registers:   capped._result, capped.n, capped.y
  temporaries: capped._cond0, capped._cond6, capped._t4, capped._t5
  0 capped/entry:
    capped._cond0 = primitive(capped.n) { _cond0 = __tab_ops__.truthy(n <= 0) }
    branch capped._cond0 ? capped/then1 : capped/endif3
  1 capped/then1:
    capped._result = primitive(capped.n) { _result = n }
    return
  2 capped/endif3:
    capped._t4 = primitive(capped.n) { _t4 = n - 1 }
    capped.n = move(capped._t4)
    capped._cond0 = primitive(capped.n) { _cond0 = __tab_ops__.truthy(n <= 0) }
    pushbranch capped._cond0 ? capped/then1 : capped/endif3, return to capped/endif3.1
  3 capped/endif3.1:
    capped._t5 = move(capped._result)
    capped.y, capped._cond6 = primitive(capped._t5) { y = _t5; _cond6 = __tab_ops__.truthy(y > 5) }
    if capped._cond6: capped._result = primitive(capped.y) { _result = y }
    if not capped._cond6: capped._result = primitive(capped.y) { _result = y + 1 }
    return"""

CAPPED_AFTER = """\
program(capped.n) -> capped._result  [halt = 4; stacks with cached top]
  stacked:     -
  registers:   capped._result, capped.n, capped.y
  temporaries: capped._cond0, capped._cond6, capped._t4, capped._t5
  0 capped/entry:
    capped._cond0 = primitive(capped.n) { _cond0 = __tab_ops__.truthy(n <= 0) }
    branch capped._cond0 ? capped/then1 : capped/endif3
  1 capped/then1:
    capped._result = primitive(capped.n) { _result = n }
    return
  2 capped/endif3:
    capped._t4 = primitive(capped.n) { _t4 = n - 1 }
    capped.n = move(capped._t4)
    capped._cond0 = primitive(capped.n) { _cond0 = __tab_ops__.truthy(n <= 0) }
    pushbranch capped._cond0 ? capped/then1 : capped/endif3, return to capped/endif3.1
  3 capped/endif3.1:
    capped._t5 = move(capped._result)
    capped.y, capped._cond6 = primitive(capped._t5) { y = _t5; _cond6 = __tab_ops__.truthy(y > 5) }
    if not capped._cond6: capped._result = primitive(capped.y) { _result = y + 1 }
    return"""


def test_golden_drop_redundant_copies():
  # `if capped._cond6: capped._result = y` copies the callee's result,
  # which the result register already holds: it goes.
  before = pipeline.stack_program_before(typed_program(capped),
                                         "drop_redundant_copies")
  assert str(before) == CAPPED_BEFORE
  assert str(redundant_copies.drop_redundant_copies(before)) == CAPPED_AFTER
