"""Tests of program-counter autobatching: IR-2, lowering, the stack
optimisations and the VM (paper section 3)."""
import collections
import os
import re

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

import example_programs as programs
import tfp_autobatch as tab
from tfp_autobatch import errors
from tfp_autobatch import pipeline
from tfp_autobatch.ir import ir2
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.passes import branch_at_call
from tfp_autobatch.passes import lower
from tfp_autobatch.passes import redundant_copies
from tfp_autobatch.passes import return_early
from tfp_autobatch.passes import stack_optimize
from tfp_autobatch.runtime import batched_primitive_calls
from tfp_autobatch.runtime import block_runner
from tfp_autobatch.runtime import pc_vm
from tfp_autobatch.runtime import pfor_conditions
from tfp_autobatch.runtime import schedule as schedule_lib
from tfp_autobatch.runtime import vectorize

os.environ.setdefault("TFP_AUTOBATCH_DEBUG", "1")
os.environ.setdefault("TFP_AUTOBATCH_STRICT_PFOR", "1")

INT = [types_lib.TensorType(tf.int32, ())]


@tab.batch
def fib(n):
  if n <= 1:
    return n
  return fib(n - 1) + fib(n - 2)


@tab.batch
def count_down(n):
  total = 0
  while n > 0:
    total += n
    n -= 1
  return total


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


def _fib_np(n):
  a, b = 0, 1
  for _ in range(n):
    a, b = b, a + b
  return a


def _tree_np(h, d):
  return d if h == 0 else d + 2 * _tree_np(h - 1, d + 1)


def _typed(fn, arg_types=INT):
  return pipeline.typed_program(fn, arg_types)


def _run(program, *args, depth=16):
  """Runs an IR-2 program on the graph VM."""
  args = [tf.constant(a, tf.int32) for a in args]
  return pc_vm.PcVmRuntime(program, depth, mode="graph").run(args, None).numpy()


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


# -- one test per optimisation: its effect on the printed program, and the
#    results do not change.


def _count(program, kind):
  return sum(isinstance(op, kind) for b in program.blocks for op in b.ops)


def test_opt1_per_variable_caller_saves():
  naive = lower.lower_to_stack_program(_typed(fib), save="all")
  live = lower.lower_to_stack_program(_typed(fib), save="live")
  assert "push fib._cond0" in str(naive)        # saves every variable
  assert "push fib._cond0" not in str(live)     # saves only live ones
  assert _count(live, ir2.Push) == 2 < _count(naive, ir2.Push)
  n = np.arange(8)
  want = [_fib_np(i) for i in n]
  np.testing.assert_array_equal(_run(naive, n), want)
  np.testing.assert_array_equal(_run(live, n), want)


def test_opt2_temporaries():
  before = lower.lower_to_stack_program(_typed(fib))
  after = stack_optimize.find_temporaries(before)
  assert "temporaries: -" in str(before)
  assert ("temporaries: fib._cond0, fib._t4, fib._t6, fib._t7"
          in str(after))
  n = np.arange(7)
  np.testing.assert_array_equal(_run(before, n), _run(after, n))


def test_opt3_no_stack_without_recursion():
  before = lower.lower_to_stack_program(_typed(sum_squares))
  after = stack_optimize.drop_unclobbered_saves(before)
  assert "push sum_squares.n" in str(before)
  assert "stacked:     sum_squares.a, sum_squares.n" in str(before)
  assert "stacked:     -" in str(after)
  assert _count(after, ir2.Push) == _count(after, ir2.Pop) == 0
  n = np.arange(-3, 5)
  want = n * n + (n + 1) * (n + 1) + n
  np.testing.assert_array_equal(_run(before, n), want)
  np.testing.assert_array_equal(_run(after, n), want)


def test_opt3_a_parameter_only_passed_on_is_neither_moved_nor_saved():
  # `k` is live across scaled_fib's first recursive call (the second one
  # reads it), but every call passes it on unchanged: the calls move
  # nothing into it, and no callee assigns it, so it needs no stack.
  scaled_fib = programs.scaled_fib
  before = lower.lower_to_stack_program(_typed(scaled_fib, INT * 2))
  after = stack_optimize.drop_unclobbered_saves(before)
  assert "scaled_fib.k = " not in str(before)
  assert "push scaled_fib.k" in str(before)
  assert "scaled_fib.k" in before.stacked
  assert "scaled_fib.k" not in after.stacked
  assert "push scaled_fib.k" not in str(after)
  n, k = np.arange(9), np.array([1, -2, 3, 0, 2, -1, 3, 1, -3])
  want = [_fib_np(a) * b for a, b in zip(n, k)]
  np.testing.assert_array_equal(_run(before, n, k), want)
  np.testing.assert_array_equal(_run(after, n, k), want)


def test_opt3_keeps_saving_a_parameter_some_call_changes():
  # `depth + 1` goes into the callee's `depth`: a call assigns it, so the
  # caller's value must be saved around the first call.
  program = stack_optimize.drop_unclobbered_saves(
      lower.lower_to_stack_program(_typed(tree, INT * 2)))
  assert "tree.depth" in program.stacked
  h, d = np.array([0, 1, 2, 3, 4]), np.array([0, 2, 1, 0, 3])
  np.testing.assert_array_equal(_run(program, h, d),
                                [_tree_np(a, b) for a, b in zip(h, d)])


