"""The gradient of a VM run as a program of its own: the blocks that ran,
in reverse, each differentiated alone.

`pc:xla`'s backward pass (`xla_gradient`) runs the VM forward again, as
`pc:graph` traces it, for at most a bound of steps, and records what each
step's block needs to run again: its index, the registers it started
from (each register's values by version: `register_record`), the stack
rows it read, and the rows it wrote. A second loop then walks the steps
backwards. At each it runs the step's block once more, on the recorded
registers and rows, under a tape of its own, which turns the adjoint of
the state after the block into the adjoint of the state before it, and
adds the block's share of each variable's gradient.

Differentiating the VM's `tf.while_loop` and `tf.switch_case` with
TensorFlow's own gradients instead keeps, at every step, the intermediates
of every block (zeros for the blocks that did not run), and reads them all
back: a TreeLSTM step's gradient cost about fifteen times its forward
call. Here a step keeps only its registers and stack rows, and the
backward step runs one block's forward and backward.

The state's floating-point leaves (registers and stacks) carry adjoints;
its integers and booleans (the pc, counters, indices) carry none. A
stack's adjoint is kept whole ([D, Z, ...]): the rows a step wrote pass
their adjoint to the values written, the rows its block read get the
reads' adjoints, and the other rows' flow on to the earlier steps.
"""
import collections
import functools

import tensorflow as tf

from tfp_autobatch.runtime import register_record
from tfp_autobatch.runtime import stack_banks
from tfp_autobatch.runtime import vectorize

# The name scopes of block i's ops: in the recording run, RECORDING_SCOPE
# + i; in the backward step, BACKWARD_SCOPE + i (for profiles, as
# `pc_vm.BLOCK_SCOPE`: XLA keeps TensorFlow's op names in its
# instructions' metadata; `benchmarks.neural_profile` reads them).
RECORDING_SCOPE = "vm_recording_block_"
BACKWARD_SCOPE = "vm_backward_block_"


def _is_float(x):
  return x.dtype.is_floating or x.dtype.is_complex


def _float_leaves(nest):
  return [x for x in tf.nest.flatten(nest) if _is_float(x)]


def _dense(gradient, like):
  if gradient is None:
    return tf.zeros_like(like)
  return tf.convert_to_tensor(gradient)


