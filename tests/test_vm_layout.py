"""Tests of the pc VM's memory layout (`runtime/vm_layout.py`), planned
from the IR-2 program and the batch size before any tracing."""
import re

import numpy as np
import pytest
import tensorflow as tf

from pc_testing import INT, fib, run_on_graph_vm
import example_programs as programs
import tfp_autobatch as tab
from tfp_autobatch import errors
from tfp_autobatch import pipeline
from tfp_autobatch.runtime import block_runner
from tfp_autobatch.runtime import dispatch
from tfp_autobatch.runtime import pc_vm
from tfp_autobatch.runtime import register_file
from tfp_autobatch.runtime import stack_banks
from tfp_autobatch.runtime import vm_layout

INT32 = tf.int32


def _spec(*shape, dtype=INT32):
  return tf.TensorSpec(shape, dtype)


def test_fib_layout_under_xla():
  # fib's stack program (see test_lower's golden FIB_IR2): `fib.n` and
  # `fib._t5` stacked with a cached top, `fib._result` a register.
  program = pipeline.stack_program(fib, INT)
  layout = vm_layout.plan(program, 4, 16, xla=True)
  assert layout.batch_size == 4 and layout.depth == 16
  assert layout.state == {
      "vars": {"fib._result": _spec(4),
               "fib._t5": {"top": _spec(4), "sp": _spec(4)},
               "fib.n": {"top": _spec(4), "sp": _spec(4)}},
      "pc_top": _spec(4), "pc_sp": _spec(4),
      "overflow": _spec(4, dtype=tf.bool),
      # The run counters' counts per member (`run_counters`).
      "member_steps": _spec(4), "member_depth": _spec(4)}
  assert not layout.has_index_fault
  assert layout.stacks_spec == {"pc": _spec(16, 4), "fib._t5": _spec(16, 4),
                                "fib.n": _spec(16, 4)}
  # Flat leaves: the state's keys in sorted order, then the variables'.
  assert layout.owners == ("", "", "", "", "", "fib._result", "fib._t5#sp",
                           "fib._t5", "fib.n#sp", "fib.n")
  assert dict(layout.pc_positions) == {"pc_top": 4, "pc_sp": 3}
  # No floats, so no banks; the ten int32/bool leaves in one file, each a
  # column of [Z, 10] for a batch this small.
  assert layout.banks.sizes == {}
  assert layout.registers.widths == {"int32": 10}
  assert layout.registers.axis == 1
  # The three stacks of int32 scalars share one bank.
  assert layout.stacks.enabled
  assert layout.stacks.sizes == {("int32", ()): 3}
  labels = [b.label for b in program.blocks]
  assert labels == ["fib/entry", "fib/then1", "fib/endif3", "fib/endif3.1",
                    "fib/endif3.1.2"]
  assert layout.pushed == (frozenset(), frozenset(), {"fib.n", "pc"},
                           {"fib._t5", "pc"}, frozenset())
  changed = [sorted(layout.owners[i] for i in c) for c in layout.changed]
  assert changed == [[], ["fib._result"], ["fib.n", "fib.n#sp"],
                     ["fib._t5#sp", "fib.n", "fib.n#sp"],
                     ["fib._result", "fib._t5#sp"]]
  # The two calling blocks write two stack leaves each; the others none:
  # two dispatches, the later one (by its lowest block) first.
  assert [(d.blocks, d.stack_capacity) for d in layout.dispatches] == [
      ((2, 3), {("int32", ()): 2}), ((0, 1, 4), {("int32", ()): 0})]
  assert {i: d.blocks for i, d in layout.dispatch_of.items()} == {
      0: (0, 1, 4), 1: (0, 1, 4), 2: (2, 3), 3: (2, 3), 4: (0, 1, 4)}
  assert dict(layout.model_calls) == {(2, 3): 0, (0, 1, 4): 0}


