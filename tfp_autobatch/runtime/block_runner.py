"""One block of an IR-2 program, run by the pc VM for the members waiting at it.

`BlockRunner.run` takes the VM's unpacked state (`pc_top`, `pc_sp`,
`overflow`, `vars` and `index_fault`, as `pc_vm` describes) and returns it
with the block's ops and terminator applied to its active members (a member
whose subscript's index is out of range halted), plus the stack writes the
block makes (one `StackWrite` per pushed stack, applied by the VM after the
block) and the rows its `@batched_primitive` calls computed. How the state
is packed into registers and banks, and how blocks are grouped into
dispatches, is the VM's business, not this module's.

Every primitive runs on all Z rows, inactive rows fed a copy of an active
row's inputs (so junk can never raise or poison), and results are kept with
`tf.where(active, new, old)`. Under XLA, which never raises, and in blocks
whose code raises on no values (`raise_free`), inactive rows keep their
own junk. A primitive's fault records (`subscripts`) count for its
members only: a junk row's index out of range is no error. A
`@batched_primitive` runs on the members only
(`batched_primitive_calls`). Temporaries live only in the block's local
environment; a value that is dead after the block is not written back.
"""
import functools

import tensorflow as tf

from tfp_autobatch import errors
from tfp_autobatch.operators import subscripts
from tfp_autobatch.ir import ir2
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.analysis import liveness
from tfp_autobatch.passes import infer_types
from tfp_autobatch.runtime import _tf_private
from tfp_autobatch.runtime import batch_state
from tfp_autobatch.runtime import batched_primitive_calls
from tfp_autobatch.runtime import constant_work
from tfp_autobatch.analysis import raise_free
from tfp_autobatch.runtime import stack_banks
from tfp_autobatch.runtime import vectorize


def _is(cond_value, when):
  """Where a condition register holds `when` (per member). Written `==`,
  not `tf.logical_not` for a False `when`: see `pyops.logical_not`."""
  return tf.equal(tf.cast(cond_value, tf.bool), when)


def _row_sources(mask):
  """Per row, the row to read its inputs from: itself where `mask`, else
  the first row of `mask` (the appended 1 keeps argmax defined for an
  empty batch)."""
  first = tf.cast(tf.argmax(tf.concat([tf.cast(mask, tf.int32), [1]], 0)),
                  tf.int32)
  return tf.where(mask, batch_state.row_indices(batch_state.size(mask)),
                  first)


def _first_faults(faults):
  """`(faulted [Z] bool, fault records [Z, 2])` of a block's primitives:
  `faults` holds (members [Z] bool, fault records) per primitive, as they
  ran. Only members' faults count (other rows compute on junk, or on
  another row's inputs), and a row's first one."""
  faulted = fault = None
  for members, records in faults:
    hit = tf.logical_and(members, subscripts.faulted(records))
    if faulted is None:
      faulted, fault = hit, records
      continue
    hit = tf.logical_and(hit, tf.logical_not(faulted))
    fault = batch_state.where(hit, records, fault)
    faulted = tf.logical_or(faulted, hit)
  return faulted, fault


def _check_hoistable(block):
  """Each hoisted stack takes at most one write per block, after its reads:
  the writes are applied when the block is done."""
  pushed = set()
  for op in map(ir2.unguarded, block.ops):
    if isinstance(op, (ir2.Push, ir2.Pop, ir2.Update)) and op.var in pushed:
      raise errors.IRError(
          f"{block.label}: '{op.var}' is pushed and then used again in one "
          "block; the pc VM applies stack writes at the end of a block")
    if isinstance(op, ir2.Push):
      pushed.add(op.var)


def values_live_out(program):
  """{label: variables whose value may be read after the block}: IR-2
  liveness, plus a function's result where it returns (its caller reads
  it; the analysis has no edge from a return to the continuation)."""
  live = liveness.live_out(program)
  for b in program.blocks:
    if isinstance(b.terminator, (ir2.Return, ir2.ReturnOr)):
      live[b.label] = (live[b.label]
                       | {program.results[ir2.function_of(b.label)]})
  return live


