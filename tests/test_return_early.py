"""Tests of merging early returns into the block that tests them
(`passes/return_early.py`)."""
import numpy as np
import tensorflow as tf

from pc_testing import INT, double_all, steps_on_graph_vm, typed_program
import example_programs as programs
import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.ir import ir2
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.passes import return_early


def test_early_return_runs_in_the_testing_step():
  # `if first < 0: return first` after a recursive call: the block testing
  # it also runs the return and the second call, each for its members.
  typed = typed_program(programs.checked_halves, INT * 2)
  before = pipeline.stack_program_before(typed, "return_early")
  after = return_early.return_early(before)
  assert "return if" not in str(before)
  assert ("    if checked_halves._cond6: checked_halves._result = "
          "primitive(checked_halves.first) { _result = first }\n"
          "    if not checked_halves._cond6: checked_halves._t10 = ") in str(after)
  assert "return if checked_halves._cond6, else pushbranch" in str(after)
  depth = np.array([0, 1, 2, 3, 4, 5, 5, 2, 4])
  x = np.array([5, -1, 0, 2, 20, 3, 40, 1, 9])
  got_before, steps_before = steps_on_graph_vm(before, depth, x)
  got_after, steps_after = steps_on_graph_vm(after, depth, x)
  want = [programs._checked_halves_oracle(d, v) for d, v in zip(depth, x)]  # pylint: disable=protected-access
  np.testing.assert_array_equal(got_before, want)
  np.testing.assert_array_equal(got_after, want)
  assert steps_after < 0.85 * steps_before


def test_early_return_on_the_else_side_and_speculation_safety():
  # find_first returns -1 when its loop test fails: the block testing it
  # runs the return for the members whose test is false ("return if not").
  # Its loop body, merged into that block, gathers v[i], which would raise
  # for i == 5 under pc:graph/pc:eager if it ran on the returning rows.
  program = pipeline.stack_program(programs.find_first, [
      types_lib.TensorType(tf.float32, (5,)),
      types_lib.TensorType(tf.float32, ())])
  assert "return if not find_first._cond1, else branch" in str(program)
  v = np.array([[0.1, 0.2, -0.3, 0.5, 0.9], [2, 0, 0, 0, 0],
                [0, 0, 0, 0, 3]], np.float32)
  threshold = np.array([1.2, 1.0, 1.0], np.float32)
  for backend in ("pc:eager", "pc:graph", "pc:xla"):
    np.testing.assert_array_equal(
        programs.find_first(v, threshold, backend=backend), [-1, 0, 4])


@tab.batch
def model_after_test(n):
  if n < 0:
    return n
  return double_all(n) + 1


def test_early_return_before_the_model_keeps_its_branch():
  # Merging the model's block into the test's would run the model under a
  # guard and split the members the schedule gathers for it.
  program = pipeline.stack_program(model_after_test, INT)
  assert "return if" not in str(program)
  n = np.array([-3, 0, 4])
  got, _ = steps_on_graph_vm(program, n)
  np.testing.assert_array_equal(got, [-3, 1, 9])


@tab.batch
def model_test_model(n):
  y = double_all(n)
  if y < 0:
    return y
  return double_all(y) + 1


