"""Program-counter autobatching (paper Algorithm 2) of an IR-2 program.

The VM state is a dict of tensors with batch dimension Z:

  pc_top [Z], pc_sp [Z], stacks["pc"] [D, Z]
                                           block each member waits at, and
                                           its return addresses
  vars[v] = [Z, ...]                       a register
  vars[v] = {top [Z, ...], sp [Z]}, stacks[v] [D, Z, ...]
                                           a stacked variable (cached top)
  vars[v] = {stack [D, Z, ...], sp [Z]}    a stacked variable, value at sp
  overflow [Z], and the statistics counters (`run_counters`);
  index_fault [Z, 2]                       for a program with rewritten
                                           subscripts: each member's first
                                           index out of range (`subscripts`)

The big [D, Z, ...] buffers of `stacks` stay out of the blocks' results: a
block only reads them and returns one `StackWrite` per stack it pushes (the
row each member writes, the values, a mask), which the loop applies after
the block with a scatter. Under XLA that scatter updates the loop's buffer
in place, so a step costs O(Z) per written stack instead of a copy of every
stack (a buffer returned from a `tf.switch_case` branch is copied whole),
and the stacks are kept in banks by dtype and shape, a scatter per bank
(`stack_banks`). With the top not cached, stacks are written at several
rows per block and stay in `vars` (the unoptimised layout, kept for
comparison).

Each step picks a block (the lowest waiting pc, or the one most members wait
at; `schedule`), and runs it for the members waiting there (`block_runner`:
primitives on every row with inactive rows' results discarded, the model on
the members only, gathered). Each block is traced as a function of the
loop state with its index static (paper Fig. 5): in graph mode the loop is
a `tf.while_loop` over `tf.switch_case(next_pc, blocks)`.
Under XLA the blocks are split into dispatches by how much they write back
(`dispatch`), each a `tf.while_loop` over its own `tf.switch_case` that runs
while the next block is one of its, inside a loop that runs until every
member halts: a block then pads its register and stack writes only to the
largest writer of its dispatch, not of the program.

A PushJump past `max_stack_depth` halts the member and sets its overflow
flag; called eagerly, `run` raises `StackOverflowError`. Inside a user's graph
the result rows of overflowed members are poisoned (NaN for floats, the
dtype's minimum for integers, False for booleans) and a `tf.debugging.Assert`
fails the graph; under the user's XLA, which drops asserts, the poisoned rows
are what remains. A subscript's index out of range (checked on every
backend, since XLA's gather clamps it) likewise halts the member and
records where (`index_fault`): `run` raises `IndexOutOfRangeError` naming
the subscript's line, or fails the user's graph with an assertion saying
it, or poisons the member's results under the user's XLA.
"""
import concurrent.futures
import contextvars
import functools
import threading

import numpy as np
import tensorflow as tf

from tfp_autobatch import errors
from tfp_autobatch.operators import subscripts
from tfp_autobatch.ir import ir2
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.runtime import _tf_private
from tfp_autobatch.runtime import batch_state
from tfp_autobatch.runtime import block_runner
from tfp_autobatch.runtime import dispatch as dispatch_lib
from tfp_autobatch.runtime import no_gradient
from tfp_autobatch.runtime import pfor_conditions
from tfp_autobatch.runtime import register_file
from tfp_autobatch.runtime import run_counters
from tfp_autobatch.runtime import schedule as schedule_lib
from tfp_autobatch.runtime import stack_banks
from tfp_autobatch.runtime import stats as stats_lib
from tfp_autobatch.runtime import variable_store
from tfp_autobatch.runtime import vectorize

# How many static batch sizes `pc:graph` traces a VM of its own for (each
# trace costs a first call: about 0.7 s for fib, several seconds for NUTS);
# further sizes share one trace for any size (`PcVmRuntime.compiled_for`).
GRAPH_SIZES_TRACED = 8

# The name scope of block i's ops in the compiled loop is BLOCK_SCOPE + i
# (for profiles: XLA keeps TensorFlow's op names in its instructions'
# metadata).
BLOCK_SCOPE = "vm_block_"


