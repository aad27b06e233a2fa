"""The gradient of a VM run as a program of its own: the blocks that ran,
in reverse, each differentiated alone.

`pc:xla`'s backward pass (`xla_gradient`) runs the VM forward again, as
`pc:graph` traces it, for at most a bound of steps, and records what each
step needs to be undone: the block it ran, the registers it started from,
and the stack rows it overwrote. A second loop then walks the steps
backwards. At each it restores the state the step started from (registers
from the record, stacks by writing back the overwritten rows) and runs the
step's block once more under a tape of its own, which turns the adjoint of
the state after the block into the adjoint of the state before it, and
adds the block's share of each variable's gradient.

Differentiating the VM's `tf.while_loop` and `tf.switch_case` with
TensorFlow's own gradients instead keeps, at every step, the intermediates
of every block (zeros for the blocks that did not run), and reads them all
back: a TreeLSTM step's gradient cost about fifteen times its forward
call. Here a step keeps only its registers and overwritten stack rows, and
the backward step runs one block's forward and backward.

The state's floating-point leaves (registers and stacks) carry adjoints;
its integers and booleans (the pc, counters, indices) carry none. The
block's tape watches the registers and stacks it reads: a stack's adjoint
past the rows a step overwrote flows on to the earlier steps unchanged.
"""
import collections

import tensorflow as tf