def test_early_return_after_the_model_runs_the_next_model_call_guarded():
  # The testing block calls the model already, so the block after the test
  # may move into it: its model call runs guarded, for the members that
  # did not return, and the schedule still finds every model call in a
  # model block.
  typed = typed_program(model_test_model)
  before = pipeline.stack_program_before(typed, "return_early")
  after = return_early.return_early(before)
  assert "if not model_test_model._cond1: model_test_model._t5 = " \
         "batched_primitive" in str(after)
  n = np.array([-3, -1, 2, 5])
  got_before, steps_before = steps_on_graph_vm(before, n)
  got_after, steps_after = steps_on_graph_vm(after, n)
  np.testing.assert_array_equal(got_before, [-6, -2, 9, 21])
  np.testing.assert_array_equal(got_after, got_before)
  assert (steps_before, steps_after) == (3, 1)
  # The schedule sees a guarded model call as a model call.
  guarded = ir2.Block("b", tuple(op for op in after.blocks[0].ops
                                 if isinstance(op, ir2.Guarded)), ir2.Return())
  assert ir2.calls_batched_primitive(guarded)
  # Rows the model computed: pc:eager and pc:graph run the guarded call on
  # its 2 members only, after the first call on all 4; pc:xla runs both on
  # all 4 rows (no buckets up to `ALL_ROWS_UP_TO` rows).
  rows = {}
  for backend in ("pc:eager", "pc:graph", "pc:xla"):
    np.testing.assert_array_equal(model_test_model(n, backend=backend),
                                  got_before)
    rows[backend] = model_test_model.last_stats.batched_primitive_rows
    assert model_test_model.last_stats.batched_primitive_members == {
        4: 1, 2: 1}, backend
  assert rows == {"pc:eager": 6, "pc:graph": 6, "pc:xla": 8}
  # When every row returns early, no backend runs the guarded call: only
  # the first call's 4 rows are computed (pc:xla used to run its smallest
  # bucket anyway).
  negative = np.array([-3, -1, -2, -5])
  for backend in ("pc:eager", "pc:graph", "pc:xla"):
    np.testing.assert_array_equal(model_test_model(negative, backend=backend),
                                  2 * negative)
    assert model_test_model.last_stats.batched_primitive_rows == 4, backend
    # The guarded call was reached with no members: counted under 0.
    assert model_test_model.last_stats.batched_primitive_members == {
        4: 1, 0: 1}, backend
    assert model_test_model.last_stats.batched_primitive_calls == 1


@tab.batch
def model_chain(n):
  y = double_all(n)
  if y < 0:
    return y
  z = double_all(y) + 1
  if z > 20:
    return z
  w = double_all(z)
  if w > 60:
    return -w
  return w + 1


def _model_chain_oracle(n):
  y = 2 * n
  if y < 0:
    return y
  z = 2 * y + 1
  if z > 20:
    return z
  w = 2 * z
  return -w if w > 60 else w + 1


def test_a_chain_of_early_returns_runs_in_one_step():
  # Test, return or call the model again, test again, ...: every test
  # and every guarded model call runs in the first block's step.
  typed = typed_program(model_chain)
  before = pipeline.stack_program_before(typed, "return_early")
  after = return_early.return_early(before)
  ir2.verify_ir2(after, "return_early")
  assert len(after.blocks) == 1
  text = str(after)
  assert text.count("batched_primitive") == 3
  assert ("if model_chain._cond6.chain2.goes_on: model_chain._t10 = "
          "batched_primitive") in text
  n = np.arange(-3, 10)
  want = [_model_chain_oracle(i) for i in n]
  got_before, steps_before = steps_on_graph_vm(before, n)
  got_after, steps_after = steps_on_graph_vm(after, n)
  np.testing.assert_array_equal(got_before, want)
  np.testing.assert_array_equal(got_after, want)
  # Before: a step per block the members pass through.
  assert (steps_before, steps_after) == (6, 1)
  # Under XLA each guarded model call computes its members' rows only
  # (in buckets of the batch size halved, rounded up: 13, 7, 4, 1):
  # 13, 10 and 5 members here, computed as 13 + 13 + 7 rows; every
  # backend agrees.
  for backend in ("pc:eager", "pc:graph", "pc:xla"):
    np.testing.assert_array_equal(model_chain(n, backend=backend), want)
  assert model_chain.last_stats.batched_primitive_rows == 13 + 13 + 7


@tab.batch
def six_guard_clauses(n):
  if n == 0:
    return n
  n = n - 1
  if n == 0:
    return n + 10
  n = n - 1
  if n == 0:
    return n + 20
  n = n - 1
  if n == 0:
    return n + 30
  n = n - 1
  if n == 0:
    return n + 40
  n = n - 1
  if n == 0:
    return n + 50
  return n + 60


