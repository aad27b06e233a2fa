"""The pc VM's memory layout, planned from the program before tracing.

The VM's loop state (`pc_vm`) is packed for `tf.switch_case`: integer and
boolean registers in register files (`register_file.RegisterFile`),
floating-point registers in banks (`register_file.RegisterBanks`), and
the integer and boolean variables' registers too where there are many of
them on enough members (`INTEGER_BANKS_FROM_LEAVES`) and those that hold
arrays, stacks in stack banks (`stack_banks.StackBanks`), and blocks
grouped into dispatches by how much they write back (`dispatch`). All of
that follows from the IR-2 program, its variables' types (the arguments'
among them), the stack depth and the batch size, so `plan` computes it as
one value, `VmLayout`, from `tf.TensorSpec`s of the state: the VM traces
its loop against that value instead of discovering the layout while it
builds its initial state.
"""
import dataclasses
import types
import typing

import tensorflow as tf

from tfp_autobatch import errors
from tfp_autobatch.operators import subscripts
from tfp_autobatch.ir import ir2
from tfp_autobatch.runtime import block_runner
from tfp_autobatch.runtime import dispatch as dispatch_lib
from tfp_autobatch.runtime import register_file
from tfp_autobatch.runtime import run_counters
from tfp_autobatch.runtime import stack_banks
from tfp_autobatch.runtime import variable_store

# The leaves of the unpacked state that are not a variable's: their owner
# name in `VmLayout.owners`.
NO_VARIABLE = ""

# A program's integer and boolean variables go to register banks, not the
# register file, from this many such leaves and this many members (known
# when traced). A file is written back whole by every block; a bank only
# where a block changes it, at the price of a scatter a step. NUTS (about
# fifty such leaves, a few changed a block) samples faster with banks at
# 64 and 256 chains and slower at 16 (`python -m benchmarks.ess
# --systems=pc:xla`); collatz (a handful of leaves, most changed every
# step) lost a third of its speed at 64 and 1,024 members
# (`python -m benchmarks.programs`).
INTEGER_BANKS_FROM_BATCH = 64
INTEGER_BANKS_FROM_LEAVES = 16

# Below those, an integer or boolean array register (a per-member shape)
# of at least this many elements per member goes to a bank too (see
# `_integer_leaves_to_bank`); smaller ones, such as a seed's two, cost a
# step less in the file than the scatter a bank's writers run.
INTEGER_ARRAY_BANK_FROM_ELEMENTS = 16


@dataclasses.dataclass(frozen=True)
class VmLayout:
  """Where the VM keeps each part of its state for one batch size.

  Attributes:
    batch_size: Z, the members, where known statically (else None: one
      trace for any size).
    depth: D, the frames of every stack.
    state: the unpacked loop state (`pc_vm`'s module docstring: `pc_top`,
      `pc_sp`, `overflow`, the run counters' per-member registers, `vars`,
      and `index_fault` for a program with rewritten subscripts) as a nest
      of `tf.TensorSpec`s.
    stacks_spec: {stack name: nest of [D, Z, ...] `tf.TensorSpec`s}: the
      stacks kept apart from `state` ("pc", and with a cached top every
      stacked variable's).
    owners: per flat leaf of `state`, the variable it belongs to
      (`v + "#sp"` for a stacked variable's stack pointer, `NO_VARIABLE`
      for the pc, overflow flags, run counters and fault records).
    banks: which leaves of `state` live in register banks (XLA with a
      cached top; otherwise none): the floating-point ones, and the
      integer and boolean variables' where `_integer_leaves_to_bank` says
      so.
    registers: how the leaves outside the banks are packed into register
      files (XLA with a cached top; otherwise each travels alone).
    pc_positions: {"pc_top": i, "pc_sp": j}, their flat positions among
      the leaves outside the banks (`registers`' leaves), read alone by
      the loop's condition.
    stacks: how `stacks_spec` is kept: in banks by dtype and shape under
      XLA with a cached top, else one buffer per leaf.
    pushed: per block, the names of the stacks it writes (the variables it
      pushes, with a cached top, and "pc" where it calls).
    changed: per block, the flat positions of `state` it may change (stack
      pointers it moves, and the values it assigns, pops or updates that
      are live after it): a bank row outside them is never written back.
    dispatches: the blocks grouped for the loop's `tf.switch_case`s (one
      group unless under XLA with a cached top; see `dispatch`), in the
      order the loop runs them.
    dispatch_of: {block index: its dispatch}.
    model_calls: {dispatch's blocks: the most `@batched_primitive` calls
      one of its blocks makes}: each of its blocks reports that many
      calls' members.
  """
  batch_size: typing.Optional[int]
  depth: int
  state: dict
  stacks_spec: dict
  owners: tuple
  banks: register_file.RegisterBanks
  registers: register_file.RegisterFile
  pc_positions: typing.Mapping[str, int]
  stacks: stack_banks.StackBanks
  pushed: tuple
  changed: tuple
  dispatches: tuple
  dispatch_of: typing.Mapping[int, dispatch_lib.Dispatch]
  model_calls: typing.Mapping[tuple, int]

  @property
  def has_index_fault(self):
    """Whether the state holds fault records (rewritten subscripts)."""
    return "index_fault" in self.state

  def check_state(self, state, stacks):
    """Raises `errors.IRError` unless the traced `state` and `stacks`
    (tensors) have the structure, dtypes and shapes planned here."""
    for what, planned, traced in (("state", self.state, state),
                                  ("stacks", self.stacks_spec, stacks)):
      try:
        tf.nest.assert_same_structure(planned, traced)
      except (ValueError, TypeError) as e:
        raise errors.IRError(
            f"the VM's traced {what} is not the one its layout planned: "
            f"{e}") from e
      for spec, tensor in zip(tf.nest.flatten(planned),
                              tf.nest.flatten(traced)):
        if (spec.dtype != tensor.dtype
            or not spec.shape.is_compatible_with(tensor.shape)):
          raise errors.IRError(
              f"the VM's traced {what} holds {tensor.dtype.name}"
              f"{tensor.shape} where its layout planned {spec}")