def _before_copies_dropped(fn):
  """The IR-2 program of `fn(int, int)` from every pass up to the one that
  drops redundant copies."""
  return pipeline.stack_program_before(_typed(fn, INT * 2),
                                       "drop_redundant_copies")


def test_stack_program_before_a_pass_is_what_that_pass_receives():
  typed = _typed(programs.checked_halves, INT * 2)
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
  np.testing.assert_array_equal(_run(before, n, x), want)
  np.testing.assert_array_equal(_run(after, n, x), want)


def test_opt4_cached_top():
  before = stack_optimize.find_temporaries(stack_optimize.drop_unclobbered_saves(
      lower.lower_to_stack_program(_typed(fib))))
  after = stack_optimize.cache_stack_tops(before)
  assert "stacks with top in the stack" in str(before)
  assert "stacks with cached top" in str(after)
  n = np.arange(9)
  want = [_fib_np(i) for i in n]
  np.testing.assert_array_equal(_run(before, n), want)
  np.testing.assert_array_equal(_run(after, n), want)


def test_opt5_pop_push_becomes_update():
  two_ints = INT * 2
  before = stack_optimize.drop_unclobbered_saves(
      lower.lower_to_stack_program(_typed(tree, two_ints)))
  after = stack_optimize.fuse_pop_push(before)
  assert "update" not in str(before)
  assert "    update tree.depth\n" in str(after)
  assert _count(after, ir2.Push) == _count(before, ir2.Push) - 1
  h, d = np.array([0, 1, 2, 3, 4]), np.array([0, 2, 1, 0, 3])
  want = [_tree_np(a, b) for a, b in zip(h, d)]
  np.testing.assert_array_equal(_run(before, h, d), want)
  np.testing.assert_array_equal(_run(after, h, d), want)


def _steps(program, *args, depth=16):
  """(results, VM steps) of an IR-2 program on the graph VM."""
  runtime = pc_vm.PcVmRuntime(program, depth, mode="graph")
  got = runtime.run([tf.constant(a, tf.int32) for a in args], None)
  return got.numpy(), runtime.stats.steps


def test_callers_run_the_callee_entry_test():
  before = pipeline.stack_program_before(_typed(fib), "branch_at_call_sites")
  after = branch_at_call.branch_at_call_sites(before)
  assert "pushjump" in str(before) and "pushjump" not in str(after)
  assert ("    fib.n = move(fib._t4)\n"
          "    fib._cond0 = primitive(fib.n) { _cond0 = __tab_ops__.truthy(n <= 1) }\n"
          "    pushbranch fib._cond0 ? fib/then1 : fib/endif3, "
          "return to fib/endif3.1\n") in str(after)
  n = np.arange(12)
  got_before, steps_before = _steps(before, n)
  got_after, steps_after = _steps(after, n)
  np.testing.assert_array_equal(got_before, [_fib_np(i) for i in n])
  np.testing.assert_array_equal(got_after, got_before)
  # Every call but the first skips the step of fib/entry.
  assert steps_after < 0.8 * steps_before


def test_early_return_runs_in_the_testing_step():
  # `if first < 0: return first` after a recursive call: the block testing
  # it also runs the return and the second call, each for its members.
  typed = _typed(programs.checked_halves, INT * 2)
  before = pipeline.stack_program_before(typed, "return_early")
  after = return_early.return_early(before)
  assert "return if" not in str(before)
  assert ("    if checked_halves._cond6: checked_halves._result = "
          "primitive(checked_halves.first) { _result = first }\n"
          "    if not checked_halves._cond6: checked_halves._t10 = ") in str(after)
  assert "return if checked_halves._cond6, else pushbranch" in str(after)
  depth = np.array([0, 1, 2, 3, 4, 5, 5, 2, 4])
  x = np.array([5, -1, 0, 2, 20, 3, 40, 1, 9])
  got_before, steps_before = _steps(before, depth, x)
  got_after, steps_after = _steps(after, depth, x)
  want = [programs._checked_halves_oracle(d, v) for d, v in zip(depth, x)]  # pylint: disable=protected-access
  np.testing.assert_array_equal(got_before, want)
  np.testing.assert_array_equal(got_after, want)
  assert steps_after < 0.85 * steps_before


def test_callee_entry_reached_only_by_calls_is_dropped():
  program = pipeline.stack_program(programs.is_even, INT)
  labels = [b.label for b in program.blocks]
  assert "is_even/entry" in labels          # the program's entry
  assert "is_odd/entry" not in labels       # every caller runs its test
  n = np.arange(9)
  got, _ = _steps(program, n)
  np.testing.assert_array_equal(got, n % 2 == 0)


@tab.batched_primitive
def _double_all(x):
  return 2 * x


@tab.batch
def model_first(n):
  y = _double_all(n)
  if n <= 0:
    return y
  return model_first(n - 1) + y


def test_callee_entry_calling_the_model_keeps_its_step():
  # The schedule gathers members at blocks that call a batched primitive;
  # running one inside every caller's step would split them.
  program = pipeline.stack_program(model_first, INT)
  assert "pushjump model_first/entry" in str(program)
  n = np.array([0, 1, 4])
  got, _ = _steps(program, n)
  np.testing.assert_array_equal(got, [0, 2, 20])


