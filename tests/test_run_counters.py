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
  # Returns the final counters, with the counts over members summed from
  # the per-member registers (`ended`, less the halted members).
  state = {"pc_top": tf.constant([1, 1, 2, 0]),
           "pc_sp": tf.constant([1, 1, 1, 1]),
           **run_counters.initial_member_registers(4)}
  counters = run_counters.initial(tf.constant(4), num_blocks=3)
  for block, pc_top, pc_sp, rows, members in (
      (1, [0, 0, 2, 0], [1, 2, 1, 1], 2, tf.constant([2, -1])),
      (2, [0, 0, 0, 0], [1, 1, 1, 1], 0, None)):
    after = {"pc_top": tf.constant(pc_top), "pc_sp": tf.constant(pc_sp)}
    state = dict(after, **run_counters.member_registers_after(
        state, after, block))
    counters = run_counters.after_step(counters, tf.constant(block), 3,
                                       rows=tf.constant(rows),
                                       members=members)
  return run_counters.split_ended(run_counters.ended(
      counters, state, tf.zeros([4], tf.bool), tf.zeros([0], tf.bool)))[0]


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
  before[run_counters.ROWS] = 2**31 - 1
  counters += before
  counters = run_counters.after_step(counters, tf.constant(1), 3,
                                     rows=tf.constant(2),
                                     members=tf.constant([2]))
  members = {"member_steps": tf.fill([4], 2**30),
             "member_depth": tf.ones([4], tf.int32)}
  counters, _, _ = run_counters.split_ended(run_counters.ended(
      counters, members, tf.zeros([4], tf.bool), tf.zeros([0], tf.bool)))
  stats = run_counters.to_stats(counters, 4, ["a", "b", "c"])
  assert stats.active_members == 2**32
  assert stats.batched_primitive_rows == 2**31 + 1


def test_counts_over_members_are_kept_per_member():
  # A member's steps count the blocks it ran (it waited at the block);
  # its depth is the deepest its pc stack went, also after it returned.
  before = {"pc_top": tf.constant([1, 0, 1]), "pc_sp": tf.constant([2, 1, 1]),
            "member_steps": tf.constant([4, 0, 2]),
            "member_depth": tf.constant([3, 1, 1])}
  after = {"pc_top": tf.constant([2, 0, 0]), "pc_sp": tf.constant([1, 1, 2])}
  got = run_counters.member_registers_after(before, after, 1)
  assert got["member_steps"].numpy().tolist() == [5, 0, 3]
  assert got["member_depth"].numpy().tolist() == [3, 1, 2]
  # Before the first step: no steps, the entry frame (depth 1).
  first = run_counters.initial_member_registers(3)
  assert first["member_steps"].numpy().tolist() == [0, 0, 0]
  assert first["member_depth"].numpy().tolist() == [1, 1, 1]


def test_ended_counters_carry_the_halted_members_and_split_back():
  # One array read gives the statistics and what the call must raise.
  counters = _two_steps()
  members = {"member_steps": tf.zeros([4], tf.int32),
             "member_depth": tf.ones([4], tf.int32)}
  ended = run_counters.ended(counters, members, overflow=tf.constant(
      [False, True, True, False]), faulted=tf.constant([True, False, False,
                                                        False]))
  for value in (ended, ended.numpy()):
    back, overflowed, faulted = run_counters.split_ended(value)
    assert np.asarray(back)[run_counters.ACTIVE] == 0
    assert np.asarray(back)[run_counters.HIGH] == 1
    assert int(overflowed) == 2 and int(faulted) == 1
  # A program without subscripts passes no fault flags at all.
  _, overflowed, faulted = run_counters.split_ended(run_counters.ended(
      counters, members, tf.zeros([4], tf.bool), tf.zeros([0], tf.bool)))
  assert int(overflowed) == 0 and int(faulted) == 0
  # No members: no steps, no stack.
  back, _, _ = run_counters.split_ended(run_counters.ended(
      run_counters.initial(0, 3), run_counters.initial_member_registers(0),
      tf.zeros([0], tf.bool), tf.zeros([0], tf.bool)))
  assert back.numpy().tolist() == [0] * (run_counters.EXECUTIONS + 3 + 1)


def test_traced_counts_become_the_same_run_statistics():
  # RunStats.of_tensors reads what a traced call returned as tensors.
  from tfp_autobatch.runtime import stats as stats_lib   # pylint: disable=import-outside-toplevel
  labels = ["a", "b", "c"]
  tensors = run_counters.to_tensors(_two_steps(), labels)
  assert stats_lib.RunStats.of_tensors(tensors, 4) == run_counters.to_stats(
      _two_steps(), 4, labels)
