"""The program-counter VM's run counters (`run_counters`) on hand-made
steps: what `RunStats` reports is what the steps did."""
import numpy as np
import tensorflow as tf

from tfp_autobatch.runtime import run_counters


def _two_steps():
  # Four members, three blocks. Step 1 runs block 1 for the two members
  # waiting there; it makes one model call for 2 members (its second call
  # slot unused, -1) on 2 rows and pushes member 1 to depth 2. Step 2 runs
  # block 2 for one member; its dispatch makes no model calls (None).
  counters = run_counters.initial(tf.constant(4), num_blocks=3)
  counters = run_counters.after_step(
      counters, tf.constant(1), 3, pc_top=tf.constant([1, 1, 2, 0]),
      pc_sp=tf.constant([1, 2, 1, 1]), rows=tf.constant(2),
      members=tf.constant([2, -1]))
  return run_counters.after_step(
      counters, tf.constant(2), 3, pc_top=tf.constant([0, 0, 2, 0]),
      pc_sp=tf.constant([1, 1, 1, 1]), rows=tf.constant(0), members=None)


def test_counters_become_the_run_statistics():
  stats = run_counters.to_stats(_two_steps(), 4, ["a", "b", "c"])
  assert stats.batch_size == 4 and stats.steps == 2
  assert stats.block_executions == {"b": 1, "c": 1}
  assert stats.active_members == 3 and stats.utilization == 3 / 8
  assert stats.max_stack_depth == 2
  assert stats.batched_primitive_rows == 2
  assert stats.batched_primitive_members == {2: 1}
  assert stats.batched_primitive_calls == 1


def test_counters_traced_keep_the_field_names():
  tensors = run_counters.to_tensors(_two_steps(), ["a", "b", "c"])
  # The dtypes callers have read: sums over steps int64, the rest int32.
  assert tensors["steps"].dtype == tf.int32
  assert tensors["active_members"].dtype == tf.int64
  assert tensors["batched_primitive_rows"].dtype == tf.int64
  assert int(tensors["steps"]) == 2
  assert int(tensors["max_stack_depth"]) == 2
  assert tensors["batched_primitive_members"].numpy().tolist() == [
      0, 0, 1, 0, 0]
  assert {k: int(v) for k, v in tensors["block_executions"].items()} == {
      "a": 0, "b": 1, "c": 1}


def test_member_and_row_sums_pass_two_to_the_31():
  # 131,072 members each taking 17,000 steps sum to more than 2**31
  # active members: an int32 sum wrapped to a negative utilization.
  counters = run_counters.initial(tf.constant(4), num_blocks=3)
  before = np.zeros(counters.shape, np.int64)
  before[[run_counters.ACTIVE, run_counters.ROWS]] = 2**31 - 1
  counters += before
  counters = run_counters.after_step(
      counters, tf.constant(1), 3, pc_top=tf.constant([1, 1, 2, 0]),
      pc_sp=tf.constant([1, 1, 1, 1]), rows=tf.constant(2),
      members=tf.constant([2]))
  stats = run_counters.to_stats(counters, 4, ["a", "b", "c"])
  assert stats.active_members == 2**31 + 1
  assert stats.batched_primitive_rows == 2**31 + 1


def test_ended_counters_carry_the_halted_members_and_split_back():
  # One array read gives the statistics and what the call must raise.
  counters = _two_steps()
  ended = run_counters.ended(counters, overflow=tf.constant(
      [False, True, True, False]), faulted=tf.constant([True, False, False,
                                                        False]))
  for value in (ended, ended.numpy()):
    back, overflowed, faulted = run_counters.split_ended(value)
    assert np.array_equal(np.asarray(back), counters.numpy())
    assert int(overflowed) == 2 and int(faulted) == 1
  # A program without subscripts passes no fault flags at all.
  _, overflowed, faulted = run_counters.split_ended(run_counters.ended(
      counters, tf.zeros([4], tf.bool), tf.zeros([0], tf.bool)))
  assert int(overflowed) == 0 and int(faulted) == 0


def test_traced_counts_become_the_same_run_statistics():
  # RunStats.of_tensors reads what a traced call returned as tensors.
  from tfp_autobatch.runtime import stats as stats_lib   # pylint: disable=import-outside-toplevel
  labels = ["a", "b", "c"]
  tensors = run_counters.to_tensors(_two_steps(), labels)
  assert stats_lib.RunStats.of_tensors(tensors, 4) == run_counters.to_stats(
      _two_steps(), 4, labels)