def test_outside_xla_nothing_is_packed_and_one_dispatch_runs_every_block():
  program = pipeline.stack_program(fib, INT)
  layout = vm_layout.plan(program, None, 16, xla=False)
  assert layout.state["pc_top"] == _spec(None)
  assert layout.stacks_spec["pc"] == _spec(16, None)
  assert layout.registers.widths == {}
  assert not layout.stacks.enabled
  assert [d.blocks for d in layout.dispatches] == [(0, 1, 2, 3, 4)]


def test_a_large_batch_packs_its_registers_as_rows():
  program = pipeline.stack_program(fib, INT)
  assert vm_layout.plan(program, 256, 16, xla=True).registers.axis == 0


def test_the_layout_is_planned_once_per_batch_size():
  program = pipeline.stack_program(fib, INT)
  runtime = pc_vm.PcVmRuntime(program, 16, mode="xla")
  assert runtime.layout_for(4) is runtime.layout_for(4)
  planned = vm_layout.plan(program, 4, 16, xla=True)
  layout = runtime.layout_for(4)
  for field in ("state", "stacks_spec", "owners", "pc_positions", "pushed",
                "changed", "model_calls"):
    assert getattr(layout, field) == getattr(planned, field), field
  assert ([d.blocks for d in layout.dispatches]
          == [d.blocks for d in planned.dispatches])
  assert runtime.layout_for(5).batch_size == 5