def test_a_chain_of_early_returns_is_merged_once(monkeypatch):
  # Only blocks still reached are merged: each later test of the chain
  # used to merge the rest of the chain itself before being dropped
  # (n**2 / 2 merges for n clauses: 2.1 s for 160 of them).
  typed = typed_program(six_guard_clauses)
  before = pipeline.stack_program_before(typed, "return_early")
  calls = []
  merge_once = return_early._merge_once
  monkeypatch.setattr(return_early, "_merge_once",
                      lambda *a: calls.append(a[0].label) or merge_once(*a))
  after = return_early.return_early(before)
  assert len(after.blocks) == 1
  # The first block merges its six tests, then finds none (34 calls
  # before, the chain's later blocks merging the rest of it).
  assert len(calls) == 7, calls
  n = np.arange(-1, 9)
  np.testing.assert_array_equal(
      six_guard_clauses(n, backend="pc:graph"),
      [six_guard_clauses.run_unbatched(i) for i in n])


@tab.batch
def stop_below(n):
  if n <= 0:
    return n
  r = stop_below(n - 1)
  if r < 0:
    return r
  return r + 1


STOP_BELOW_BEFORE = """\
program(stop_below.n) -> stop_below._result  [halt = 6; stacks with cached top]
  stacked:     -
  registers:   stop_below._result, stop_below.n, stop_below.r
  temporaries: stop_below._cond0, stop_below._cond6, stop_below._t4, stop_below._t5
  0 stop_below/entry:
    stop_below._cond0 = primitive(stop_below.n) { _cond0 = __tab_ops__.truthy(n <= 0) }
    branch stop_below._cond0 ? stop_below/then1 : stop_below/endif3
  1 stop_below/then1:
    stop_below._result = primitive(stop_below.n) { _result = n }
    return
  2 stop_below/endif3:
    stop_below._t4 = primitive(stop_below.n) { _t4 = n - 1 }
    stop_below.n = move(stop_below._t4)
    stop_below._cond0 = primitive(stop_below.n) { _cond0 = __tab_ops__.truthy(n <= 0) }
    pushbranch stop_below._cond0 ? stop_below/then1 : stop_below/endif3, return to stop_below/endif3.1
  3 stop_below/endif3.1:
    stop_below._t5 = move(stop_below._result)
    stop_below.r, stop_below._cond6 = primitive(stop_below._t5) { r = _t5; _cond6 = __tab_ops__.truthy(r < 0) }
    branch stop_below._cond6 ? stop_below/then7 : stop_below/endif9
  4 stop_below/then7:
    stop_below._result = primitive(stop_below.r) { _result = r }
    return
  5 stop_below/endif9:
    stop_below._result = primitive(stop_below.r) { _result = r + 1 }
    return"""

STOP_BELOW_AFTER = """\
program(stop_below.n) -> stop_below._result  [halt = 4; stacks with cached top]
  stacked:     -
  registers:   stop_below._result, stop_below.n, stop_below.r
  temporaries: stop_below._cond0, stop_below._cond6, stop_below._t4, stop_below._t5
  0 stop_below/entry:
    stop_below._cond0 = primitive(stop_below.n) { _cond0 = __tab_ops__.truthy(n <= 0) }
    branch stop_below._cond0 ? stop_below/then1 : stop_below/endif3
  1 stop_below/then1:
    stop_below._result = primitive(stop_below.n) { _result = n }
    return
  2 stop_below/endif3:
    stop_below._t4 = primitive(stop_below.n) { _t4 = n - 1 }
    stop_below.n = move(stop_below._t4)
    stop_below._cond0 = primitive(stop_below.n) { _cond0 = __tab_ops__.truthy(n <= 0) }
    pushbranch stop_below._cond0 ? stop_below/then1 : stop_below/endif3, return to stop_below/endif3.1
  3 stop_below/endif3.1:
    stop_below._t5 = move(stop_below._result)
    stop_below.r, stop_below._cond6 = primitive(stop_below._t5) { r = _t5; _cond6 = __tab_ops__.truthy(r < 0) }
    if stop_below._cond6: stop_below._result = primitive(stop_below.r) { _result = r }
    if not stop_below._cond6: stop_below._result = primitive(stop_below.r) { _result = r + 1 }
    return"""


def test_golden_return_early():
  # The test after the recursive call (`endif3.1`) and both of its arms
  # become one block: each arm's ops guarded by the condition.
  before = pipeline.stack_program_before(typed_program(stop_below),
                                         "return_early")
  assert str(before) == STOP_BELOW_BEFORE
  assert str(return_early.return_early(before)) == STOP_BELOW_AFTER