def test_the_model_runs_on_its_members_gathered():
  # model_first(n) calls the model once per level of recursion: with n =
  # 0..15 the k-th call has 16 - k members. pc:graph and pc:eager compute
  # exactly the members' rows (they used to compute all 16 rows each
  # time); pc:xla gathers the members into the smallest of 16, 8, 4, 2, 1
  # rows that holds them (the last call, one member, used to take 2 rows);
  # the results do not change.
  n = np.arange(16, dtype=np.int32)
  want = n * (n + 1)
  members = 16 - np.arange(16)
  for backend in ("pc:graph", "pc:eager"):
    np.testing.assert_array_equal(model_first(n, backend=backend), want)
    assert model_first.last_stats.batched_primitive_rows == sum(members)
  np.testing.assert_array_equal(model_first(n, backend="pc:xla"), want)
  buckets = [min(b for b in (16, 8, 4, 2, 1) if b >= m) for m in members]
  assert buckets[:9] == [16] * 8 + [8] and buckets[-2:] == [2, 1]
  assert model_first.last_stats.batched_primitive_rows == sum(buckets)
  # The members each call was made for, whatever rows it computed.
  assert model_first.last_stats.batched_primitive_members == {
      int(m): 1 for m in members}
  assert model_first.last_stats.batched_primitive_calls == 16


def test_members_per_model_call_are_counted_inside_tf_function():
  # Traced in the user's tf.function, the histogram is a tensor indexed by
  # members (16 + 1 entries): one call for each of 16, 15, ..., 1.
  n = np.arange(16, dtype=np.int32)
  for backend in ("pc:graph", "pc:xla"):
    @tf.function(autograph=False)
    def run(n):
      model_first(n, backend=backend)
      return model_first.last_stats_tensors["batched_primitive_members"]
    np.testing.assert_array_equal(run(tf.constant(n)), [0] + [1] * 16)


def test_model_outputs_stop_xla_constant_inference_at_no_cost():
  # pc:xla passes a model call's outputs through this barrier, so that
  # TF's lowering to XLA does not evaluate the model on the host while it
  # tries to prove later branch inputs constant (76 s -> 33 s for the
  # first call of a 64-chain logistic-regression NUTS step in
  # benchmarks.nuts).
  # A reshape needs its shape proved constant. Here the shape comes out
  # of a conditional whose branches agree, which the proof sees through;
  # through the barrier it fails.
  x = tf.range(6)

  def reshape(barrier):
    def run(x):
      shape = tf.switch_case(x[0] % 2, [lambda: tf.constant([2, 3])] * 2)
      if barrier:
        shape, = batched_primitive_calls.opaque_to_constant_inference([shape])
      return tf.reshape(x, shape)
    return tf.function(run, jit_compile=True, autograph=False)

  np.testing.assert_array_equal(reshape(False)(x), [[0, 1, 2], [3, 4, 5]])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="compile-time constant"):
    reshape(True)(x)
  # XLA deletes the loop that never runs: nothing of it is left to execute.
  barrier = tf.function(
      lambda x: batched_primitive_calls.opaque_to_constant_inference([x]),
      jit_compile=True, autograph=False)
  np.testing.assert_array_equal(barrier(x)[0], x)
  before = barrier.experimental_get_compiler_ir(x)(stage="hlo")
  after = barrier.experimental_get_compiler_ir(x)(stage="optimized_hlo")
  assert " while(" in before
  assert " while(" not in after
  assert batched_primitive_calls.opaque_to_constant_inference([]) == []


# -- the VM through the public API.


@tab.batch
def _halve_and_bump(x):
  return x * 0.5 + 1.0


@tab.batch
def bumped_repeatedly(x, n):
  total = _halve_and_bump(x)
  while n > 0:
    total = total + _halve_and_bump(total)
    n = n - 1
  return total


@pytest.mark.parametrize("backend", ["pc:eager", "pc:graph", "pc:xla"])
def test_code_run_by_several_blocks_is_vectorised_once(backend, monkeypatch):
  """Inlined at two call sites, the helper's code runs in two blocks; pfor
  traces it once (each vectorisation costs the first call time)."""
  vectorised = []
  original = vectorize.vectorized_map
  def counting(per_example, batched_args, code):
    vectorised.append(code)
    return original(per_example, batched_args, code)
  monkeypatch.setattr(vectorize, "vectorized_map", counting)
  x, n = np.array([1., 4., 2.], np.float32), np.array([0, 3, 1], np.int32)
  got = bumped_repeatedly(x, n, backend=backend)
  expected = []
  for xi, ni in zip(x, n):
    total = xi * 0.5 + 1.0
    for _ in range(ni):
      total += total * 0.5 + 1.0
    expected.append(total)
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  blocks_per_code = collections.Counter(
      ir2.unguarded(op).code for b in bumped_repeatedly.ir(level=2).blocks
      for op in set(b.ops) if isinstance(ir2.unguarded(op), ir2.Primitive))
  assert max(blocks_per_code.values()) >= 2   # shared code, else no test
  assert len(vectorised) == len(set(vectorised)) > 0


@tab.batch
def _steps_down(n):
  # For the tests that count traces: its runtimes are theirs alone (other
  # tests' calls of fib trace fib's).
  if n <= 0:
    return n
  return _steps_down(n - 1) - 1


