"""Tests of the pc VM's schedules: which block runs next
(`runtime/schedule.py`)."""
import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

from pc_testing import INT, double_all, fib, fib_np
import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.ir import ir2
from tfp_autobatch.runtime import pc_vm
from tfp_autobatch.runtime import schedule as schedule_lib


def test_most_waiting_schedule():
  program = pipeline.stack_program(fib, INT)
  runtime = pc_vm.PcVmRuntime(program, 16, mode="graph",
                              schedule="most_waiting")
  n = np.arange(10)
  got = runtime.run([tf.constant(n, tf.int32)], None)
  np.testing.assert_array_equal(got, [fib_np(i) for i in n])


def _next_block_np(pc_top, halt, schedule, model_blocks,
                   halting_blocks=()):
  """The schedules as the `schedule` module documents them, in NumPy."""
  if schedule == "lowest_pc":
    return min(pc_top.min(), halt)
  counts = np.bincount(pc_top[pc_top < halt], minlength=halt)
  if schedule == "primitives_last":
    halting = np.isin(np.arange(halt), list(halting_blocks))
    model = np.asarray(model_blocks, bool)
    for deferred in (model | halting, halting):
      if (counts * ~deferred).any():
        counts = counts * ~deferred
        break
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
      total = total + double_all(n)
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


def test_the_schedules_constants_are_not_computed_in_the_graph():
  """Each dispatch loop of a step traces the schedule: its block indices
  and model masks are constants, not ops computing them."""
  program = pipeline.stack_program(_model_in_a_loop, INT)
  schedule = schedule_lib.Schedule(program, "primitives_last")
  types = []
  @tf.function(jit_compile=True, autograph=False)
  def next_block(pc_top):
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    block = schedule.next_block(pc_top)
    types.extend(op.type for op in graph.get_operations()[before:])
    return block
  assert int(next_block(tf.constant([2, 2, 3], tf.int32))) == 3
  assert not {"Range", "StridedSlice", "Pack", "Sub", "OnesLike"} & set(types)
  assert len(types) <= 30


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


@tab.batch
def _model_then_one_more(n):
  total = _model_in_a_loop(n)
  return total + 1


def test_halting_blocks_are_the_entrys_returns_where_nothing_calls_it():
  # fib's entry calls itself: a member that returns there may go on.
  assert not schedule_lib.halting_blocks(pipeline.stack_program(fib, INT))
  program = pipeline.stack_program(_model_then_one_more, INT)
  labels = [program.blocks[i].label
            for i in schedule_lib.halting_blocks(program)]
  assert labels == ["_model_then_one_more/entry.1"]


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(pc_top=st.lists(st.integers(0, 9), min_size=1, max_size=9))
# A member at the halting block waits for the others, model blocks too.
@hypothesis.example(pc_top=[1, 1, 1, 3])
@hypothesis.example(pc_top=[1, 1, 5])
@hypothesis.example(pc_top=[1, 9])
def test_primitives_last_runs_a_halting_block_after_every_other(pc_top):
  program = pipeline.stack_program(_model_then_one_more, INT)
  halt = program.halt
  model_blocks = [int(ir2.calls_batched_primitive(b))
                  for b in program.blocks]
  halting = schedule_lib.halting_blocks(program)
  assert halt == 9 and halting == {1} and model_blocks.index(1) == 3
  pc_top = np.array(pc_top, np.int32)
  got = schedule_lib.Schedule(program, "primitives_last").next_block(
      tf.constant(pc_top))
  assert int(got) == _next_block_np(pc_top, halt, "primitives_last",
                                    model_blocks, halting)


@pytest.mark.parametrize("backend", ["pc:graph", "pc:xla"])
def test_the_halting_block_runs_once_for_every_member(backend):
  # Members finish the helper at different steps; each would run the
  # entry's last block when it got there (the lowest block of the program)
  # where now it waits and runs once, at the end.
  n = np.arange(9, dtype=np.int32)
  want = [int(_model_in_a_loop.run_unbatched(np.int32(i))) + 1 for i in n]
  np.testing.assert_array_equal(
      _model_then_one_more(n, backend=backend), want)
  stats = _model_then_one_more.last_stats
  assert stats.block_executions["_model_then_one_more/entry.1"] == 1