def pushed_stacks(program, block):
  """The stacks `block` writes: the variables it pushes (with a cached
  top), and the pc's if it calls."""
  names = set()
  if program.cached_top:
    names = {ir2.unguarded(op).var for op in block.ops
             if isinstance(ir2.unguarded(op), ir2.Push)}
  if ir2.call_of(block.terminator):
    names.add("pc")
  return frozenset(names)


def changed_positions(program, live_out, owners):
  """Per block, the flat positions of the state (whose leaves belong to
  the variables `owners`) that the block may change: the stack pointers
  of what it pushes, pops or updates, and the values it assigns, pops or
  updates that are still live after it (`live_out`; a dead value is not
  written back)."""
  positions = []
  for block in program.blocks:
    changed, assigned = set(), set()
    for op in map(ir2.unguarded, block.ops):
      if isinstance(op, ir2.Push):
        changed.add(op.var + "#sp")
      elif isinstance(op, (ir2.Pop, ir2.Update)):
        changed.add(op.var + "#sp")
        assigned.add(op.var)
      else:
        assigned.update(ir2.writes(op))
    changed |= (assigned - program.temporaries) & live_out[block.label]
    positions.append(frozenset(i for i, owner in enumerate(owners)
                               if owner in changed))
  return tuple(positions)


def state_specs(program, batch_size, depth):
  """`(state, stacks)`: the VM's unpacked initial state and its stacks as
  `tf.TensorSpec`s (see `VmLayout`)."""
  z = batch_size
  store = variable_store.VariableStore(program.stacked, program.cached_top,
                                       depth)
  variables = {}
  stacks = {"pc": tf.TensorSpec([depth, z], tf.int32)}
  for v in sorted(set(program.types) - program.temporaries):
    variables[v], stack = store.initial_spec(v, program.types[v], z)
    if stack is not None:
      stacks[v] = stack
  state = {
      "vars": variables,
      "pc_top": tf.TensorSpec([z], tf.int32),
      "pc_sp": tf.TensorSpec([z], tf.int32),
      "overflow": tf.TensorSpec([z], tf.bool),
      **{name: tf.TensorSpec([z], tf.int32)
         for name in run_counters.MEMBER_REGISTERS},
  }
  if subscripts.sites_of(
      op.code for b in program.blocks for op in map(ir2.unguarded, b.ops)
      if isinstance(op, ir2.Primitive)):
    state["index_fault"] = tf.TensorSpec([z, subscripts.WIDTH], tf.int32)
  return state, stacks