class BlockRunner:
  """Runs single blocks of `program` for their members.

  Args:
    program: the IR-2 program.
    mode: "eager", "graph" or "xla" (as `pc_vm.PcVmRuntime`'s).
    kernels: the `vectorize.KernelCache` the primitives are batched with.
    store: the `variable_store.VariableStore` of the program's variables.
    depth: D, the frames a member may have (a call past it overflows).
  """

  def __init__(self, program, mode, kernels, store, depth):
    self.program = program
    self.mode = mode
    self.kernels = kernels
    self.store = store
    self.depth = depth
    self.live_out = values_live_out(program)
    self.labels = program.block_index()
    # The program's rewritten subscripts: with any, the state holds a
    # fault record per member (`index_fault`, see `subscripts`).
    self.subscript_sites = subscripts.sites_of(
        op.code for b in program.blocks for op in map(ir2.unguarded, b.ops)
        if isinstance(op, ir2.Primitive))
    self._harmless = {}   # block label -> `junk_is_harmless`
    if program.cached_top:
      for block in program.blocks:
        _check_hoistable(block)

  def run(self, index, block, small, stack_view):
    """`(small after, stack writes, model rows, model members)` of block
    `index` run on the unpacked state `small` for the members at it;
    `stack_view(v)` is stack v's [D, Z, ...] buffer, read by pops (and by
    returns, for the pc). Model members: a list of int32 scalars, the
    members each of the block's `@batched_primitive` calls was made for,
    in turn."""
    return BlockExecution(self, index, block, small, stack_view).run()

  def junk_is_harmless(self, block):
    """Whether every primitive of `block` that runs on all rows raises on
    no values (`raise_free`), so that inactive rows need no active row's
    inputs. (A `@batched_primitive` runs on its members' rows only.)"""
    if block.label not in self._harmless:
      self._harmless[block.label] = raise_free.block_cannot_raise(
          self.program, block)
    return self._harmless[block.label]