class ReverseVm:
  """The gradient of a `pc_vm.PcVmRuntime` (mode "graph", one dispatch)
  run on a batch, traced into the current graph (see the module
  docstring).

  A conditional's outputs are fixed before its branches are traced, so
  two shapes of the record and of the backward step's outputs follow a
  plan, `{"gathered": ..., "reads": ...}`, of what the blocks do, which
  the caller keeps (`xla_gradient`); what a trace finds goes to
  `learned`, and a caller whose plan that changes traces again:

  - "gathered", {variable's position: rows}: the variables whose gradient
    comes as rows of a gather (an embedding table's) in every block that
    reads them, and the most rows one block's gradient has. Their
    gradients leave the conditional over the blocks as those rows, and
    are added to the total at their indices; the others' leave it whole.
  - "reads", {(stack, leaf): slots}: the most reads of a stack's leaf by
    one block, where more than one (one slot by default).

  Args:
    runtime: the `pc_vm.PcVmRuntime` of the program without
      floating-point selects.
    plan: the plan described above (None: an empty one).
  """

  def __init__(self, runtime, plan=None):
    self.runtime = runtime
    plan = plan or {}
    self.gathered = dict(plan.get("gathered", {}))
    self.read_slots = dict(plan.get("reads", {}))
    self.learned = {"gathered": {}, "reads": {}}

  def plan_learned(self):
    """The plan this trace found (see the class docstring)."""
    return {"gathered": {k: n for k, n in self.learned["gathered"].items()
                         if n is not DENSE},
            "reads": {k: n for k, n in self.learned["reads"].items()
                      if n > 1}}

  def recorded_run(self, args, bound):
    """The program run on `args` for at most `bound` steps, recording
    each step: `(outputs, saved, finished)`. `outputs` are what the VM
    returns (`pc_vm.PcVmRuntime.outputs_of`: result, overflow, faults,
    counters), `saved` the flat tensors `gradient_from_saved` takes (the
    record, the end state), `finished` whether every member halted within
    the bound (else both are junk)."""
    rt = self.runtime
    with vectorize.for_reverse_vm():
      layout = self._layout(args)
      start = rt.initial_state(layout, args)
      steps, nxt, end, record = self._forward(layout, start, bound)
      outputs = rt.outputs_of(layout, end)
    saved = {"steps": steps, "end": end,
             "record": tf.nest.map_structure(
                 lambda x: x.stack() if isinstance(x, tf.TensorArray) else x,
                 record)}
    self._saved_structure = saved
    return outputs, tf.nest.flatten(saved), nxt >= rt.program.halt

  def gradient_from_saved(self, args, upstream, variables, saved):
    """The gradients of the floating-point leaves of `args` then of
    `variables`, given the `upstream` gradients of the result's leaves
    and what `recorded_run` (traced first, by this object) saved."""
    rt = self.runtime
    saved = tf.nest.pack_sequence_as(self._saved_structure, list(saved))
    # Every entry of the record is a `tf.TensorArray` but the versions.
    record = {key: value if key == "versions" else
              tf.nest.map_structure(_unstacked, value)
              for key, value in saved["record"].items()}
    record["register_record"] = self._register_record
    floats = [x for x in tf.nest.flatten(args) if x.dtype.is_floating]
    self.learned["gathered"] = {}
    with vectorize.for_reverse_vm():
      layout = self._layout(args)
      with tf.GradientTape(watch_accessed_variables=False) as start_tape:
        start_tape.watch(floats)
        start = rt.initial_state(layout, args)
      end = saved["end"]
      adjoint = self._result_adjoint(layout, end, upstream)
      adjoint, variable_grads = self._backward(
          layout, start, end, record, saved["steps"], adjoint, variables)
    input_grads = start_tape.gradient(
        _float_leaves(self._differentiable(start)), floats,
        output_gradients=adjoint,
        unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return [tf.convert_to_tensor(g) for g in input_grads] + variable_grads

  def _layout(self, args):
    layout = self.runtime.layout_for(tf.nest.flatten(args)[0].shape[0])
    if len(layout.dispatches) != 1 or layout.banks.sizes:
      raise ValueError("the reverse VM needs pc:graph's layout (one "
                       "dispatch, no banks)")
    return layout

  @staticmethod
  def _differentiable(state):
    """The part of the loop state that carries adjoints."""
    return {"registers": state["registers"], "stacks": state["stacks"]}

  def _slots(self, key):
    return self.read_slots.get(key, 1)

  def _forward(self, layout, start, bound):
    """The VM run from `start` for at most `bound` steps, recording each
    step: `(steps, the next block, the end state, record)`."""
    rt = self.runtime
    names = layout.stacks.names
    blocks = range(rt.program.halt)
    z = layout.batch_size
    stack_leaves = {name: tf.nest.flatten(start["stacks"][name])
                    for name in names}

    def array(shape, dtype):
      return tf.TensorArray(dtype, size=bound, element_shape=shape)

    registers = self._register_record = register_record.RegisterRecord(
        tf.nest.flatten(start["registers"]), rt.program.halt, bound)
    register_arrays, versions = registers.start()
    record = {
        "block": array([], tf.int32),
        "registers": register_arrays,
        "versions": versions,
        "written": {name: (array([z], tf.int32), array([z], tf.bool))
                    for name in names},
        "reads": {(name, j): [array(leaf.shape[1:], leaf.dtype)
                              for _ in range(self._slots((name, j)))]
                  for name in names
                  for j, leaf in enumerate(stack_leaves[name])},
    }

    def body(t, nxt, state, record):
      record = dict(record)
      record["block"] = record["block"].write(t, nxt)
      (new_registers, writes, counters, reads,
       record["registers"]) = tf.switch_case(
           nxt, [self._recording(layout, i, state, registers,
                                 record["registers"], record["versions"])
                 for i in blocks])
      record["versions"] = registers.after(record["versions"], nxt)
      record["written"] = {
          name: (rows.write(t, writes[name].row),
                 masks.write(t, writes[name].mask))
          for name, (rows, masks) in record["written"].items()}
      record["reads"] = {
          key: [a.write(t, v) for a, v in zip(arrays, reads[key])]
          for key, arrays in record["reads"].items()}
      state = dict(state, registers=new_registers, counters=counters,
                   stacks=layout.stacks.apply(state["stacks"], writes,
                                              xla=True))
      return t + 1, rt.next_block(layout, state), state, record

    halt = rt.program.halt
    def running(t, nxt, state, record):
      del state, record
      return tf.logical_and(t < bound, nxt < halt)

    steps, nxt, end, record = tf.while_loop(
        running, body, (tf.constant(0), rt.next_block(layout, start), start,
                        record))
    return steps, nxt, end, record

  def _recording(self, layout, i, state, registers, arrays, versions):
    """Block i's `block_outputs` on `state` (with the run counters after
    it), the stack rows it read,
    `{(stack, leaf): [rows, ...]}` in the plan's slots (zeros past its
    reads), and the register record's `arrays` with the registers it
    wrote (`registers`, the `RegisterRecord`, at `versions`), as a
    conditional's branch: the backward step runs the block again on
    these registers and rows, and needs no stacks."""
    def run():
      with tf.name_scope(f"{RECORDING_SCOPE}{i}"):
        leaf_of = _stack_leaves(state["stacks"], layout.stacks.names)
        found = collections.defaultdict(list)
        def on_read(stack, sp, rows):
          del sp
          for leaf, values in zip(tf.nest.flatten(stack),
                                  tf.nest.flatten(rows)):
            if id(leaf) in leaf_of:
              found[leaf_of[id(leaf)]].append(values)
        with stack_banks.reads_observed(on_read):
          after, writes, counters = self.runtime.block_outputs(
              layout, i, state, counters=state["counters"])
        arrays_after = registers.written(
            i, arrays, versions, tf.nest.flatten(state["registers"]),
            tf.nest.flatten(after))
        reads = {}
        for name in layout.stacks.names:
          for j, leaf in enumerate(tf.nest.flatten(state["stacks"][name])):
            key = (name, j)
            values = found.get(key, [])
            learned = self.learned["reads"]
            learned[key] = max(learned.get(key, 0), len(values))
            n = self._slots(key)
            reads[key] = (values + [tf.zeros_like(leaf[0])] * n)[:n]
        return after, writes, counters, reads, arrays_after
    return run

  def _result_adjoint(self, layout, end, upstream):
    """The adjoint of the end state's differentiable leaves."""
    rt = self.runtime
    sources = _float_leaves(self._differentiable(end))
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch(sources)
      result = rt.result_of(layout, end)
    grads = tape.gradient(tf.nest.flatten(result), sources,
                          output_gradients=upstream,
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return [tf.convert_to_tensor(g) for g in grads]

  def _backward(self, layout, start, end, record, steps, adjoint, variables):
    """The adjoint of `start`'s differentiable leaves and the variables'
    gradients, from the end state's `adjoint`.

    The backward step runs its block on the registers it started from
    and on the stack rows it read, both from the record: the stacks
    themselves are not needed. Their adjoints ([D, Z, ...] each) stay out
    of the conditional over the blocks, which would copy each one it
    returns at every step: the rows a step overwrote are read and cleared
    before it, and the rows its block read get the reads' adjoints after
    it, which the block returns in the plan's slots."""
    rt = self.runtime
    names = layout.stacks.names
    blocks = range(rt.program.halt)
    register_structure = start["registers"]
    stack_leaves = {name: tf.nest.flatten(end["stacks"][name])
                    for name in names}
    # (stack, leaf) -> its place among the stack's floating-point leaves.
    float_place = {}
    for name in names:
      floats = [j for j, leaf in enumerate(stack_leaves[name])
                if _is_float(leaf)]
      float_place.update({(name, j): f for f, j in enumerate(floats)})
    float_keys = sorted(float_place)
    num_registers = len(_float_leaves(end["registers"]))
    adjoint_registers = adjoint[:num_registers]
    adjoint_stacks = {}
    position = num_registers
    for name in names:
      n = len(_float_leaves(end["stacks"][name]))
      adjoint_stacks[name] = adjoint[position:position + n]
      position += n

    def step_adjoint(i, state, adjoint_registers, written, recorded):
      """Block i's step taken back: the adjoints of the registers before
      it, of the rows it read (in the plan's slots) and of the variables;
      `written` holds, per stack, the adjoints of the values the block
      wrote, `recorded` the rows it read."""
      with tf.name_scope(f"{BACKWARD_SCOPE}{i}"):
        return taken_back(i, state, adjoint_registers, written, recorded)

    def taken_back(i, state, adjoint_registers, written, recorded):
      sources = _float_leaves(state["registers"])
      leaf_of = _stack_leaves(state["stacks"], names)
      taken = collections.Counter()
      reads = []   # ((stack, leaf), rows read, the rows' values)
      with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(sources)
        tape.watch(variables)
        def on_read(stack, sp, rows):
          replaced = []
          for leaf, values in zip(tf.nest.flatten(stack),
                                  tf.nest.flatten(rows)):
            key = leaf_of.get(id(leaf))
            if key is None:
              replaced.append(values)
              continue
            slot = taken[key]
            taken[key] += 1
            if slot < len(recorded[key]):
              values = recorded[key][slot]
            if _is_float(values):
              tape.watch(values)
              reads.append((key, sp, values))
            replaced.append(values)
          return tf.nest.pack_sequence_as(rows, replaced)
        with stack_banks.reads_observed(on_read):
          registers, writes = rt.block_outputs(layout, i, state)
      targets = _float_leaves(registers)
      target_grads = list(adjoint_registers)
      for name in names:
        if name in layout.pushed[i]:
          targets += _float_leaves(writes[name].value)
          target_grads += written[name]
      grads = tape.gradient(
          targets, sources + [r[2] for r in reads] + list(variables),
          output_gradients=target_grads)
      register_grads = [_dense(g, x) for g, x in
                        zip(grads[:len(sources)], sources)]
      read_grads = grads[len(sources):len(sources) + len(reads)]
      for k, g in enumerate(grads[len(sources) + len(reads):]):
        if g is not None:
          contributing[k].add(i)
      variable_grads = [
          self._contribution(k, g, v) for k, (g, v) in
          enumerate(zip(grads[len(sources) + len(reads):], variables))]
      filled = []
      for key in float_keys:
        n = self._slots(key)
        mine = [(sp, _dense(g, values)) for (k, sp, values), g in
                zip(reads, read_grads) if k == key][:n]
        like = stack_leaves[key[0]][key[1]][0]
        mine += [(tf.zeros(like.shape[:1], tf.int32), tf.zeros_like(like))
                 ] * (n - len(mine))
        filled.append(mine)
      return register_grads, filled, variable_grads

    registers = record["register_record"]

    def body(t, adjoint_registers, adjoint_stacks, totals, versions):
      t = t - 1
      i = record["block"].read(t)
      adjoint_stacks = dict(adjoint_stacks)
      written = {}
      for name in names:
        rows, masks = record["written"][name]
        row, mask = rows.read(t), masks.read(t)
        # The rows the step overwrote: their adjoint goes to the values
        # written, and none is left for what they held before.
        leaves = adjoint_stacks[name]
        if not leaves:
          written[name] = []
          continue
        written[name] = [
            tf.where(_expand(mask, g), g, tf.zeros_like(g))
            for g in stack_banks.rows_at(leaves, row)]
        # Cleared by adding their negation (x - x is exactly 0): a scatter
        # of values read from the buffer it updates, which XLA then
        # updates in place; a scatter of zeros, not ordered after that
        # read, made XLA copy the buffer twice a step.
        adjoint_stacks[name] = [
            stack_banks.add_at_rows(leaf, row, -w)
            for leaf, w in zip(leaves, written[name])]
      # The record is read inside the conditional, in each block's branch,
      # where XLA drops the reads the block does not use: a block that
      # leaves a register alone needs its adjoint, not its value.
      def taken_back_from_record(i):
        recorded = {key: [a.read(t) for a in arrays]
                    for key, arrays in record["reads"].items()}
        state = dict(end, registers=tf.nest.pack_sequence_as(
            register_structure, registers.values(
                record["registers"], registers.before(versions, i))))
        return step_adjoint(i, state, adjoint_registers, written, recorded)
      adjoint_registers, filled, grads = tf.switch_case(i, [
          functools.partial(taken_back_from_record, i) for i in blocks])
      for key, entries in zip(float_keys, filled):
        name, f = key[0], float_place[key]
        leaves = list(adjoint_stacks[name])
        for sp, g in entries:
          leaves[f] = stack_banks.add_at_rows(leaves[f], sp, g)
        adjoint_stacks[name] = leaves
      totals = [_added(total, g, i, contributing[k], blocks)
                for k, (total, g) in enumerate(zip(totals, grads))]
      versions = registers.before(versions, i)
      return t, adjoint_registers, adjoint_stacks, totals, versions

    # {variable's position: the blocks whose step has a gradient of it}.
    contributing = collections.defaultdict(set)
    totals = [tf.zeros_like(v) for v in variables]
    _, adjoint_registers, adjoint_stacks, totals, _ = tf.while_loop(
        lambda t, *_: t > 0, body,
        (steps, adjoint_registers, adjoint_stacks, totals,
         record["versions"]))
    return adjoint_registers + [
        g for name in names for g in adjoint_stacks[name]], totals

  def _contribution(self, position, gradient, variable):
    """A block's gradient of the variable at `position`, as the
    conditional over the blocks returns it: `(indices, rows)`, padded to
    the planned rows with indices past the table (which XLA's scatter
    skips), for a gathered variable (`gathered`), else dense."""
    rows = self.gathered.get(position)
    learned = self.learned["gathered"]
    if isinstance(gradient, tf.IndexedSlices):
      found = gradient.values.shape[0]
      if learned.get(position, 0) is not DENSE:
        learned[position] = max(learned.get(position, 0), found)
    elif gradient is not None:
      learned[position] = DENSE
    if rows is None:
      return _dense(gradient, variable)
    past = variable.shape[0]
    if isinstance(gradient, tf.IndexedSlices) and found <= rows:
      indices = tf.cast(gradient.indices, tf.int32)
      values = gradient.values
      if found < rows:
        indices = tf.concat([indices, tf.fill([rows - found], past)], 0)
        values = tf.concat([values, tf.zeros(
            [rows - found] + variable.shape[1:].as_list(), values.dtype)], 0)
      return indices, values
    # No gradient here; or one the plan did not foresee, which this trace
    # (then traced again) returns as nothing.
    return (tf.fill([rows], past),
            tf.zeros([rows] + variable.shape[1:].as_list(), variable.dtype))


# A variable whose gradient is dense in some block (`ReverseVm.gathered`).
DENSE = "dense"


def _added(total, gradient, block, contributing, blocks):
  """`total` plus one step's gradient: dense, or rows at their indices
  (`ReverseVm._contribution`), added in place under XLA.

  A dense gradient is added only at a step whose block has one
  (`contributing`, the blocks' indices; `block`, the step's): the other
  blocks return zeros, and adding a weight matrix's zeros at every step
  read and wrote the whole matrix each time."""
  if isinstance(gradient, tuple):
    indices, values = gradient
    return tf.tensor_scatter_nd_add(total, indices[:, None], values)
  if not contributing:
    return total
  if contributing >= set(blocks):
    return total + gradient
  adds = tf.gather(tf.constant([int(b in contributing) for b in blocks]),
                   block)
  _, total = tf.while_loop(lambda n, _: n > 0,
                           lambda n, x: (n - 1, x + gradient), (adds, total))
  return total


def _unstacked(stacked):
  """A `tf.TensorArray` stacked by `ReverseVm.recorded_run`, as one again
  (XLA keeps both as the same buffer)."""
  return tf.TensorArray(stacked.dtype, size=stacked.shape[0],
                        element_shape=stacked.shape[1:]).unstack(stacked)


def _stack_leaves(stacks, names):
  """{id of a stack's leaf: (stack, the leaf's place in it)}."""
  return {id(leaf): (name, j) for name in names
          for j, leaf in enumerate(tf.nest.flatten(stacks[name]))}


def _expand(mask, like):
  """A [Z] mask broadcast against [Z, ...] `like`."""
  return tf.reshape(mask, [-1] + [1] * (like.shape.rank - 1))