@pytest.mark.parametrize("backend", ["pc:graph", "pc:xla"])
def test_no_retracing_on_new_values(backend):
  x = np.array([5, 9, 2, 0], np.int32)
  _steps_down(x, backend=backend)
  runtime = pipeline.runtime(_steps_down, INT, backend)
  traces = runtime.trace_count
  np.testing.assert_array_equal(_steps_down(x + 1, backend=backend), -x - 1)
  assert runtime.trace_count == traces == 1
  # Both trace once per batch size (pc:graph for its first few sizes).
  _steps_down(x[:3], backend=backend)
  _steps_down(x[:3] + 1, backend=backend)
  assert runtime.trace_count == 2


def test_pc_graph_traces_its_first_sizes_alone_then_one_trace_for_all():
  @tab.batch
  def steps_down(n):   # this test's own: no other test has traced it
    if n <= 0:
      return n
    return steps_down(n - 1) - 1

  backend = "pc:graph"
  x = np.arange(12, dtype=np.int32) % 7
  sizes = range(1, pc_vm.GRAPH_SIZES_TRACED + 4)
  for n in sizes:
    np.testing.assert_array_equal(steps_down(x[:n], backend=backend),
                                  -x[:n])
  runtime = pipeline.runtime(steps_down, INT, backend)
  # One trace per size up to the limit, then one more for any size.
  assert runtime.trace_count == pc_vm.GRAPH_SIZES_TRACED + 1
  for n in sizes:   # every size again: no new trace
    steps_down(x[:n] + 1, backend=backend)
  assert runtime.trace_count == pc_vm.GRAPH_SIZES_TRACED + 1


@tab.batch
def _halve_until_small(x):
  while tf.reduce_sum(x) > 1.0:
    x = x * 0.5
  return x


def _halve_until_small_np(x):
  x = np.array(x)
  for row in x:
    while row.sum() > 1.0:
      row *= 0.5
  return x


@tab.batch
def _tf_conditionals(x, k):
  y = tf.switch_case(k, [lambda: x, lambda: x * 10., lambda: x * 100.])
  while y > 50.:         # in the VM's loop, beside a Python branch
    y = y - tf.cond(x > 1.5, lambda: 30., lambda: 40.)
  return y


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_per_example_tf_cond_and_switch_case_run_on_every_backend(backend):
  # pfor partitions the rows of a per-example conditional; inside the
  # pc:xla loop XLA could not compile that ("Reading input as constant from
  # a dynamic tensor"), so there both branches run and a select picks.
  x = np.array([1., -1., 2., 0.6], np.float32)
  k = np.array([0, 1, 2, 2], np.int32)
  want = [_tf_conditionals.run_unbatched(tf.constant(a), tf.constant(b))
          for a, b in zip(x, k)]
  np.testing.assert_allclose(_tf_conditionals(x, k, backend=backend), want)


@tab.batch
def _depth_and_empty(n, empty):
  # `empty` has no elements per member; each call changes it and it is
  # read after the call, so the VM saves it on a stack across the call.
  if n <= 0:
    return tf.cast(n, tf.float32), empty
  depth, deeper = _depth_and_empty(n - 1, empty + 1.)
  return depth + tf.reduce_sum(empty) + 1., deeper + empty


@pytest.mark.parametrize("backend", ["pc:eager", "pc:graph", "pc:xla"])
@pytest.mark.parametrize("shape", [(0,), (2, 0)])
def test_values_without_elements_live_across_a_call(backend, shape):
  # Saving such a value was a scatter into a stack with no elements, which
  # TensorFlow rejects: eagerly, when a graph runs it, and XLA when it
  # compiles. (pc:graph passed where the saved value was only read by
  # tf.size: TensorFlow's graph optimiser dropped the scatter.)
  n = np.array([2, 3, 0], np.int32)
  empty = np.zeros((3,) + shape, np.float32)
  tf.nest.map_structure(np.testing.assert_array_equal,
                        _depth_and_empty(n, empty, backend=backend),
                        _depth_and_empty(n, empty, backend="local:eager"))
  assert "_depth_and_empty.empty" in _depth_and_empty.ir(level=2).stacked


def test_values_without_elements_in_pc_graph_inside_a_user_xla_function():
  # There pc:graph writes its stacks one by one with XLA's scatter.
  n = np.array([2, 3, 0], np.int32)
  empty = np.zeros([3, 0], np.float32)
  got = tf.function(lambda n, e: _depth_and_empty(n, e, backend="pc:graph"),
                    jit_compile=True)(n, empty)
  tf.nest.map_structure(np.testing.assert_array_equal, got,
                        _depth_and_empty(n, empty, backend="local:eager"))


def test_pc_graph_tf_cond_inside_a_user_xla_function():
  # pc:graph traced in a plain tf.function first, then in a jit_compile
  # one: the second used the first's trace, whose partitioned conditional
  # XLA cannot compile. Each context gets a trace of its own.
  x = tf.constant([1., -1., 2., 0.6], tf.float32)
  k = tf.constant([0, 1, 2, 2], tf.int32)
  want = _tf_conditionals(x, k, backend="local:eager")
  run = lambda x, k: _tf_conditionals(x, k, backend="pc:graph")  # pylint: disable=unnecessary-lambda-assignment
  for jit_compile in (False, True):
    np.testing.assert_allclose(
        tf.function(run, jit_compile=jit_compile)(x, k), want)