class BlockExecution:
  """One run of one block on the VM's unpacked state, for its members.

  Built per block as the VM's loop is traced (eagerly: per step), and run
  once (`run`): its ops in turn (`run_op`), reading variables into a
  local environment (`read`) and assigning there (`assign`); primitives on
  every row (`call_primitive`), `@batched_primitive`s on their members
  (`call_batched_primitive`); pushes and pops on the variables' stores
  (`push`, `pop`), their stack writes collected for the VM; then the live
  values written back (`write_back`), the pc moved (`terminate`) and
  index faults recorded (`record_faults`).
  """

  def __init__(self, runner, index, block, small, stack_view):
    self.runner = runner
    self.program = runner.program
    self.mode = runner.mode
    self.block = block
    self.stack_view = stack_view
    self.state = dict(small)
    self.variables = dict(small["vars"])   # variable -> its store
    pc_top = small["pc_top"]
    self.z = batch_state.size(pc_top)
    self.static_z = pc_top.shape[0]   # known in most traces (`compiled_for`)
    if self.static_z == 1 and self.mode == "xla":
      # The one member is at this block: the schedule picked it. Not
      # outside XLA: TensorFlow's graph optimiser (Grappler's constant
      # folding with its dependency optimisation) miscompiles a `tf.cond`
      # whose predicate it folds to a constant inside the VM's loop (the
      # model call's `any member?`, here): the caller's function returns
      # empty float32 tensors for all its results.
      self.active = tf.ones([1], tf.bool)
    else:
      self.active = tf.equal(pc_top, index)
    # Under XLA, which clamps out-of-range indices instead of raising,
    # and for code that raises on no values (`raise_free`), inactive rows
    # compute junk that the write-back's select discards: their inputs
    # need no cleaning.
    self.harmless = self.mode == "xla" or runner.junk_is_harmless(block)
    self.source = None if self.harmless else _row_sources(self.active)
    self.live_out = runner.live_out[block.label]
    self.writes = {}         # stack name -> its StackWrite
    self.env = {}            # variable -> its value in the block
    self.dirty = set()       # variables assigned in the block
    self.model_rows = []     # rows each @batched_primitive call computed
    self.model_members = []  # and the members it was called for
    self.faults = []         # (members, fault records) of each primitive

  def run(self):
    """`(small after, stack writes, model rows, model members)`, as
    `BlockRunner.run` returns them."""
    for op in self.block.ops:
      match op:
        case ir2.Guarded(cond, when, inner):
          self.run_op(inner, _is(self.read(cond), when))
        case _:
          self.run_op(op, None)
    self.write_back()
    self.terminate(self.block.terminator, self.active)
    self.record_faults()
    rows = tf.add_n([tf.constant(0)] + [tf.cast(r, tf.int32)
                                        for r in self.model_rows])
    return self.state, self.writes, rows, self.model_members

  # -- reading and assigning ----------------------------------------------

  def clean_inputs(self, value):
    """`value` with each inactive row replaced by an active row's (unless
    junk is harmless here), so that no primitive raises on junk."""
    if self.harmless:
      return value
    return tf.nest.map_structure(lambda x: tf.gather(x, self.source), value)

  def read(self, v):
    """Variable `v`'s value in the block (every row)."""
    if v not in self.env:
      if v in self.program.temporaries:
        raise errors.IRError(f"{self.block.label}: temporary '{v}' read "
                             "before it is written")
      self.env[v] = self.clean_inputs(
          self.runner.store.value(self.variables[v], v))
    return self.env[v]

  def assign(self, outs, values, guard):
    """Assigns `values` to the variables `outs`, for a guard's members
    only where there is one."""
    for v, value in zip(outs, values):
      if guard is not None and (v in self.env
                                or v not in self.program.temporaries):
        value = batch_state.where(guard, value, self.read(v))
      self.env[v] = value
      self.dirty.add(v)

  def members(self, guard):
    """The members an op runs for: the block's, less a guard's."""
    return (self.active if guard is None
            else tf.logical_and(self.active, guard))

  # -- ops ----------------------------------------------------------------

  def run_op(self, op, guard):
    """One op, for the members of `guard` (all of them if None)."""
    match op:
      case ir2.Primitive(outs, _, _, batched):
        if batched:
          values, rows, count = self.call_batched_primitive(op, guard)
          self.model_rows.append(rows)
          self.model_members.append(count)
        else:
          values = self.call_primitive(op, guard)
          if op.code.subscripts:
            *values, fault = values
            self.faults.append((self.members(guard), fault))
        self.assign(outs, values, guard)
      case ir2.Move(outs, ins):
        self.assign(outs, [vectorize.conform(self.read(v),
                                             self.program.types[v2])
                           for v, v2 in zip(ins, outs)], guard)
      case ir2.Push(v):
        self.push(v, guard)
      case ir2.Pop(v) | ir2.Update(v) if guard is None:
        self.pop(v, keep=isinstance(op, ir2.Update))
      case _:
        raise errors.IRError(f"{self.block.label}: unknown IR-2 op {op!r}")

  def kernel_of(self, op, rows=None, move_into=None):
    """The kernel of `op` on batches of `rows` rows: the batch's own size
    for a primitive; for a `@batched_primitive` the rows it is called on,
    where they are a static size (under `pc:xla`, each of its buckets),
    else any number. `move_into`: the graph a batched primitive's work
    on fixed matrices moves into (`constant_work`)."""
    p = self.program
    if not op.batched:
      rows = self.static_z
    return self.runner.kernels.get(
        op, [p.types[v] for v in op.ins], [p.types[v] for v in op.outs],
        batch_size=rows if isinstance(rows, int) else None,
        move_into=move_into)

  def zeros(self, op):
    """Outputs where nothing was computed: zeros, which no member reads
    (and no faults, for code with rewritten subscripts)."""
    return [types_lib.zeros(self.program.types[v], self.z)
            for v in op.outs] + (
                [subscripts.no_faults(self.z)] if op.code.subscripts else [])

  def call_batched_primitive(self, op, guard):
    """`(values on every row, rows computed, members)` of a
    @batched_primitive: it runs on its members (the block's, less a
    guard's) gathered, and not at all without members (see
    `batched_primitive_calls`)."""
    ins = [self.read(v) for v in op.ins]
    skip = lambda: (self.zeros(op), 0)
    if vectorize.tracing_for_reverse_vm():
      # No constant-work check: kernels traced in place have no graph to read.
      return batched_primitive_calls.on_members_in_buckets_with_vjp(
          functools.partial(self.kernel_of, op), self.z,
          self.members(guard), ins, skip)
    move_into = None
    if self.mode == "xla" or _tf_private.in_xla_context():
      # XLA would redo the work on fixed matrices at every call: it moves
      # before the VM's loop (`constant_work`); a warning names what stays.
      move_into = constant_work.target()
      batched_primitive_calls.warn_of_matrix_work_on_constants(
          self.kernel_of(op, self.static_z, move_into), op.code)
    if self.mode == "xla":
      # Traced for each bucket's static size: XLA cannot compile some
      # models' gradients traced for any number of rows (TFP's
      # CorrelationCholesky bijector, as in LKJ models).
      return batched_primitive_calls.on_members_in_buckets(
          functools.partial(self.kernel_of, op, move_into=move_into),
          self.z, self.members(guard), ins, skip,
          fine=op.code.fine_buckets)
    return batched_primitive_calls.on_members_exactly(
        self.kernel_of(op, move_into=move_into), self.members(guard), ins,
        skip, eager=self.mode == "eager")

  def call_primitive(self, op, guard):
    """The values of another primitive, on every row. It runs on every
    row; with a guard, for its members only: under XLA it still runs on
    every row like the rest of the block, and so does code that raises
    on no values; elsewhere user code may raise on the rows that would
    not have run it (an index past the end that the guard tests for), so
    those rows get a guarded member's inputs, and nothing runs when no
    member is guarded in."""
    ins = [self.read(v) for v in op.ins]
    moved = self.moved(op, ins)
    if moved is not None:
      return moved
    kernel = self.kernel_of(op)
    z = self.z
    if guard is None or self.harmless:
      return kernel(z, *ins)
    runs = self.members(guard)
    source = _row_sources(runs)
    def compute():
      return list(kernel(z, *tf.nest.map_structure(
          lambda x: tf.gather(x, source), ins)))
    if self.mode == "eager":
      return compute() if bool(tf.reduce_any(runs)) else self.zeros(op)
    return tf.cond(tf.reduce_any(runs), compute, lambda: self.zeros(op))

  def moved(self, op, ins):
    """The values of a primitive whose code only moves its inputs
    (`infer_types.moved_inputs`: a copy, a renaming, a tuple's fields),
    which are then its batched inputs themselves, on every row (moving
    raises on none): no kernel is traced, vectorised or called. None for
    any other primitive."""
    types = self.program.types
    sources = infer_types.moved_inputs(op, [types[v] for v in op.ins])
    if sources is None:
      return None
    leaves = tf.nest.flatten(ins)
    values = []
    for v, positions in zip(op.outs, sources):
      out = [leaves[i] for i in positions]
      if not all(tf.is_tensor(x) and x.dtype == t.dtype
                 for x, t in zip(out, tf.nest.flatten(types[v]))):
        return None
      values.append(tf.nest.pack_sequence_as(types[v], out))
    return values

  def push(self, v, guard):
    """Saves `v`'s value on its stack for the guard's members; with a
    cached top, the save is a stack write for the VM to apply."""
    self.variables[v], write = self.runner.store.push(
        self.variables[v], self.read(v), self.members(guard))
    if write is not None:
      self.writes[v] = write

  def pop(self, v, keep):
    """Restores `v`'s saved value for the block's members; `keep` leaves
    the saved copy on the stack (Update)."""
    cached_top = self.program.cached_top
    store, saved = self.runner.store.pop(
        self.variables[v], self.active, keep=keep,
        stack=self.stack_view(v) if cached_top else None)
    if cached_top and v not in self.live_out:
      # Read here, dead after: the top is not written back.
      store = dict(store, top=self.variables[v]["top"])
    self.variables[v] = store
    self.env[v] = self.clean_inputs(saved)
    self.dirty.discard(v)

  # -- after the ops --------------------------------------------------------

  def write_back(self):
    """Writes the values assigned in the block that are live after it
    (temporaries and dead values stay in the block) into the state."""
    for v in sorted((self.dirty - self.program.temporaries)
                    & self.live_out):
      self.variables[v] = self.runner.store.write(
          self.variables[v], v, self.env[v], self.active)
    self.state["vars"] = self.variables

  def terminate(self, terminator, active):
    """Moves the `active` members' pc as `terminator` says (pushing a
    return address into `writes["pc"]` for a call, and halting a member
    whose call would overflow its stack)."""
    state, labels, depth = self.state, self.runner.labels, self.runner.depth
    pc_top = state["pc_top"]
    match terminator:
      case ir2.Jump(target):
        state["pc_top"] = tf.where(active, labels[target], pc_top)
      case ir2.Branch(cond, then_label, else_label):
        taken = tf.cast(self.read(cond), tf.bool)
        state["pc_top"] = tf.where(
            active, tf.where(taken, labels[then_label], labels[else_label]),
            pc_top)
      case ir2.PushJump() | ir2.PushBranch():
        if isinstance(terminator, ir2.PushJump):
          target = labels[terminator.target]
        else:
          target = tf.where(tf.cast(self.read(terminator.cond), tf.bool),
                            labels[terminator.then_label],
                            labels[terminator.else_label])
        sp = state["pc_sp"]
        overflow = active & (sp >= depth)
        ok = active & ~overflow
        self.writes["pc"] = stack_banks.StackWrite(
            tf.minimum(sp, depth - 1),
            tf.fill(tf.shape(sp), labels[terminator.return_label]), ok)
        state["pc_sp"] = sp + tf.cast(ok, tf.int32)
        state["pc_top"] = tf.where(
            ok, target, tf.where(overflow, self.program.halt, pc_top))
        state["overflow"] = state["overflow"] | overflow
      case ir2.Return():
        sp = state["pc_sp"] - tf.cast(active, tf.int32)
        back = stack_banks.rows_at(self.stack_view("pc"), tf.maximum(sp, 0))
        state["pc_sp"] = sp
        state["pc_top"] = tf.where(active, back, pc_top)
      case ir2.ReturnOr(cond, when, otherwise):
        returning = active & _is(self.read(cond), when)
        # The two sets of members touch disjoint rows of the pc state.
        self.terminate(otherwise, active & ~returning)
        self.terminate(ir2.Return(), returning)
      case _:
        raise errors.IRError(f"unknown IR-2 terminator {terminator!r}")

  def record_faults(self):
    """Halts each member at its first index fault, recording it: the VM
    then raises, or poisons the member's results (`pc_vm`)."""
    if not self.faults:
      return
    faulted, fault = _first_faults(self.faults)
    self.state["index_fault"] = batch_state.where(
        faulted, fault, self.state["index_fault"])
    self.state["pc_top"] = tf.where(faulted, self.program.halt,
                                    self.state["pc_top"])