def _poison(value, mask):
  def leaf(x):
    if x.dtype.is_floating or x.dtype.is_complex:
      bad = tf.constant(np.nan, x.dtype)
    elif x.dtype.is_integer:
      bad = tf.constant(x.dtype.min, x.dtype)
    else:
      bad = tf.zeros([], x.dtype)
    return batch_state.where(mask, tf.fill(tf.shape(x), bad), x)
  return tf.nest.map_structure(leaf, value)


class PcVmRuntime:
  """Runs an optimised IR-2 program on a batch.

  Args:
    program: the IR-2 program (`pipeline.stack_program_of`).
    max_stack_depth: D, the frames a member may have (entry included).
    mode: "eager" (Python loop, for debugging), "graph" or "xla".
    schedule: which block runs next, one of `schedule.SCHEDULES` (see
      `schedule`).
  """

  # Of this thread's last run: RunStats eagerly, the counts as tensors traced.
  stats = stats_lib.PerThread()
  stats_tensors = stats_lib.PerThread()

  def __init__(self, program, max_stack_depth, mode="graph",
               schedule="lowest_pc"):
    if mode not in ("eager", "graph", "xla"):
      raise ValueError(f"mode must be eager, graph or xla, not {mode!r}")
    self.program = program
    self.depth = int(max_stack_depth)
    self.mode = mode
    self.schedule = schedule_lib.Schedule(program, schedule)
    self.kernels = vectorize.KernelCache(jit_compile=False,
                                         inside_xla=mode == "xla")
    self.trace_count = 0
    self._eager_lock = threading.Lock()
    self._labels = [b.label for b in program.blocks]
    self._store = variable_store.VariableStore(
        program.stacked, program.cached_top, self.depth)
    self._runner = block_runner.BlockRunner(program, mode, self.kernels,
                                            self._store, self.depth)
    self._subscript_sites = self._runner.subscript_sites
    # (static batch size or None, traced for the caller's XLA) -> tf.function
    self._compiled = {}
    self._concrete = {}   # its tf.function -> its concrete function

  # -- the public interface shared with LocalStaticRuntime -------------------

  def run(self, args, batch_size):
    del batch_size   # taken from the tensors: it may be unknown at trace time
    if self.mode == "eager":
      # One run at a time: the eager VM's blocks and stack banks are traced
      # for the run's batch size, and two threads' runs crossed them.
      with self._eager_lock:
        result, overflow, faults, counters = self._execute(args, eager=True)
    else:
      eager = tf.executing_eagerly()
      compiled_by_xla = self.mode == "xla" or (
          not eager and pfor_conditions.in_xla_context())
      # A traced function to call: eagerly and wherever XLA compiles the
      # VM (see `_concrete_for`); pc:graph in a graph without XLA traces in
      # it, under the tapes, which then differentiate through the VM.
      if not (eager or compiled_by_xla):
        outs = self.compiled_for(args)(*args)
      # (Eagerly only while a tape records: the wrapper costs an eager
      # call about 0.15 ms.)
      elif compiled_by_xla and (not eager or _tf_private.record.could_possibly_record()):
        outs = self._without_gradient(self._concrete_for(args), *args)
      else:
        outs = _tf_private.call_concrete(self._concrete_for(args), args)
      result, overflow, faults, counters = outs
    counters, overflowed, faulted = run_counters.split_ended(
        counters.numpy() if tf.executing_eagerly() else counters)
    message = (f"stack depth exceeded: recursion went deeper than "
               f"max_stack_depth={self.depth}; raise max_stack_depth=... in "
               "@tab.batch(max_stack_depth=...)")
    if tf.executing_eagerly():
      # The counters were read in one `.numpy()` with the members that
      # overflowed or faulted (`run_counters.ended`): each read of another
      # result, and an eager reduction, would cost about 10 us more.
      self.stats = run_counters.to_stats(counters, overflow.shape[0],
                                         self._labels)
      self.stats_tensors = None
      # (A member halts at its first index fault, which may have sent it
      # on to the call that overflowed.)
      if faulted:
        subscripts.raise_first(faults.numpy())
      if overflowed:
        raise errors.StackOverflowError(message)
      return result
    self.stats = None
    self.stats_tensors = run_counters.to_tensors(counters, self._labels)
    checks = [tf.debugging.Assert(tf.logical_not(tf.reduce_any(overflow)),
                                  ["tfp_autobatch: " + message])]
    # (Not where XLA compiles the caller, which drops assertions and
    # cannot compile the message's strings: the results are poisoned.)
    if self._subscript_sites and not pfor_conditions.in_xla_context():
      checks.append(subscripts.assert_no_fault(faults,
                                               self._subscript_sites))
    # pc:graph's trace for any batch size (past its first sizes, see
    # `compiled_for`) returns results of unknown batch size: they keep the
    # inputs' static one (a tf.while_loop whose variable they are rejected
    # the unknown one).
    size = tf.TensorShape([_static_batch_size(args)])
    def output(x):
      x = tf.identity(x)
      x.set_shape(size.concatenate(x.shape[1:]))
      return x
    with tf.control_dependencies(checks):
      return tf.nest.map_structure(output, result)

  def _without_gradient(self, vm, *args):
    """`vm(*args)` for a VM compiled by XLA, which has no gradient:
    runs forward under tapes, a gradient is a clear error
    (`no_gradient`)."""
    mode = "pc:xla" if self.mode == "xla" else (
        "pc:graph inside tf.function(jit_compile=True)")
    return no_gradient.call(vm, args, (
        f"tfp_autobatch: {mode} is not differentiable (XLA compiles "
        "the VM's loop and its in-place writes, which have no "
        "gradient); take gradients through backend='pc:graph' (in a "
        "tf.function without jit_compile), 'pc:eager', 'local:eager' "
        "or 'local:eager_xla', or put tf.stop_gradient on its results"))

  def compiled_for(self, args):
    """The VM's `tf.function` for a batch like `args`.

    `pc:xla` compiles per batch size anyway, and traces per static batch
    size as well: with the size known, pfor reads each row of a
    primitive's inputs as the input itself, where with an unknown size it
    gathers every row by its index (a gather XLA does not remove, and
    repeats inside the fused kernels that read it): one NUTS transition
    on the 100-d Gaussian at 4 chains went from 5.7 to 4.1 ms in an
    in-process A/B (benchmarks/results/HISTORY.md, "Cost of a VM step,
    change by change"). `pc:graph` traces per static batch size for its
    first `GRAPH_SIZES_TRACED` sizes, and once more for all other sizes
    (the batch dimension left unknown): TensorFlow folds the known size's
    shapes, ranges and fills out of the loop, and pfor's row gathers with
    it (fib on 4 members: 239 graph nodes run per VM step with the size
    unknown, 198 with it known). A batch of unknown size (inside a
    caller's `tf.function` with unknown shapes) gets the unknown-size
    trace. `pc:graph` inside a caller's
    `tf.function(jit_compile=True)` gets a trace of its own, which XLA can
    compile (`pfor_conditions`), and which is called as pc:xla's is
    (`_concrete_for`).
    """
    size = _static_batch_size(args)
    for_xla = self.mode == "graph" and pfor_conditions.in_xla_context()
    if (self.mode == "graph" and (size, for_xla) not in self._compiled
        and sum(s is not None for s, _ in self._compiled)
        >= GRAPH_SIZES_TRACED):
      size = None
    key = (size, for_xla)
    compiled = self._compiled.get(key)
    if compiled is None:
      signature = [tf.nest.map_structure(lambda t: t.spec((size,)),
                                         self.program.types[v])
                   for v in self.program.params]
      # A partial: TF's retracing detector would count all VMs as one
      # function. pc:graph's trace for the user's XLA has `jit_compile`
      # too, so that traced in a thread of its own (`_concrete_for`) it
      # is still traced in an XLA context (`pfor_conditions`).
      compiled = self._compiled[key] = tf.function(
          functools.partial(self._traced),
          jit_compile=self.mode == "xla" or key[1],
          input_signature=signature, autograph=False)
    return compiled

  def _concrete_for(self, args):
    """`compiled_for(args)`'s concrete function, for eager calls, and in
    a graph wherever XLA compiles the VM (pc:xla, and pc:graph inside the
    caller's `jit_compile`): traced apart from the tapes recording there,
    which a trace under them would meet (see `_traced_without_tapes`).
    pc:graph used to trace in place under the caller's tapes: a persistent
    tape, or two tapes, had TensorFlow wrap the VM's `tf.while_loop` for
    their higher-order gradients, with accumulators that XLA cannot size,
    and the forward call failed ("XLA compilation requires a fixed tensor
    list size"; a NUTS step gave no result after minutes, at over 10 GB
    of memory).

    Calling a `tf.function` binds and checks its arguments against its
    signature and looks up its trace on every call; calling the trace (its
    concrete function) directly skips that, most of a small batch's call:
    collatz on one member went from 0.43-0.45 to 0.28-0.33 ms a call with
    this and the overflow flags read in NumPy (`benchmarks.programs`, 2
    CPU cores; benchmarks/README.md, "Batched programs against TFP's
    reference autobatching")."""
    compiled = self.compiled_for(args)
    concrete = self._concrete.get(compiled)
    if concrete is None:
      if _tf_private.record.could_possibly_record():
        concrete = _traced_without_tapes(compiled)
      else:
        concrete = compiled.get_concrete_function()
      self._concrete[compiled] = concrete
    return concrete

  def _traced(self, *args):
    self.trace_count += 1
    return self._execute(list(args), eager=False)

  # -- the loop -------------------------------------------------------------

  def _execute(self, args, eager):
    state = self._initial_state(args)
    halt = self.program.halt
    if eager:
      while True:
        nxt = int(self.schedule.next_block(self._small(state)["pc_top"]))
        if nxt >= halt:
          break
        state = self._step(nxt, state, eager=True)
        small = self._small(state)
        if bool(tf.reduce_any(small["overflow"])) or (
            self._subscript_sites
            and bool(tf.reduce_any(subscripts.faulted(small["index_fault"])))):
          break
    else:
      def run(dispatch):
        def body(nxt, state):
          state = self._step(nxt, state, eager=False, dispatch=dispatch)
          return (self.schedule.next_block(self._register(state, "pc_top")),
                  state)
        return body
      start = (self.schedule.next_block(self._register(state, "pc_top")),
               state)
      if len(self._dispatches) == 1:
        _, state = tf.while_loop(lambda nxt, state: nxt < halt,
                                 run(self._dispatches[0]), start)
      else:
        # A loop per dispatch, each running its blocks while the next block
        # is one of them, in a loop that runs until every member halts.
        # Each loop applies its own dispatch's bank writes (a scatter in a
        # conditional's branch would copy the whole bank instead).
        number = [self._dispatches.index(self._dispatch_of[i])
                  for i in range(halt)] + [-1]
        def body(nxt, state):
          for n, dispatch in enumerate(self._dispatches):
            def loop(nxt, state, n=n, dispatch=dispatch):
              return tf.while_loop(
                  lambda nxt, state: tf.equal(
                      tf.gather(tf.constant(number, tf.int32), nxt), n),
                  run(dispatch), (nxt, state))
            # Each loop in a function of its own: TF 2.21's XLA bridge
            # fails on three or more loops in a row in one function
            # ("Cannot find body function ..._const_0",
            # tensorflow/tensorflow#122886). A partial, as in
            # `compiled_for`: TF's retracing detector would count the loops
            # as one function traced again and again.
            nxt, state = tf.function(functools.partial(loop),
                                     autograph=False)(nxt, state)
          return nxt, state
        _, state = tf.while_loop(lambda nxt, state: nxt < halt, body, start)
    small = self._small(state)
    result = self._store.value(small["vars"][self.program.result],
                         self.program.result)
    faults = small.get("index_fault", subscripts.no_faults(0))
    halted = small["overflow"]
    faulted = tf.zeros([0], tf.bool)
    if self._subscript_sites:
      faulted = subscripts.faulted(faults)
      halted = tf.logical_or(halted, faulted)
    return (_poison(result, halted), small["overflow"], faults,
            run_counters.ended(state["counters"], small["overflow"],
                               faulted))

  def _small(self, state):
    """The registers, pc and overflow flags, unpacked from the loop state."""
    return self._banks.join(state["banks"],
                            self._registers.unpack(*state["registers"]))

  def _register(self, state, name):
    """`pc_top` or `pc_sp` alone from the loop state, without unpacking
    the rest (`_small` builds every leaf: a few hundred ops for the trace
    each time, about a fifth of a NUTS trace's ops before)."""
    return self._registers.unpack_leaf(*state["registers"],
                                       self._pc_positions[name])

  def _step(self, nxt, state, eager, dispatch=None):
    """Runs block `nxt`, then applies its stack writes outside the block;
    `nxt` is one of `dispatch`'s blocks (a tensor; eagerly an int, whose
    dispatch is looked up).

    A block returns its registers and its stack writes packed (see
    `register_file`); the run counters (`run_counters`) are kept here,
    outside the switch.
    """
    stacks = state["stacks"]
    if eager:
      dispatch = self._dispatch_of[nxt]
      registers, bank_writes, packed_writes, rows, members = (
          self._run_block(nxt, state))
    else:
      blocks = dispatch.blocks
      def run(i):
        with tf.name_scope(f"{BLOCK_SCOPE}{i}"):
          return self._run_block(i, state)
      branches = [functools.partial(run, i) for i in blocks]
      if len(blocks) == 1:
        # Still a conditional (with a branch that is never taken): a block
        # inlined into the loop lets XLA fuse its reads of the banks into
        # the loop's in-place writes to them, and XLA then copies the banks
        # every step (2x slower NUTS steps when the hot blocks were alone in
        # their dispatches).
        index = tf.cast(tf.not_equal(nxt, blocks[0]), tf.int32)
        branches.append(lambda: self._no_block(state, dispatch))
      else:
        # The block's branch in this dispatch.
        index = (nxt if blocks == tuple(range(self.program.halt)) else
                 tf.gather(tf.constant(np.searchsorted(
                     blocks, range(self.program.halt)), tf.int32), nxt))
      outputs = tf.switch_case(index, branches)
      registers, bank_writes, packed_writes, rows, members = outputs
    writes = dispatch.writes.unpack(*packed_writes)
    banks = self._banks.apply(state["banks"], bank_writes)
    pc_top = self._register(state, "pc_top")
    pc_sp = self._register({"registers": registers}, "pc_sp")
    return {
        "registers": registers,
        "banks": banks,
        "stacks": self._apply_stack_writes(stacks, writes, nxt, dispatch,
                                           eager),
        "counters": run_counters.after_step(
            state["counters"], nxt, self.program.halt, pc_top, pc_sp, rows,
            members if self._model_calls[dispatch.blocks] else None),
    }

  def _apply_stack_writes(self, stacks, writes, nxt, dispatch, eager):
    """The stacks after block `nxt` of `dispatch` wrote `writes`.

    Under XLA every stack takes its write (a scatter in place; masked-off
    rows are skipped). Elsewhere TensorFlow's scatter copies the whole
    [D, Z, ...] stack, and a write that writes nothing still gathers and
    writes back every row, so only the stacks that the block writes are
    written: a conditional on the block for those some block of the
    dispatch writes, nothing for the others (fib on 4,096 members under
    `pc:graph` copied its three stacks every step)."""
    xla = self.mode == "xla"
    if xla or pfor_conditions.in_xla_context():
      return self._stacks.apply(stacks, writes, xla=xla)
    out = dict(stacks)
    for name in self._stacks.names:
      writers = [i for i in dispatch.blocks if name in self._pushed[i]]
      def apply(name=name):
        return stack_banks.apply_stack_write(stacks[name], writes[name])
      if eager:
        if nxt in writers:
          out[name] = apply()
      elif writers:
        writes_it = tf.gather(tf.constant(
            [i in writers for i in range(self.program.halt)]), nxt)
        out[name] = tf.cond(writes_it, apply, lambda name=name: stacks[name])
    return out

  def _no_block(self, state, dispatch):
    """What a block of `dispatch` that changes nothing returns: the packed
    registers as they are (unpacking and packing them again would cost the
    trace a few hundred ops), and writes that write nothing."""
    # Only the banked leaves are read (by `changes`, for the padding).
    banked = self._banks.join(state["banks"],
                              [None] * self._registers.num_leaves)
    z = batch_state.size(self._register(state, "pc_top"))
    return (state["registers"],
            self._banks.changes(banked, banked, frozenset(),
                                dispatch.bank_capacity),
            dispatch.writes.pack(self._stacks.pack({}, z,
                                                   dispatch.stack_capacity)),
            tf.constant(0),
            tf.fill([self._model_calls[dispatch.blocks]], -1))

  def _initial_state(self, args):
    p = self.program
    leaves = tf.nest.flatten(args)
    z = batch_state.size(leaves[0])
    d = self.depth
    values = dict(zip(p.params, args))
    variables = {}
    zeros = {}   # one tensor per type (`types_lib.zeros`)
    halt = tf.fill([z], p.halt)
    stacks = {"pc": tf.concat([halt[None], tf.zeros([d - 1, z], tf.int32)],
                              0)}
    for v in sorted(set(p.types) - p.temporaries):
      t = p.types[v]
      if v in values:
        value = vectorize.conform(values[v], t)
      else:
        value = types_lib.zeros(t, z, cache=zeros)
      variables[v], stack = self._store.initial(v, value, t, z)
      if stack is not None:
        stacks[v] = stack
    small = {
        "vars": variables,
        "pc_top": tf.zeros([z], tf.int32),
        "pc_sp": tf.ones([z], tf.int32),
        "overflow": tf.zeros([z], tf.bool),
    }
    if self._subscript_sites:
      small["index_fault"] = subscripts.no_faults(z)
    # Packing pays under XLA only (elsewhere the slices and concatenations
    # are ops of their own; the test suite ran 3x slower with them). The
    # unoptimised layout keeps [D, Z, ...] stacks among the variables:
    # those are not rows of the batch, so nothing is packed there.
    pack = self.mode == "xla"
    # The variable each leaf of `small` belongs to ("" for the pc etc.;
    # "v#sp" for a stacked variable's stack pointer).
    def owner(v, store):
      if v not in p.stacked:
        return tf.nest.map_structure(lambda _: v, store)
      return {k: tf.nest.map_structure(
          lambda _, k=k: v + "#sp" if k == "sp" else v, x)
              for k, x in store.items()}
    owners = tf.nest.flatten(dict(
        tf.nest.map_structure(lambda _: "", small),
        vars={v: owner(v, store) for v, store in variables.items()}))
    self._banks = register_file.RegisterBanks(
        small, enabled=pack and p.cached_top, names=owners)
    banks, rest = self._banks.split(small)
    self._changed = self._changed_positions(owners)
    self._registers = register_file.RegisterFile(
        rest, enabled=pack and p.cached_top)
    # Where the pc's leaves are among the registers (never banked: ints).
    self._pc_positions = {
        name: next(i for i, leaf in enumerate(rest) if leaf is small[name])
        for name in ("pc_top", "pc_sp")}
    self._stacks = stack_banks.StackBanks(stacks, d,
                                          enabled=pack and p.cached_top)
    self._pushed = [self._pushed_stacks(b) for b in p.blocks]
    self._dispatches = dispatch_lib.group_blocks(
        self._changed, self._pushed,
        self._banks, self._stacks, z, pack)
    self._dispatch_of = {i: d for d in self._dispatches for i in d.blocks}
    # Per dispatch, the most model calls one of its blocks makes: each of
    # its blocks reports the members of that many calls (`_run_block`).
    self._model_calls = {d.blocks: max(ir2.batched_primitive_calls(
        p.blocks[i]) for i in d.blocks) for d in self._dispatches}
    return {
        "registers": self._registers.pack(rest),
        "banks": banks,
        "stacks": self._stacks.initial(stacks),
        "counters": run_counters.initial(z, p.halt),
    }

  def _pushed_stacks(self, block):
    """The stacks `block` writes: the variables it pushes (with a cached
    top), and the pc's if it calls."""
    names = {ir2.unguarded(op).var for op in block.ops
             if isinstance(ir2.unguarded(op), ir2.Push)}
    if not self.program.cached_top:
      names = set()
    if ir2.call_of(block.terminator):
      names.add("pc")
    return names

  def _changed_positions(self, owners):
    """Per block, the flat positions (in the nest of `_small`, whose leaves
    belong to the variables `owners`) that the block may change: the
    stack pointers of what it pushes, pops or updates, and the values it
    assigns, pops or updates that are still live after it
    (`BlockRunner.live_out`; a dead value is not written back)."""
    positions = []
    for block in self.program.blocks:
      changed, assigned = set(), set()
      for op in map(ir2.unguarded, block.ops):
        if isinstance(op, ir2.Push):
          changed.add(op.var + "#sp")
        elif isinstance(op, (ir2.Pop, ir2.Update)):
          changed.add(op.var + "#sp")
          assigned.add(op.var)
        else:
          assigned.update(ir2.writes(op))
      changed |= ((assigned - self.program.temporaries)
                  & self._runner.live_out[block.label])
      positions.append(frozenset(i for i, owner in enumerate(owners)
                                 if owner in changed))
    return positions

  # -- one block ------------------------------------------------------------

  def _run_block(self, index, state):
    """Block `index` run on the loop state (`block_runner`): its registers,
    changed bank rows and stack writes packed as its dispatch's other
    blocks pack theirs, the rows its model calls computed, and the members
    they were made for: as many as its dispatch's blocks make at most
    (`_model_calls`), -1 past its own."""
    stacks = state["stacks"]
    before = self._small(state)
    after, writes, rows, members = self._runner.run(
        index, self.program.blocks[index], before,
        lambda v: self._stacks.view(stacks, v))
    # The loop writes only the stacks `_pushed` names (see
    # `_apply_stack_writes`; under XLA their banks are sized by it).
    unplanned = set(writes) - self._pushed[index]
    if unplanned:
      raise errors.IRError(
          f"{self._labels[index]}: writes stacks {sorted(unplanned)} that "
          "the VM did not plan for")
    # Every block returns the same writes (switch_case branches must
    # agree): the stacks it does not write get masked-off ones.
    dispatch = self._dispatch_of[index]
    changed = self._banks.changes(after, before, self._changed[index],
                                  dispatch.bank_capacity)
    z = batch_state.size(after["pc_top"])
    return (self._registers.pack(self._banks.rest(after)), changed,
            dispatch.writes.pack(self._stacks.pack(
                writes, z, dispatch.stack_capacity)), rows,
            _padded(members, self._model_calls[dispatch.blocks]))


def _static_batch_size(args):
  """The batch size of `args` where their shape knows it, else None."""
  leaves = tf.nest.flatten(args)
  shape = tf.TensorShape(getattr(leaves[0], "shape", None) if leaves
                         else None)
  return shape[0] if shape.rank else None


def _padded(counts, length):
  """Scalar int32 `counts` as a vector of `length`, -1 past them."""
  return tf.stack(counts + [tf.constant(-1)] * (length - len(counts))) if (
      length) else tf.zeros([0], tf.int32)


def _traced_without_tapes(compiled):
  """`compiled`'s concrete function, traced in a thread of its own.

  Traced while an eager tape records, the XLA VM's inner function calls
  were recorded by that tape, which built their backward functions and
  failed (the VM's in-place writes have none). Tapes are per thread, and
  `record.stop_recording` would stop the tapes of the traced code too (a
  batched primitive's own gradient). The thread runs in a copy of this
  one's context variables (the default backend)."""
  context = contextvars.copy_context()
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    return pool.submit(context.run, compiled.get_concrete_function).result()