@pytest.mark.parametrize("persistent", [False, True])
def test_pc_graph_tf_cond_inside_a_user_xla_function_under_a_tape(
    persistent):
  # Under a tape, pc:graph in the user's jit_compile traces its VM in a
  # thread of its own, apart from the tapes (a persistent tape made the
  # VM's forward call fail: test_gradients.py); traced there, it must
  # still vectorise the conditionals as selects, which XLA can compile.
  # A fresh function, so that its first trace is under the tape.
  fresh = tab.batch(_tf_conditionals.python_function)
  x = tf.constant([1., -1., 2., 0.6], tf.float32)
  k = tf.constant([0, 1, 2, 2], tf.int32)
  want = _tf_conditionals(x, k, backend="local:eager")
  run = tf.function(lambda x, k: fresh(x, k, backend="pc:graph"),
                    jit_compile=True)
  with tf.GradientTape(persistent=persistent) as tape:
    tape.watch(x)
    got = run(x, k)
  np.testing.assert_allclose(got, want)


def test_selects_for_conditions_leave_pfor_as_it_was():
  from tensorflow.python.ops.parallel_for import pfor  # pylint: disable=g-direct-tensorflow-import
  registry = pfor._pfor_converter_registry  # pylint: disable=protected-access
  before = dict(registry)
  with pfor_conditions.as_selects():
    assert registry["StatelessIf"] is not before["StatelessIf"]
    assert registry["StatelessCase"] is not before["StatelessCase"]
  assert registry == before


def test_xla_reads_primitive_inputs_without_gathering_them():
  """With the batch size static, pfor takes row i of a primitive's input
  to be the input itself; with it unknown, pfor gathered every row by its
  index, a gather XLA kept and repeated in the kernels that read it (a NUTS
  transition at 4 chains: 5.7 -> 4.1 ms). A batch of unknown size (in a
  caller's tf.function) still runs, on a trace of its own."""
  x = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3))
  np.testing.assert_array_equal(_halve_until_small(x, backend="pc:xla"),
                                _halve_until_small_np(x))
  runtime = pipeline.runtime(_halve_until_small,
                             _halve_until_small._last_types, "pc:xla")  # pylint: disable=protected-access
  def pfor_gathers(compiled):
    hlo = compiled.experimental_get_compiler_ir(x)(stage="hlo")
    return [line for line in hlo.splitlines()
            if " gather(" in line and "pfor" in line]
  assert not pfor_gathers(runtime.compiled_for([x]))
  unknown_size = tf.function(
      lambda x: _halve_until_small(x, backend="pc:xla"),
      input_signature=[tf.TensorSpec([None, 3], tf.float32)])
  np.testing.assert_array_equal(unknown_size(x), _halve_until_small_np(x))
  assert pfor_gathers(runtime._compiled[(None, False)])  # pylint: disable=protected-access


def test_stats():
  fib(np.array([6, 1, 3], np.int32), backend="pc:graph")
  stats = fib.last_stats
  assert stats.batch_size == 3
  assert stats.steps == sum(stats.block_executions.values()) > 0
  assert stats.max_stack_depth == 6
  assert 0 < stats.utilization <= 1


def test_most_waiting_schedule():
  program = pipeline.stack_program(fib, INT)
  runtime = pc_vm.PcVmRuntime(program, 16, mode="graph",
                              schedule="most_waiting")
  n = np.arange(10)
  got = runtime.run([tf.constant(n, tf.int32)], None)
  np.testing.assert_array_equal(got, [_fib_np(i) for i in n])


def _next_block_np(pc_top, halt, schedule, model_blocks):
  """The schedules as the `schedule` module documents them, in NumPy."""
  if schedule == "lowest_pc":
    return min(pc_top.min(), halt)
  counts = np.bincount(pc_top[pc_top < halt], minlength=halt)
  if schedule == "primitives_last":
    others = counts * (1 - np.asarray(model_blocks))
    if others.any():
      counts = others
  if not counts.any():
    return halt
  if schedule == "most_waiting":
    return int(np.argmax(counts))
  return int(np.argmax((counts > 0) & (2 * counts >= counts.max())))


@tab.batch
def _model_in_a_loop(n):
  total = n * 0
  while n > 0:
    if n % 3 == 0:
      total = total + _double_all(n)
    elif n % 3 == 1:
      total = total + _model_in_a_loop(n - 2)
    else:
      total = total + 1
    n = n - 1
  return total


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(pc_top=st.lists(st.integers(0, 8), min_size=1, max_size=9),
                  schedule=st.sampled_from(schedule_lib.SCHEDULES))