def _owners(program, state):
  """Per flat leaf of `state`, the variable it belongs to (`VmLayout`)."""
  def owner(v, store):
    if v not in program.stacked:
      return tf.nest.map_structure(lambda _: v, store)
    return {k: tf.nest.map_structure(
        lambda _, k=k: v + "#sp" if k == "sp" else v, x)
            for k, x in store.items()}
  return tuple(tf.nest.flatten(dict(
      tf.nest.map_structure(lambda _: NO_VARIABLE, state),
      vars={v: owner(v, store) for v, store in state["vars"].items()})))


def _integer_leaves_to_bank(state, owners, batch_size):
  """Per flat leaf of `state`, whether it is an integer or boolean
  variable's leaf that goes to a register bank rather than the register
  file (`register_file`): all of them, where the program has at least
  `INTEGER_BANKS_FROM_LEAVES` and the batch (known when traced) at least
  `INTEGER_BANKS_FROM_BATCH` members; otherwise the arrays of at least
  `INTEGER_ARRAY_BANK_FROM_ELEMENTS` elements per member. The VM's own
  registers (the pc, the overflow flags, the run counters) stay in the
  file: every block changes them.

  A file is written back whole by every block, so a register there costs
  every VM step its width, where in a bank it costs only the steps of the
  blocks that change it: nothing for the TreeLSTM's trees (three index
  arrays per member, set by the entry block alone), which in the file
  were most of what every step of its descent copied.
  """
  specs = tf.nest.flatten(state)
  integer = [owner != NO_VARIABLE
             and register_file.is_integer_or_bool(spec.dtype)
             for spec, owner in zip(specs, owners)]
  wide = (sum(integer) >= INTEGER_BANKS_FROM_LEAVES
          and batch_size is not None
          and batch_size >= INTEGER_BANKS_FROM_BATCH)
  def array(spec):
    elements = spec.shape[1:].num_elements()
    return (elements is not None
            and elements >= INTEGER_ARRAY_BANK_FROM_ELEMENTS)
  return [i and (wide or array(spec)) for i, spec in zip(integer, specs)]


def plan(program, batch_size, depth, xla, live_out=None):
  """The `VmLayout` of `program` (IR-2) for a batch of `batch_size`
  members (None: unknown until run time) with stacks of `depth` frames.

  `xla`: whether the VM is compiled by XLA (`pc:xla`), the only mode whose
  state is packed: elsewhere the slices and concatenations that packing
  costs are ops of their own, which cost more than they save. The
  unoptimised layout (no cached top) keeps [D, Z, ...] stacks among the
  variables, which are not rows of the batch: nothing is packed there.
  `live_out`: the program's `block_runner.values_live_out`, where the caller
  has it.
  """
  if live_out is None:
    live_out = block_runner.values_live_out(program)
  packed = xla and program.cached_top
  state, stacks_spec = state_specs(program, batch_size, depth)
  owners = _owners(program, state)
  banks = register_file.RegisterBanks(
      state, enabled=packed, names=list(owners),
      integer_leaves=_integer_leaves_to_bank(state, owners, batch_size))
  rest = banks.rest(state)
  registers = register_file.RegisterFile(rest, enabled=packed)
  # The pc is never banked (ints): its positions among `rest`.
  positions = tf.nest.pack_sequence_as(
      state, range(len(tf.nest.flatten(state))))
  rest_positions = banks.rest(positions)
  pc_positions = types.MappingProxyType({
      name: rest_positions.index(positions[name])
      for name in ("pc_top", "pc_sp")})
  stacks = stack_banks.StackBanks(stacks_spec, depth, enabled=packed)
  pushed = tuple(pushed_stacks(program, b) for b in program.blocks)
  changed = changed_positions(program, live_out, owners)
  dispatches = tuple(dispatch_lib.group_blocks(
      changed, pushed, banks, stacks, batch_size, xla))
  return VmLayout(
      batch_size=batch_size,
      depth=depth,
      state=state,
      stacks_spec=stacks_spec,
      owners=owners,
      banks=banks,
      registers=registers,
      pc_positions=pc_positions,
      stacks=stacks,
      pushed=pushed,
      changed=changed,
      dispatches=dispatches,
      dispatch_of=types.MappingProxyType(
          {i: d for d in dispatches for i in d.blocks}),
      model_calls=types.MappingProxyType({
          d.blocks: max(ir2.batched_primitive_calls(program.blocks[i])
                        for i in d.blocks)
          for d in dispatches}))