from tfp_autobatch.runtime import stack_banks
from tfp_autobatch.runtime import vectorize


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

  Args:
    runtime: the `pc_vm.PcVmRuntime` of the program without
      floating-point selects.
  """

  def __init__(self, runtime, gathered=None):
    self.runtime = runtime
    # {variable's position: rows}: the variables whose gradient comes as
    # rows of a gather (an embedding table's) in every block that reads
    # them, and the most rows one block's gradient has. Their gradients
    # leave the conditional over the blocks as those rows, and are added
    # to the total at their indices; the others' leave it whole. A
    # conditional's outputs are fixed before its branches are traced, so
    # what a trace finds goes to `learned`, and a caller whose plan it
    # changes traces again (`xla_gradient`).
    self.gathered = dict(gathered or {})
    self.learned = {}
    # block -> {(stack, float leaf): reads}, counted as the forward run is
    # traced (`_counting_reads`).
    self._reads_per_block = {}

  def gradient(self, args, upstream, variables, bound):
    """`(gradients, finished)`: the gradients of the floating-point leaves
    of `args` then of `variables`, given the `upstream` gradients of the
    result's leaves, from a run of at most `bound` steps; `finished` says
    whether every member halted within them (else the gradients are
    junk)."""
    rt = self.runtime
    leaves = tf.nest.flatten(args)
    floats = [x for x in leaves if x.dtype.is_floating]
    with vectorize.for_xla_gradient():
      layout = rt.layout_for(leaves[0].shape[0])
      if len(layout.dispatches) != 1 or layout.banks.sizes:
        raise ValueError("the reverse VM needs pc:graph's layout (one "
                         "dispatch, no banks)")
      with tf.GradientTape(watch_accessed_variables=False) as start_tape:
        start_tape.watch(floats)
        start = rt.initial_state(layout, args)
      steps, nxt, end, record = self._forward(layout, start, bound)
      adjoint = self._result_adjoint(layout, end, upstream)
      adjoint, variable_grads = self._backward(
          layout, start, end, record, steps, adjoint, variables)
    input_grads = start_tape.gradient(
        _float_leaves(self._differentiable(start)), floats,
        output_gradients=adjoint,
        unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return ([tf.convert_to_tensor(g) for g in input_grads]
            + variable_grads), nxt >= rt.program.halt

  @staticmethod
  def _differentiable(state):
    """The part of the loop state that carries adjoints."""
    return {"registers": state["registers"], "stacks": state["stacks"]}

  def _forward(self, layout, start, bound):
    """The VM run from `start` for at most `bound` steps, recording each
    step: `(steps, the next block, the end state, record)`."""
    rt = self.runtime
    registers = tf.nest.flatten(start["registers"])
    names = layout.stacks.names
    blocks = range(rt.program.halt)

    def array(like, dtype=None):
      return tf.TensorArray(dtype or like.dtype, size=bound,
                            element_shape=like.shape)

    def undo_arrays():
      """Per stack: the rows each step wrote, its mask, the old values."""
      z = layout.batch_size
      return {name: (
          tf.TensorArray(tf.int32, size=bound, element_shape=[z]),
          tf.TensorArray(tf.bool, size=bound, element_shape=[z]),
          tf.nest.map_structure(lambda s: array(s[0]),
                                layout.stacks.view(start["stacks"], name)))
              for name in names}

    record = {
        "block": tf.TensorArray(tf.int32, size=bound, element_shape=[]),
        "registers": [array(r) for r in registers],
        "undo": undo_arrays(),
    }

    def body(t, nxt, state, record):
      record = dict(record)
      record["block"] = record["block"].write(t, nxt)
      record["registers"] = [
          a.write(t, r) for a, r in
          zip(record["registers"], tf.nest.flatten(state["registers"]))]
      new_registers, writes, overwritten = tf.switch_case(nxt, [
          self._counting_reads(layout, i, state) for i in blocks])
      undo = {}
      for name in names:
        write, old = writes[name], overwritten[name]
        rows, masks, values = record["undo"][name]
        undo[name] = (rows.write(t, write.row), masks.write(t, write.mask),
                      tf.nest.map_structure(lambda a, v: a.write(t, v),
                                            values, old))
      record["undo"] = undo
      state = dict(state, registers=new_registers,
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

  def _counting_reads(self, layout, i, state):
    """Block i's `block_outputs` on `state` and the stack rows it
    overwrites, as a conditional's branch, counting the block's reads of each floating-point stack leaf into
    `_reads_per_block`: the backward step returns an adjoint for each
    read, in as many slots as the most reads of any block."""
    def run():
      leaf_of = _float_stack_leaves(state["stacks"], layout.stacks.names)
      counts = self._reads_per_block.setdefault(i, collections.Counter())
      def on_read(stack, sp, rows):
        del sp
        for key, _ in _float_reads(stack, rows, leaf_of):
          counts[key] += 1
      with stack_banks.reads_observed(on_read):
        registers, writes = self.runtime.block_outputs(layout, i, state)
      # The rows the block overwrites, read here: a stack read only
      # inside the conditional, then written in place after it, as the VM
      # does (`pc_vm`); read outside as well, XLA copied it at every step.
      overwritten = {
          name: stack_banks.rows_at(
              layout.stacks.view(state["stacks"], name), write.row)
          for name, write in writes.items()}
      return registers, writes, overwritten
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

    The stacks' adjoints ([D, Z, ...] each) stay out of the conditional
    over the blocks, which would copy each one it returns at every step:
    the rows a step overwrote are read and cleared before it, from the
    record, and the rows its block read get the reads' adjoints after it,
    which the block returns in a fixed number of slots per stack leaf."""
    rt = self.runtime
    names = layout.stacks.names
    blocks = range(rt.program.halt)
    register_structure = start["registers"]
    slots = collections.Counter()
    for counts in self._reads_per_block.values():
      for key, n in counts.items():
        slots[key] = max(slots[key], n)
    slots = sorted(slots.items())
    num_registers = len(_float_leaves(end["registers"]))
    adjoint_registers = adjoint[:num_registers]
    adjoint_stacks = {}
    position = num_registers
    for name in names:
      n = len(_float_leaves(end["stacks"][name]))
      adjoint_stacks[name] = adjoint[position:position + n]
      position += n

    def step_adjoint(i, state, adjoint_registers, written):
      """Block i's step taken back: the adjoints of the registers before
      it, of the rows it read (`slots`) and of the variables; `written`
      holds, per stack, the adjoints of the values the block wrote."""
      sources = _float_leaves(state["registers"])
      leaf_of = _float_stack_leaves(state["stacks"], names)
      reads = []   # ((stack, float leaf), rows read, the rows' values)
      with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(sources)
        tape.watch(variables)
        def on_read(stack, sp, rows):
          for key, values in _float_reads(stack, rows, leaf_of):
            tape.watch(values)
            reads.append((key, sp, values))
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
      variable_grads = [
          self._contribution(k, g, v) for k, (g, v) in
          enumerate(zip(grads[len(sources) + len(reads):], variables))]
      filled = []
      for key, n in slots:
        mine = [(sp, _dense(g, values)) for (k, sp, values), g in
                zip(reads, read_grads) if k == key]
        if len(mine) > n:
          raise ValueError(f"block {i} reads stack leaf {key} {len(mine)} "
                           f"times, more than the {n} counted")
        like = adjoint_stacks[key[0]][key[1]][0]
        mine += [(tf.zeros(like.shape[:1], tf.int32), tf.zeros_like(like))
                 ] * (n - len(mine))
        filled.append(mine)
      return register_grads, filled, variable_grads

    def body(t, stacks, adjoint_registers, adjoint_stacks, totals):
      t = t - 1
      i = record["block"].read(t)
      stacks = dict(stacks)
      adjoint_stacks = dict(adjoint_stacks)
      written = {}
      for name in names:
        rows, masks, values = record["undo"][name]
        row, mask = rows.read(t), masks.read(t)
        stacks[name] = stack_banks.apply_stack_write(
            stacks[name], stack_banks.StackWrite(
                row, tf.nest.map_structure(lambda a: a.read(t), values),
                mask), xla=True)
        # The rows the step overwrote: their adjoint goes to the values
        # written, and none is left for what they held before.
        leaves = adjoint_stacks[name]
        if not leaves:
          written[name] = []
          continue
        written[name] = [
            tf.where(_expand(mask, g), g, tf.zeros_like(g))
            for g in stack_banks.rows_at(leaves, row)]
        adjoint_stacks[name] = stack_banks.apply_stack_write(
            leaves, stack_banks.StackWrite(
                row, [tf.zeros_like(x[0]) for x in leaves], mask), xla=True)
      state = dict(
          end, stacks=stacks,
          registers=tf.nest.pack_sequence_as(
              register_structure, [a.read(t) for a in record["registers"]]))
      adjoint_registers, filled, grads = tf.switch_case(i, [
          (lambda i=i: step_adjoint(i, state, adjoint_registers, written))
          for i in blocks])
      for ((name, j), _), entries in zip(slots, filled):
        leaves = list(adjoint_stacks[name])
        for sp, g in entries:
          leaves[j] = stack_banks.add_at_rows(leaves[j], sp, g)
        adjoint_stacks[name] = leaves
      totals = [_added(total, g) for total, g in zip(totals, grads)]
      return t, stacks, adjoint_registers, adjoint_stacks, totals

    totals = [tf.zeros_like(v) for v in variables]
    _, _, adjoint_registers, adjoint_stacks, totals = tf.while_loop(
        lambda t, *_: t > 0, body,
        (steps, end["stacks"], adjoint_registers, adjoint_stacks, totals))
    return adjoint_registers + [
        g for name in names for g in adjoint_stacks[name]], totals

  def _contribution(self, position, gradient, variable):
    """A block's gradient of the variable at `position`, as the
    conditional over the blocks returns it: `(indices, rows)`, padded to
    the planned rows with indices past the table (which XLA's scatter
    skips), for a gathered variable (`gathered`), else dense."""
    rows = self.gathered.get(position)
    if isinstance(gradient, tf.IndexedSlices):
      found = gradient.values.shape[0]
      if self.learned.get(position, 0) is not DENSE:
        self.learned[position] = max(self.learned.get(position, 0), found)
    elif gradient is not None:
      self.learned[position] = DENSE
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


def _added(total, gradient):
  """`total` plus one step's gradient: dense, or rows at their indices
  (`ReverseVm._contribution`), added in place under XLA."""
  if isinstance(gradient, tuple):
    indices, values = gradient
    return tf.tensor_scatter_nd_add(total, indices[:, None], values)
  return total + gradient


def _float_stack_leaves(stacks, names):
  """{id of a stack's floating-point leaf: (stack, its place among the
  stack's floating-point leaves)}."""
  out = {}
  for name in names:
    floats = _float_leaves(stacks[name])
    for j, leaf in enumerate(floats):
      out[id(leaf)] = (name, j)
  return out


def _float_reads(stack, rows, leaf_of):
  """`[((stack, float leaf), values)]` of a read of `stack`'s `rows`."""
  return [(leaf_of[id(leaf)], values) for leaf, values in
          zip(tf.nest.flatten(stack), tf.nest.flatten(rows))
          if _is_float(values) and id(leaf) in leaf_of]


def _expand(mask, like):
  """A [Z] mask broadcast against [Z, ...] `like`."""
  return tf.reshape(mask, [-1] + [1] * (like.shape.rank - 1))