# The model block (2) is the most crowded but others wait elsewhere; the
# lowest block holds half as many as the most crowded; all halted.
@hypothesis.example(pc_top=[2, 2, 2, 2, 3], schedule="primitives_last")
@hypothesis.example(pc_top=[1, 4, 4], schedule="crowded_lowest_pc")
@hypothesis.example(pc_top=[1, 4, 4], schedule="most_waiting")
@hypothesis.example(pc_top=[8, 8], schedule="primitives_last")
def test_schedules_pick_the_documented_block(pc_top, schedule):
  # Eight blocks, the third calling the model: the schedules disagree.
  program = pipeline.stack_program(_model_in_a_loop, INT)
  model_blocks = [int(ir2.calls_batched_primitive(b))
                  for b in program.blocks]
  assert program.halt == 8 and model_blocks.index(1) == 2
  pc_top = np.array(pc_top, np.int32)
  got = schedule_lib.Schedule(program, schedule).next_block(
      tf.constant(pc_top))
  assert int(got) == _next_block_np(pc_top, 8, schedule, model_blocks)


def test_an_unknown_schedule_is_refused_with_the_known_ones():
  program = pipeline.stack_program(fib, INT)
  with pytest.raises(ValueError, match="one of .*lowest_pc.*not 'fastest'"):
    pc_vm.PcVmRuntime(program, 16, schedule="fastest")


@pytest.mark.parametrize("schedule", schedule_lib.SCHEDULES)
def test_every_schedule_gives_the_same_results(schedule):
  program = pipeline.stack_program(_model_in_a_loop, INT)
  runtime = pc_vm.PcVmRuntime(program, 16, mode="graph", schedule=schedule)
  n = np.arange(9, dtype=np.int32)
  want = [int(_model_in_a_loop.run_unbatched(np.int32(i))) for i in n]
  np.testing.assert_array_equal(runtime.run([tf.constant(n)], None), want)


def test_one_member_needs_no_member_buckets():
  # At batch size 1 a model call runs on its one row or not at all: the
  # compiled VM gathers no members (the stable sort that finds them is
  # there at batch size 4) and schedules by reading the member's pc.
  def sorts(n):
    runtime = pipeline.runtime(model_first, INT, "pc:xla")
    args = [tf.constant(n, tf.int32)]
    hlo = runtime.compiled_for(args).experimental_get_compiler_ir(*args)(
        stage="hlo")
    return [line for line in hlo.splitlines() if " sort(" in line]
  assert sorts(np.arange(4))
  assert not sorts(np.array([3]))
  np.testing.assert_array_equal(model_first(np.array([3], np.int32),
                                            backend="pc:xla"), [12])


def test_inside_user_xla_function_with_unknown_batch():
  @tf.function(jit_compile=True,
               input_signature=[tf.TensorSpec([None], tf.int32)])
  def user(n):
    return fib(n, backend="pc:xla") * 2

  n = np.array([7, 0, 3, 10, 1], np.int32)
  np.testing.assert_array_equal(user(n), [2 * _fib_np(i) for i in n])
  np.testing.assert_array_equal(user(n[:2]), [2 * _fib_np(i) for i in n[:2]])


def test_pc_graph_inside_user_graph_with_unknown_batch():
  @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
  def user(n):
    return fib(n, backend="pc:graph")

  n = np.array([7, 0, 3], np.int32)
  np.testing.assert_array_equal(user(n), [_fib_np(i) for i in n])


# -- stack overflow: never a silently wrong answer.

@tab.batch(max_stack_depth=4)
def shallow_fib(n):
  if n <= 1:
    return n
  return shallow_fib(n - 1) + shallow_fib(n - 2)


@pytest.mark.parametrize("backend", ["pc:eager", "pc:graph", "pc:xla"])
def test_overflow_raises_when_called_eagerly(backend):
  with pytest.raises(tab.StackOverflowError, match="max_stack_depth=4"):
    shallow_fib(np.array([2, 6], np.int32), backend=backend)
  # Within the limit it works (depth 4 frames: n <= 4).
  np.testing.assert_array_equal(
      shallow_fib(np.array([4, 2], np.int32), backend=backend), [3, 1])


def test_overflow_inside_user_graph_fails_the_graph():
  @tf.function
  def user(n):
    return shallow_fib(n, backend="pc:graph")

  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="stack depth exceeded"):
    user(tf.constant([2, 6], tf.int32))


def test_overflow_inside_user_xla_poisons_the_members():
  @tf.function(jit_compile=True)
  def user(n):
    return shallow_fib(n, backend="pc:xla")

  got = user(tf.constant([2, 6, 4], tf.int32)).numpy()
  assert got.tolist() == [1, np.iinfo(np.int32).min, 3]


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
  return _double_all(n) + 1


def test_early_return_before_the_model_keeps_its_branch():
  # Merging the model's block into the test's would run the model under a
  # guard and split the members the schedule gathers for it.
  program = pipeline.stack_program(model_after_test, INT)
  assert "return if" not in str(program)
  n = np.array([-3, 0, 4])
  got, _ = _steps(program, n)
  np.testing.assert_array_equal(got, [-3, 1, 9])


@tab.batch
def model_test_model(n):
  y = _double_all(n)
  if y < 0:
    return y
  return _double_all(y) + 1


