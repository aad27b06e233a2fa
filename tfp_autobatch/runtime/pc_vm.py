"""Program-counter autobatching (paper Algorithm 2) of an IR-2 program.

The VM state is a dict of tensors with batch dimension Z:

  pc_top [Z], pc_sp [Z], stacks["pc"] [D, Z]
                                           block each member waits at, and
                                           its return addresses
  vars[v] = [Z, ...]                       a register
  vars[v] = {top [Z, ...], sp [Z]}, stacks[v] [D, Z, ...]
                                           a stacked variable (cached top)
  vars[v] = {stack [D, Z, ...], sp [Z]}    a stacked variable, value at sp
  overflow [Z], the statistics counters (`run_counters`), and their
  member_steps [Z], member_depth [Z]       per-member counts;
  index_fault [Z, 2]                       for a program with rewritten
                                           subscripts: each member's first
                                           index out of range (`subscripts`)

Where each part of that state lives (registers, banks, stacks, and the
blocks' grouping into dispatches) is a value, `vm_layout.VmLayout`,
planned from the program and the batch size before the loop is traced.

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
from tfp_autobatch.runtime import constant_work
from tfp_autobatch.runtime import no_gradient
from tfp_autobatch.runtime import run_counters
from tfp_autobatch.runtime import schedule as schedule_lib
from tfp_autobatch.runtime import stack_banks
from tfp_autobatch.runtime import stats as stats_lib
from tfp_autobatch.runtime import variable_store
from tfp_autobatch.runtime import vectorize
from tfp_autobatch.runtime import vm_layout
from tfp_autobatch.runtime import xla_gradient
from tfp_autobatch.runtime import xla_kernels

# How many static batch sizes `pc:graph` traces a VM of its own for: each
# trace costs a first call its compile time, so further sizes share one
# trace for any size (`PcVmRuntime.compiled_for`).
GRAPH_SIZES_TRACED = 8

# The name scope of block i's ops in the compiled loop is BLOCK_SCOPE + i
# (for profiles: XLA keeps TensorFlow's op names in its instructions'
# metadata).
BLOCK_SCOPE = "vm_block_"


def _running(halt):
  """The VM loop's condition: some member has not halted (the next block
  `nxt` is not the halt label), read from a table of the blocks, not
  written `nxt < halt`.

  XLA's while-loop passes (loop simplification and loop-invariant code
  motion, run 25 times over the module when `sample_chain`'s seed split
  keeps its simplification from a fixed point) look for a loop's trip
  count. A condition `nxt < halt` names `nxt` as the loop's induction
  variable, and to check it XLA copies out everything `nxt` depends on
  in the loop's body: the whole VM step, every block, at every pass.
  Read from a table, the condition is not a counter's, and the search
  stops there (`python -m benchmarks.ess_first_call` times XLA's passes).
  """
  table = [1] * halt + [0]
  def running(nxt, state):
    del state
    return tf.equal(tf.gather(tf.constant(table, tf.int32), nxt), 1)
  return running


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
    differentiable: for mode "xla", a function returning the `pc:graph`
      runtime of the same program without floating-point selects, which
      the gradient of an eager call under a tape runs (`xla_gradient`);
      None: no gradient (`no_gradient`).
  """

  # Of this thread's last run: RunStats eagerly, the counts as tensors traced.
  stats = stats_lib.PerThread()
  stats_tensors = stats_lib.PerThread()

  def __init__(self, program, max_stack_depth, mode="graph",
               schedule="lowest_pc", differentiable=None):
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
    self._layouts = {}   # static batch size or None -> vm_layout.VmLayout
    # (static batch size or None, traced for the caller's XLA) -> tf.function
    self._compiled = {}
    self._concrete = {}   # its tf.function -> its concrete function
    self._differentiable = differentiable
    self._gradient = None   # xla_gradient.XlaGradient, made on first use

  # -- the public interface shared with LocalStaticRuntime -------------------

  def run(self, args, batch_size):
    del batch_size   # taken from the tensors: it may be unknown at trace time
    if self.mode == "eager":
      # One run at a time: eager runs fill the VM's caches (its layouts
      # and kernels) as they go.
      with self._eager_lock:
        result, overflow, faults, counters = self._execute(args, eager=True)
    else:
      eager = tf.executing_eagerly()
      compiled_by_xla = self.mode == "xla" or (
          not eager and _tf_private.in_xla_context())
      # A traced function to call: eagerly and wherever XLA compiles the
      # VM (see `_concrete_for`); pc:graph in a graph without XLA traces in
      # it, under the tapes, which then differentiate through the VM.
      if not (eager or compiled_by_xla) and _in_v1_graph():
        # Traced in place: see `_in_v1_graph`.
        outs = self._traced(*args)
      elif not (eager or compiled_by_xla):
        outs = self.compiled_for(args)(*args)
      # (Eagerly only while a tape records: the wrapper's cost is a
      # large part of a small batch's call, `benchmarks.programs`.)
      elif (eager and self._differentiable is not None
            and _tf_private.record.could_possibly_record()):
        outs = self._with_gradient(self._concrete_for(args), args)
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
      # The counters are read in one `.numpy()` with the members that
      # overflowed or faulted (`run_counters.ended`): each further read,
      # and each eager reduction, is an eager op of its own.
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
    if self._subscript_sites and not _tf_private.in_xla_context():
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

  def _with_gradient(self, vm, args):
    """`vm(*args)` for pc:xla called eagerly under a tape, with a gradient
    (`xla_gradient`)."""
    if self._gradient is None:
      self._gradient = xla_gradient.XlaGradient(self._differentiable())
    return self._gradient.call(vm, args)

  # -- what the reverse VM (`reverse_vm`) runs -------------------------------

  def initial_state(self, layout, args):
    """The loop state holding `args` (see `_initial_state`)."""
    return self._initial_state(layout, list(args))

  def next_block(self, layout, state):
    """The block to run next on `state` (the halt label once every
    member halted)."""
    return self.schedule.next_block(self._register(layout, state, "pc_top"))

  def result_of(self, layout, state):
    """The program's result in the loop state `state`."""
    small = self._small(layout, state)
    return self._store.value(small["vars"][self.program.result],
                             self.program.result)

  def block_outputs(self, layout, index, state, counters=None):
    """`(registers, {stack: StackWrite})` of block `index` (an int, or a
    tensor: a conditional over every block) run on `state`, in pc:graph's
    layout (one dispatch of every block, no banks); with `counters`, the
    run counters after it as well (`counters_after`)."""
    dispatch, = layout.dispatches
    def run(i):
      registers, _, packed_writes, rows, members = self._run_block(
          layout, i, state)
      if counters is None:
        return registers, packed_writes
      return registers, packed_writes, self.counters_after(
          layout, dispatch, counters, i, rows, members)
    if isinstance(index, int):
      outputs = run(index)
    else:
      outputs = tf.switch_case(
          index, [functools.partial(run, i) for i in dispatch.blocks])
    return (outputs[0], dispatch.writes.unpack(*outputs[1])) + tuple(
        outputs[2:])

  def _without_gradient(self, vm, *args):
    """`vm(*args)` for a VM compiled by XLA, which has no gradient:
    runs forward under tapes, a gradient is a clear error
    (`no_gradient`)."""
    mode = "pc:xla inside a tf.function" if self.mode == "xla" else (
        "pc:graph inside tf.function(jit_compile=True)")
    return no_gradient.call(vm, args, (
        f"tfp_autobatch: {mode} is not differentiable (XLA compiles "
        "the VM's loop and its in-place writes, which have no "
        "gradient); take gradients through pc:xla called eagerly, or "
        "backend='pc:graph' (in a tf.function without jit_compile), "
        "'pc:eager', 'local:eager' or 'local:eager_xla', or put "
        "tf.stop_gradient on its results"))

  def compiled_for(self, args):
    """The VM's `tf.function` for a batch like `args`.

    `pc:xla` compiles per batch size anyway, and traces per static batch
    size as well: with the size known, pfor reads each row of a primitive's
    inputs as the input itself, where with an unknown size it gathers every
    row by its index (a gather XLA does not remove, and repeats inside the
    fused kernels that read it; `python -m benchmarks.nuts_vm_steps`).
    `pc:graph` traces per static batch size for its first
    `GRAPH_SIZES_TRACED` sizes, and once more for all other sizes (the batch
    dimension left unknown): TensorFlow folds the known size's shapes,
    ranges and fills out of the loop, and pfor's row gathers with it, so a
    VM step runs fewer graph nodes. A batch of unknown size (inside a
    caller's `tf.function` with unknown shapes) gets the unknown-size trace.
    `pc:graph` inside a caller's `tf.function(jit_compile=True)` gets a
    trace of its own, which XLA can compile (`pfor_conditions`), and which
    is called as pc:xla's is (`_concrete_for`).
    """
    size = _static_batch_size(args)
    for_xla = self.mode == "graph" and _tf_private.in_xla_context()
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
    which a trace under them would meet (see `_tf_private.traced_without_tapes`).
    Traced in place under a persistent tape, or two tapes, TensorFlow
    wraps the VM's `tf.while_loop` for their higher-order gradients, with
    accumulators that XLA cannot size, and the forward call fails ("XLA
    compilation requires a fixed tensor list size").

    Calling a `tf.function` binds and checks its arguments against its
    signature and looks up its trace on every call; calling the trace (its
    concrete function) directly skips that, most of a small batch's call
    (`python -m benchmarks.programs`).

    Before its first call, a trace that XLA compiles is looked through for
    operations XLA has no kernel for (`xla_kernels`): the error then names
    them and the user's lines, not XLA's view of a VM block."""
    compiled = self.compiled_for(args)
    concrete = self._concrete.get(compiled)
    if concrete is None:
      if _tf_private.record.could_possibly_record():
        concrete = _tf_private.traced_without_tapes(compiled)
      else:
        concrete = compiled.get_concrete_function()
      if self.mode == "xla":
        xla_kernels.check(compiled, concrete, "pc:xla", (
            "backend='pc:graph', which runs it without XLA"))
      elif _tf_private.in_xla_context():
        xla_kernels.check(
            compiled, concrete,
            "pc:graph inside tf.function(jit_compile=True)",
            "it outside jit_compile")
      self._concrete[compiled] = concrete
    return concrete

  def _traced(self, *args):
    self.trace_count += 1
    return self._execute(list(args), eager=False)

  # -- the loop -------------------------------------------------------------

  def _execute(self, args, eager):
    layout = self.layout_for(_static_batch_size(args))
    state = self._initial_state(layout, args)
    halt = self.program.halt
    if eager:
      while True:
        nxt = int(self.schedule.next_block(
            self._small(layout, state)["pc_top"]))
        if nxt >= halt:
          break
        state = self._step(layout, nxt, state, eager=True)
        small = self._small(layout, state)
        if bool(tf.reduce_any(small["overflow"])) or (
            layout.has_index_fault
            and bool(tf.reduce_any(subscripts.faulted(small["index_fault"])))):
          break
    else:
      # A batched primitive's work on fixed matrices is computed here,
      # before the loop, once a call (`constant_work`).
      with constant_work.moving_into(tf.compat.v1.get_default_graph()):
        _, state = self._loop(layout, state)
    return self.outputs_of(layout, state)

  def outputs_of(self, layout, state):
    """What a run returns from its end state `state`: (the result, with
    the rows of members that overflowed or faulted poisoned, overflow,
    faults, the final counters: `run_counters.ended`)."""
    small = self._small(layout, state)
    result = self._store.value(small["vars"][self.program.result],
                               self.program.result)
    faults = small.get("index_fault", subscripts.no_faults(0))
    halted = small["overflow"]
    faulted = tf.zeros([0], tf.bool)
    if layout.has_index_fault:
      faulted = subscripts.faulted(faults)
      halted = tf.logical_or(halted, faulted)
    return (_poison(result, halted), small["overflow"], faults,
            run_counters.ended(state["counters"], small, small["overflow"],
                               faulted))

  def _loop(self, layout, state):
    """The VM's loop traced from `state`: (the next block, the state)
    once every member halted."""
    halt = self.program.halt
    def next_block(state):
      return self.schedule.next_block(
          self._register(layout, state, "pc_top"))
    def run(dispatch):
      def body(nxt, state):
        state = self._step(layout, nxt, state, eager=False,
                           dispatch=dispatch)
        return next_block(state), state
      return body
    start = (next_block(state), state)
    running = _running(halt)
    if len(layout.dispatches) == 1:
      return tf.while_loop(running, run(layout.dispatches[0]), start)
    # A loop per dispatch, each running its blocks while the next block
    # is one of them, in a loop that runs until every member halts.
    # Each loop applies its own dispatch's bank writes (a scatter in a
    # conditional's branch would copy the whole bank instead).
    number = [layout.dispatches.index(layout.dispatch_of[i])
              for i in range(halt)] + [-1]
    def body(nxt, state):
      for n, dispatch in enumerate(layout.dispatches):
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
        if (_in_v1_graph() and self.mode == "graph"
            and not _tf_private.in_xla_context()):
          nxt, state = loop(nxt, state)   # see `_in_v1_graph`
        else:
          nxt, state = tf.function(functools.partial(loop),
                                   autograph=False)(nxt, state)
      return nxt, state
    return tf.while_loop(running, body, start)

  def _small(self, layout, state):
    """The registers, pc and overflow flags, unpacked from the loop state."""
    return layout.banks.join(state["banks"],
                             layout.registers.unpack(*state["registers"]))

  def _register(self, layout, state, name):
    """`pc_top` or `pc_sp` alone from the loop state, without unpacking
    the rest (`_small` builds every leaf: a few hundred ops for the trace
    each time)."""
    return layout.registers.unpack_leaf(*state["registers"],
                                        layout.pc_positions[name])

  def _step(self, layout, nxt, state, eager, dispatch=None):
    """Runs block `nxt`, then applies its stack writes outside the block;
    `nxt` is one of `dispatch`'s blocks (a tensor; eagerly an int, whose
    dispatch is looked up).

    A block returns its registers and its stack writes packed (see
    `register_file`); the run counters (`run_counters`) are kept here,
    outside the switch.
    """
    stacks = state["stacks"]
    if eager:
      dispatch = layout.dispatch_of[nxt]
      registers, bank_writes, packed_writes, rows, members = (
          self._run_block(layout, nxt, state))
    else:
      blocks = dispatch.blocks
      def run(i):
        with tf.name_scope(f"{BLOCK_SCOPE}{i}"):
          return self._run_block(layout, i, state)
      branches = [functools.partial(run, i) for i in blocks]
      if len(blocks) == 1:
        # Still a conditional (with a branch that is never taken): a block
        # inlined into the loop lets XLA fuse its reads of the banks into
        # the loop's in-place writes to them, and XLA then copies the banks
        # every step (`python -m benchmarks.nuts_vm_steps`).
        index = tf.cast(tf.not_equal(nxt, blocks[0]), tf.int32)
        branches.append(lambda: self._no_block(layout, state, dispatch))
      else:
        # The block's branch in this dispatch.
        index = (nxt if blocks == tuple(range(self.program.halt)) else
                 tf.gather(tf.constant(np.searchsorted(
                     blocks, range(self.program.halt)), tf.int32), nxt))
      outputs = tf.switch_case(index, branches)
      registers, bank_writes, packed_writes, rows, members = outputs
    writes = dispatch.writes.unpack(*packed_writes)
    banks = layout.banks.apply(state["banks"], bank_writes)
    return {
        "registers": registers,
        "banks": banks,
        "stacks": self._apply_stack_writes(layout, stacks, writes, nxt,
                                           dispatch, eager),
        "counters": self.counters_after(layout, dispatch, state["counters"],
                                        nxt, rows, members),
    }

  def counters_after(self, layout, dispatch, counters, block, rows,
                     members):
    """The run counters after block `block` of `dispatch` ran, given the
    rows and members of its model calls (`_run_block`)."""
    return run_counters.after_step(
        counters, block, self.program.halt, rows,
        members if layout.model_calls[dispatch.blocks] else None)

  def _apply_stack_writes(self, layout, stacks, writes, nxt, dispatch,
                          eager):
    """The stacks after block `nxt` of `dispatch` wrote `writes`.

    Under XLA every stack takes its write (a scatter in place; masked-off
    rows are skipped). Elsewhere TensorFlow's scatter copies the whole
    [D, Z, ...] stack, and a write that writes nothing still gathers and
    writes back every row, so only the stacks that the block writes are
    written: a conditional on the block for those some block of the
    dispatch writes, nothing for the others (fib on 4,096 members under
    `pc:graph` copied its three stacks every step)."""
    xla = self.mode == "xla"
    if xla or _tf_private.in_xla_context():
      return layout.stacks.apply(stacks, writes, xla=xla)
    out = dict(stacks)
    for name in layout.stacks.names:
      writers = [i for i in dispatch.blocks if name in layout.pushed[i]]
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

  def _no_block(self, layout, state, dispatch):
    """What a block of `dispatch` that changes nothing returns: the packed
    registers as they are (unpacking and packing them again would cost the
    trace a few hundred ops), and writes that write nothing."""
    # Only the banked leaves are read (by `changes`, for the padding).
    banked = layout.banks.join(state["banks"],
                               [None] * layout.registers.num_leaves)
    z = batch_state.size(self._register(layout, state, "pc_top"))
    return (state["registers"],
            layout.banks.changes(banked, banked, frozenset(),
                                 dispatch.bank_capacity),
            dispatch.writes.pack(layout.stacks.pack(
                {}, z, dispatch.stack_capacity)),
            tf.constant(0),
            tf.fill([layout.model_calls[dispatch.blocks]], -1))

  def layout_for(self, batch_size):
    """The `vm_layout.VmLayout` of a batch of `batch_size` members (None:
    unknown until run time), planned once per size."""
    layout = self._layouts.get(batch_size)
    if layout is None:
      layout = self._layouts[batch_size] = vm_layout.plan(
          self.program, batch_size, self.depth, xla=self.mode == "xla",
          live_out=self._runner.live_out)
    return layout

  def _initial_state(self, layout, args):
    """The loop state holding `args` in the parameters, packed as `layout`
    says."""
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
        **run_counters.initial_member_registers(z),
    }
    if layout.has_index_fault:
      small["index_fault"] = subscripts.no_faults(z)
    layout.check_state(small, stacks)
    banks, rest = layout.banks.split(small)
    return {
        "registers": layout.registers.pack(rest),
        "banks": banks,
        "stacks": layout.stacks.initial(stacks),
        "counters": run_counters.initial(z, p.halt),
    }

  # -- one block ------------------------------------------------------------

  def _run_block(self, layout, index, state):
    """Block `index` run on the loop state (`block_runner`): its registers,
    changed bank rows and stack writes packed as its dispatch's other
    blocks pack theirs, the rows its model calls computed, and the members
    they were made for: as many as its dispatch's blocks make at most
    (`_model_calls`), -1 past its own."""
    stacks = state["stacks"]
    before = self._small(layout, state)
    after, writes, rows, members = self._runner.run(
        index, self.program.blocks[index], before,
        lambda v: layout.stacks.view(stacks, v))
    # Counted per member, in registers the block writes anyway
    # (`run_counters`).
    after = dict(after, **run_counters.member_registers_after(
        before, after, index))
    # The loop writes only the stacks `_pushed` names (see
    # `_apply_stack_writes`; under XLA their banks are sized by it).
    unplanned = set(writes) - layout.pushed[index]
    if unplanned:
      raise errors.IRError(
          f"{self._labels[index]}: writes stacks {sorted(unplanned)} that "
          "the VM did not plan for")
    # Every block returns the same writes (switch_case branches must
    # agree): the stacks it does not write get masked-off ones.
    dispatch = layout.dispatch_of[index]
    changed = layout.banks.changes(after, before, layout.changed[index],
                                  dispatch.bank_capacity)
    z = batch_state.size(after["pc_top"])
    return (layout.registers.pack(layout.banks.rest(after)), changed,
            dispatch.writes.pack(layout.stacks.pack(
                writes, z, dispatch.stack_capacity)), rows,
            _padded(members, layout.model_calls[dispatch.blocks]))


def _in_v1_graph():
  """Whether the VM is traced into a `tf.compat.v1` graph (run by a
  Session). There it is traced in place, its loops too, not called as
  `tf.function`s: TensorFlow lowers the caller's nested while loops
  (`sample_chain`'s) to TF1 frames, and a stateful function call inside
  them sometimes got a control input from the outer loop's frame and its
  data from the inner one ("StatefulPartitionedCall has inputs from
  different frames"), which graph lowering's order decided from run to
  run. Traced in place, the VM is plain ops of the caller's loops."""
  return not tf.compat.v1.executing_eagerly_outside_functions()


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