def test_a_traced_state_other_than_the_planned_one_is_an_error():
  program = pipeline.stack_program(fib, INT)
  layout = vm_layout.plan(program, 2, 16, xla=False)
  z = tf.zeros([2], tf.int32)
  state = {"vars": {"fib._result": z, "fib._t5": {"top": z, "sp": z},
                    "fib.n": {"top": z, "sp": z}},
           "pc_top": z, "pc_sp": z, "overflow": tf.zeros([2], tf.bool),
           "member_steps": z, "member_depth": z}
  stacks = {k: tf.zeros([16, 2], tf.int32)
            for k in ("pc", "fib._t5", "fib.n")}
  layout.check_state(state, stacks)
  with pytest.raises(errors.IRError, match="planned"):
    layout.check_state(dict(state, pc_top=tf.zeros([2], tf.int64)), stacks)
  with pytest.raises(errors.IRError, match="planned"):
    layout.check_state(dict(state, index_fault=z), stacks)


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
  labels = [b.label for b in program.blocks]
  merged = labels.index("checked_halves/endif3.1")
  live = block_runner.values_live_out(program)
  assert "checked_halves.first" not in live["checked_halves/endif3.1"]
  assert {"checked_halves.depth", "checked_halves._result"} <= (
      live["checked_halves/endif3.1"])
  owners = ["checked_halves.first", "checked_halves.depth",
            "checked_halves.depth#sp", "checked_halves._result",
            "checked_halves.x"]
  changed = vm_layout.changed_positions(program, live, owners)[merged]
  assert sorted(owners[i] for i in changed) == [
      "checked_halves.depth", "checked_halves.depth#sp", "checked_halves.x"]
  depth, x = np.array([0, 3, 5, 2]), np.array([4, 2, 40, 0])
  np.testing.assert_array_equal(
      run_on_graph_vm(program, depth, x),
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
  # Three loops in a row, each in a function of its own (`pc_vm`).
  np.testing.assert_allclose(_three_then_one(x, n, backend="pc:xla"), want,
                             rtol=1e-6)
  runtime = pipeline.runtime(_three_then_one, _three_then_one._last_types,  # pylint: disable=protected-access
                             "pc:xla")
  layout = runtime.layout_for(3)
  assert len(layout.dispatches) == 3
  bank = ("float32", (4,))
  assert layout.banks.sizes[bank] == 4   # x, a, b and c
  rows = {block.label: layout.dispatch_of[i].bank_capacity[bank]
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
  assert len(graph.layout_for(3).dispatches) == 1


def test_a_blocks_dispatch_is_classed_by_its_largest_bank_write():
  # NUTS's leaf block on a 32-d model writes 8 [32] vectors and 3 scalars,
  # a trajectory's doubling 13 [32] vectors. Classed by the sum of the
  # elements written (259 and 416: one power of two), the leaf block
  # shared the doubling's dispatch and padded its writes to 13 rows; by
  # its largest bank (256) it has a dispatch of its own.
  z = 64
  example = ([tf.TensorSpec([z, 32], tf.float32)] * 13
             + [tf.TensorSpec([z], tf.float32)] * 3)
  banks = register_file.RegisterBanks(example)
  stacks = stack_banks.StackBanks({}, depth=4)
  leaf = set(range(8)) | {13, 14, 15}
  doubling = set(range(13))
  dispatches = dispatch.group_blocks([leaf, doubling], [[], []], banks,
                                     stacks, z, pack=True)
  capacity = {d.blocks: d.bank_capacity[("float32", (32,))]
              for d in dispatches}
  assert capacity == {(0,): 8, (1,): 13}


@tab.batch
def _many_counters(n):
  """Sixteen int32 counters and two flags carried around a loop: a wide
  integer register file, of which the loop body changes five leaves."""
  c0, c1, c2, c3 = n, n + 1, n + 2, n + 3
  c4, c5, c6, c7 = n + 4, n + 5, n + 6, n + 7
  c8, c9, c10, c11 = n + 8, n + 9, n + 10, n + 11
  c12, c13, c14, c15 = n + 12, n + 13, n + 14, n + 15
  odd = n > 100
  seen = n < 0
  while n > 0:
    c0 = c0 + 2
    c7 = c7 * 2
    odd = not odd
    seen = seen or n == 3
    n = n - 1
  total = (c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8 + c9 + c10 + c11
           + c12 + c13 + c14 + c15)
  if odd:
    total = total + 1000
  if seen:
    total = total + 100000
  return total


def _many_counters_oracle(n):
  c = [n + k for k in range(16)]
  odd, seen = n > 100, n < 0
  while n > 0:
    c[0] += 2
    c[7] *= 2
    odd = not odd
    seen = seen or n == 3
    n -= 1
  return sum(c) + 1000 * odd + 100000 * seen


@pytest.mark.parametrize("z", [16, 64])
def test_a_wide_integer_file_is_banked_from_enough_members(z):
  # Under pc:xla a block that rewrote the whole integer register file
  # spent most of a NUTS step at 64 chains copying it: with at least
  # INTEGER_BANKS_FROM_LEAVES integer or boolean variables and
  # INTEGER_BANKS_FROM_BATCH members, the variables' registers go to the
  # int32 banks (booleans as 0 and 1), and a block writes back only the
  # rows it changes. The VM's own registers stay in the file.
  n = np.arange(z, dtype=np.int32) % 7
  want = [_many_counters_oracle(int(v)) for v in n]
  np.testing.assert_array_equal(_many_counters(n, backend="pc:xla"), want)
  runtime = pipeline.runtime(_many_counters, _many_counters._last_types,  # pylint: disable=protected-access
                             "pc:xla")
  layout = runtime.layout_for(z)
  banked = z >= vm_layout.INTEGER_BANKS_FROM_BATCH
  assert (("int32", ()) in layout.banks.sizes) == banked
  if banked:
    # The 16 counters, the two flags and n.
    assert layout.banks.sizes[("int32", ())] >= 19
    # pc_top, pc_sp, overflow and the two run counters.
    assert layout.registers.widths == {"int32": 5}
    body = [i for i, b in enumerate(runtime.program.blocks)
            if b.label.startswith("_many_counters/body")]
    assert body
    for i in body:
      assert layout.dispatch_of[i].bank_capacity[("int32", ())] <= 5
  else:
    assert layout.registers.widths["int32"] >= 24


@tab.batch(max_stack_depth=8)
def _tree_sum(left, right, value, n):
  if left[n] < 0:
    return value[n]
  return _tree_sum(left, right, value, left[n]) + _tree_sum(
      left, right, value, right[n])


def _left_combs(z):
  """z trees of 16 nodes (arrays [z, 16]), node 0 the root: tree i's
  first 2 * (i % 4) + 1 nodes are a left comb (node 2k's left child is
  2k + 2, its right child 2k + 1, a leaf), the other nodes leaves never
  reached."""
  nodes = vm_layout.INTEGER_ARRAY_BANK_FROM_ELEMENTS
  left = np.full([z, nodes], -1, np.int32)
  right = np.full([z, nodes], -1, np.int32)
  value = np.arange(z * nodes, dtype=np.int32).reshape(z, nodes)
  for i in range(z):
    for k in range(i % 4):
      left[i, 2 * k] = 2 * k + 2
      right[i, 2 * k] = 2 * k + 1
  return left, right, value


def _tree_sum_oracle(left, right, value, n):
  if left[n] < 0:
    return value[n]
  return (_tree_sum_oracle(left, right, value, left[n])
          + _tree_sum_oracle(left, right, value, right[n]))


def test_integer_arrays_are_banked_and_written_only_by_their_writers():
  # Every block writes the register file back whole: a tree's index
  # arrays there were copied by every step of a TreeLSTM's descent,
  # though only its entry block sets them. Below the wide-file rule's
  # sizes (few integer leaves, 4 members), arrays go to int32 banks, which
  # only their writers' dispatches scatter to.
  z = 4
  left, right, value = _left_combs(z)
  roots = np.zeros([z], np.int32)
  want = [_tree_sum_oracle(left[i], right[i], value[i], 0) for i in range(z)]
  np.testing.assert_array_equal(
      _tree_sum(left, right, value, roots, backend="pc:xla"), want)
  runtime = pipeline.runtime(_tree_sum, _tree_sum._last_types,  # pylint: disable=protected-access
                             "pc:xla")
  layout = runtime.layout_for(z)
  array_bank = ("int32", (vm_layout.INTEGER_ARRAY_BANK_FROM_ELEMENTS,))
  assert layout.banks.sizes[array_bank] == 3   # left, right, value
  assert not any(layout.banks.written(positions)[array_bank]
                 for positions in layout.changed)
  assert all(d.bank_capacity[array_bank] == 0 for d in layout.dispatches)
  # No variable's register with a per-member shape is left in the file
  # (the VM's own index-fault records are).
  flat = tf.nest.flatten(layout.state)
  filed = layout.banks.rest(
      tf.nest.pack_sequence_as(layout.state, range(len(flat))))
  assert all(flat[i].shape.rank == 1
             or layout.owners[i] == vm_layout.NO_VARIABLE for i in filed)
  assert any(flat[i].shape.rank > 1 for i in filed)   # the fault records


@tab.batch
def _shifted(a, n):
  while n > 0:
    a = a + n
    n -= 1
  return a


def test_a_banked_integer_array_a_loop_changes_is_written_back():
  # The loop's block changes the array every iteration: its dispatch
  # scatters the bank row, and each member ends with its own sum.
  z = 4
  a = np.arange(z * 16, dtype=np.int32).reshape(z, 16)
  n = np.array([0, 1, 3, 5], np.int32)
  got = _shifted(a, n, backend="pc:xla")
  np.testing.assert_array_equal(got, a + (n * (n + 1) // 2)[:, None])
  runtime = pipeline.runtime(_shifted, _shifted._last_types,  # pylint: disable=protected-access
                             "pc:xla")
  layout = runtime.layout_for(z)
  array_bank = ("int32", (16,))
  assert layout.banks.sizes[array_bank] >= 1
  assert any(d.bank_capacity[array_bank] for d in layout.dispatches)