def test_early_return_after_the_model_runs_the_next_model_call_guarded():
  # The testing block calls the model already, so the block after the test
  # may move into it: its model call runs guarded, for the members that
  # did not return, and the schedule still finds every model call in a
  # model block.
  typed = _typed(model_test_model)
  before = pipeline.stack_program_before(typed, "return_early")
  after = return_early.return_early(before)
  assert "if not model_test_model._cond1: model_test_model._t5 = " \
         "batched_primitive" in str(after)
  n = np.array([-3, -1, 2, 5])
  got_before, steps_before = _steps(before, n)
  got_after, steps_after = _steps(after, n)
  np.testing.assert_array_equal(got_before, [-6, -2, 9, 21])
  np.testing.assert_array_equal(got_after, got_before)
  assert (steps_before, steps_after) == (3, 1)
  # The schedule sees a guarded model call as a model call.
  guarded = ir2.Block("b", tuple(op for op in after.blocks[0].ops
                                 if isinstance(op, ir2.Guarded)), ir2.Return())
  assert ir2.calls_batched_primitive(guarded)
  # Rows the model computed: every backend runs the guarded call on its 2
  # members only (under XLA a bucket of 4 / 2 rows), after the first call
  # on all 4.
  rows = {}
  for backend in ("pc:eager", "pc:graph", "pc:xla"):
    np.testing.assert_array_equal(model_test_model(n, backend=backend),
                                  got_before)
    rows[backend] = model_test_model.last_stats.batched_primitive_rows
    assert model_test_model.last_stats.batched_primitive_members == {
        4: 1, 2: 1}, backend
  assert rows == {"pc:eager": 6, "pc:graph": 6, "pc:xla": 6}
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
  y = _double_all(n)
  if y < 0:
    return y
  z = _double_all(y) + 1
  if z > 20:
    return z
  w = _double_all(z)
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
  typed = _typed(model_chain)
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
  got_before, steps_before = _steps(before, n)
  got_after, steps_after = _steps(after, n)
  np.testing.assert_array_equal(got_before, want)
  np.testing.assert_array_equal(got_after, want)
  # Before: a step per block the members pass through.
  assert (steps_before, steps_after) == (6, 1)
  # Under XLA each guarded model call computes its members' rows only
  # (in buckets of the batch size halved, rounded up: 13, 7, 4, 2, 1):
  # 13, 10 and 5 members here, computed as 13 + 13 + 7 rows; every
  # backend agrees.
  for backend in ("pc:eager", "pc:graph", "pc:xla"):
    np.testing.assert_array_equal(model_chain(n, backend=backend), want)
  assert model_chain.last_stats.batched_primitive_rows == 13 + 13 + 7


def test_member_buckets_halve_the_batch_down_to_one_row():
  sizes = batched_primitive_calls.member_bucket_sizes
  assert sizes(None, 256) == [128, 64, 32, 16, 8, 4, 2, 1]
  assert sizes(None, 13) == [7, 4, 2, 1]
  assert sizes(None, 2) == [1]
  assert sizes(None, 1) == []
  # A batch size unknown at trace time: a fixed number of sizes.
  z = tf.constant(13)
  assert [int(s) for s in sizes(z, None)] == [7, 4, 2]


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


def test_values_dead_after_a_block_are_not_written_back():
  # Under pc:xla every VM step writes as many register rows as the block
  # of its dispatch writing the most; a value nobody reads after the block
  # is left out.
  # checked_halves's merged block assigns `first` (moved into the second
  # call's `x`, then dead) and pops and pushes `depth` (the callee's
  # parameter: live). For the members that return `first` it writes
  # nothing: `first` is the callee's result, which the result register
  # already holds (`redundant_copies`).
  program = pipeline.stack_program(programs.checked_halves, INT * 2)
  runtime = pc_vm.PcVmRuntime(program, 16, mode="graph")
  labels = [b.label for b in program.blocks]
  merged = labels.index("checked_halves/endif3.1")
  live = block_runner.values_live_out(program)["checked_halves/endif3.1"]
  assert "checked_halves.first" not in live
  assert {"checked_halves.depth", "checked_halves._result"} <= live
  owners = ["checked_halves.first", "checked_halves.depth",
            "checked_halves.depth#sp", "checked_halves._result",
            "checked_halves.x"]
  changed = runtime._changed_positions(owners)[merged]  # pylint: disable=protected-access
  assert sorted(owners[i] for i in changed) == [
      "checked_halves.depth", "checked_halves.depth#sp", "checked_halves.x"]
  depth, x = np.array([0, 3, 5, 2]), np.array([4, 2, 40, 0])
  np.testing.assert_array_equal(
      _run(program, depth, x),
      [programs._checked_halves_oracle(d, v) for d, v in zip(depth, x)])  # pylint: disable=protected-access


@tab.batch
def _three_then_one(x, n):
  """Its entry block writes three [4] float registers, its loop body one,
  its exit a float scalar: three dispatches under pc:xla."""
  a = x + 1.
  b = x * 2.
  c = x * 3.
  while n > 0:
    a = a * 0.5
    n = n - 1
  return tf.reduce_sum(a + b + c)


def test_blocks_pad_bank_writes_only_to_their_own_dispatchs_largest():
  # Every branch of one tf.switch_case returns the same shapes, so under
  # pc:xla a block writes as many bank rows as the block of its dispatch
  # that writes the most, padding the rest. The VM splits the blocks into
  # dispatches by what they write, each run by a loop of its own: the loop
  # body, which changes one register, writes one row, not the entry
  # block's three.
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  n = np.array([0, 2, 5], np.int32)
  want = [np.sum((v + 1.) * 0.5**k + 5. * v) for v, k in zip(x, n)]
  # Three loops in a row: TF 2.21's XLA bridge failed on them until each
  # was put in a function of its own.
  np.testing.assert_allclose(_three_then_one(x, n, backend="pc:xla"), want,
                             rtol=1e-6)
  runtime = pipeline.runtime(_three_then_one, _three_then_one._last_types,  # pylint: disable=protected-access
                             "pc:xla")
  assert len(runtime._dispatches) == 3  # pylint: disable=protected-access
  bank = ("float32", (4,))
  rows = {block.label: runtime._dispatch_of[i].bank_capacity[bank]  # pylint: disable=protected-access
          for i, block in enumerate(runtime.program.blocks)}
  assert rows == {"_three_then_one/entry": 3, "_three_then_one/body2": 1,
                  "_three_then_one/endloop3": 0}
  # The compiled loop applies each dispatch's writes with a scatter of as
  # many rows as it reserves.
  args = [tf.constant(x), tf.constant(n)]
  hlo = runtime.compiled_for(args).experimental_get_compiler_ir(*args)(
      stage="hlo")
  updates = re.findall(r"scatter\([^)]*f32\[(\d+),3,4\]", hlo)
  assert sorted(updates) == ["1", "3"]
  # Elsewhere nothing is padded: one dispatch of every block.
  np.testing.assert_allclose(_three_then_one(x, n, backend="pc:graph"), want,
                             rtol=1e-6)
  graph = pipeline.runtime(_three_then_one, _three_then_one._last_types,  # pylint: disable=protected-access
                           "pc:graph")
  assert len(graph._dispatches) == 1  # pylint: disable=protected-access


@tab.batch
def _one_value_two_registers(x, n):
  """Its entry block writes one computed value to two registers."""
  e = tf.cos(x)
  a = e
  b = e
  while n > 0:
    a = a * 0.5
    b = b + 1.
    n = n - 1
  return a + b


def test_a_value_written_to_several_registers_is_computed_once():
  # A block's register writes are one concatenation, and XLA's loop
  # fusion evaluates a concatenation's operands row by row: fused into it,
  # `cos(x)` would be computed once for `a` and again for `b`. Under pc:xla
  # such a value is computed into a buffer of its own first (a reduction,
  # which XLA does not fuse into its readers).
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  n = np.array([0, 2, 5], np.int32)
  want = [np.cos(v) * 0.5**k + np.cos(v) + k for v, k in zip(x, n)]
  np.testing.assert_allclose(_one_value_two_registers(x, n, backend="pc:xla"),
                             want, rtol=1e-6)
  runtime = pipeline.runtime(_one_value_two_registers,
                             _one_value_two_registers._last_types,  # pylint: disable=protected-access
                             "pc:xla")
  args = [tf.constant(x), tf.constant(n)]
  hlo = runtime.compiled_for(args).experimental_get_compiler_ir(*args)(
      stage="optimized_hlo")
  computations = re.split(r"\n(?=\S)", hlo)
  with_cosine = [c for c in computations if " cosine(" in c]
  assert with_cosine
  assert not any(" concatenate(" in c for c in with_cosine)
  np.testing.assert_allclose(
      _one_value_two_registers(x, n, backend="pc:graph"), want, rtol=1e-6)


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
  typed = _typed(six_guard_clauses)
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


def test_pc_eager_writes_only_the_stacks_a_block_pushes(monkeypatch):
  # Outside XLA a stack write is a copy of the whole [D, Z] stack, and
  # every VM step wrote every stack, those the block left alone included
  # (fib on 4,096 members under pc:graph spent most of its steps there).
  from tfp_autobatch.runtime import stack_banks
  applied = collections.Counter()
  apply = stack_banks.apply_stack_write
  def counted(stack, write, xla=False):
    applied["writes"] += 1
    return apply(stack, write, xla=xla)
  monkeypatch.setattr(stack_banks, "apply_stack_write", counted)
  n = np.array([3, 6, 1, 5])
  np.testing.assert_array_equal(fib(n, backend="pc:eager"), [2, 8, 1, 5])
  program = fib.ir(level=2)
  pushes = {b.label: len({ir2.unguarded(op).var for op in b.ops
                          if isinstance(ir2.unguarded(op), ir2.Push)})
                     + bool(ir2.call_of(b.terminator))
            for b in program.blocks}
  runs = {label.split("/", 1)[-1]: count
          for label, count in fib.last_stats.block_executions.items()}
  expected = sum(runs.get(label.split("/", 1)[-1], 0) * k
                 for label, k in pushes.items())
  assert 0 < expected < fib.last_stats.steps * 3
  assert applied["writes"] == expected


def test_pc_graph_results_keep_the_static_batch_size_in_a_graph():
  # pc:graph traces its VM for any batch size, and its results came back
  # [None] inside a caller's graph: a tf.while_loop whose variable they
  # were rejected the shape change.
  @tf.function(autograph=False)
  def twice(n):
    assert fib(n, backend="pc:graph").shape == (4,)
    return tf.while_loop(lambda i, v: i < 2,
                         lambda i, v: (i + 1, fib(v, backend="pc:graph")),
                         (0, n))[1]
  np.testing.assert_array_equal(twice(tf.constant([3, 6, 1, 5])),
                                [1, 21, 1, 5])
