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
import tensorflow as tf

from tfp_autobatch.runtime import stack_banks
from tfp_autobatch.runtime import vectorize


def _is_float(x):
  return x.dtype.is_floating or x.dtype.is_complex


def _float_leaves(nest):
  return [x for x in tf.nest.flatten(nest) if _is_float(x)]


def _with_float_leaves(nest, floats):
  """`nest` with its floating-point leaves replaced, in order."""
  floats = iter(floats)
  return tf.nest.pack_sequence_as(nest, [
      next(floats) if _is_float(x) else x for x in tf.nest.flatten(nest)])


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

  def __init__(self, runtime):
    self.runtime = runtime

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
      new_registers, writes = rt.block_outputs(layout, nxt, state)
      undo = {}
      for name in names:
        write = writes[name]
        old = stack_banks.rows_at(layout.stacks.view(state["stacks"], name),
                                  write.row)
        rows, masks, values = record["undo"][name]
        undo[name] = (rows.write(t, write.row), masks.write(t, write.mask),
                      tf.nest.map_structure(lambda a, v: a.write(t, v),
                                            values, old))
      record["undo"] = undo
      state = dict(state, registers=new_registers,
                   stacks=layout.stacks.apply(state["stacks"], writes,
                                              xla=False))
      return t + 1, rt.next_block(layout, state), state, record

    halt = rt.program.halt
    def running(t, nxt, state, record):
      del state, record
      return tf.logical_and(t < bound, nxt < halt)

    steps, nxt, end, record = tf.while_loop(
        running, body, (tf.constant(0), rt.next_block(layout, start), start,
                        record))
    return steps, nxt, end, record

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
    gradients, from the end state's `adjoint`."""
    rt = self.runtime
    names = layout.stacks.names
    blocks = range(rt.program.halt)
    register_structure = start["registers"]

    def step_adjoint(i, state, adjoint, totals):
      """Block i's step taken back: its before-state's adjoint."""
      sources = _float_leaves(state["registers"])
      adjoint_after = _with_float_leaves(self._differentiable(state),
                                         adjoint)
      leaf_of = {id(leaf): (name, j) for name in names for j, leaf in
                 enumerate(tf.nest.flatten(state["stacks"][name]))}
      reads = []   # (stack, leaf, rows read, the rows' values)
      with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(sources)
        tape.watch(variables)
        def on_read(stack, sp, rows):
          for leaf, values in zip(tf.nest.flatten(stack),
                                  tf.nest.flatten(rows)):
            if _is_float(values) and id(leaf) in leaf_of:
              tape.watch(values)
              reads.append(leaf_of[id(leaf)] + (sp, values))
        with stack_banks.reads_observed(on_read):
          registers, writes = rt.block_outputs(layout, i, state)
      targets = _float_leaves(registers)
      target_grads = _float_leaves(adjoint_after["registers"])
      pushed = [name for name in names if name in layout.pushed[i]]
      for name in pushed:
        write = writes[name]
        targets += _float_leaves(write.value)
        target_grads += [
            tf.where(_expand(write.mask, g), g, tf.zeros_like(g))
            for g in _float_leaves(stack_banks.rows_at(
                adjoint_after["stacks"][name], write.row))]
      read_values = [values for _, _, _, values in reads]
      grads = tape.gradient(
          targets, sources + read_values + list(variables),
          output_gradients=target_grads,
          unconnected_gradients=tf.UnconnectedGradients.ZERO)
      register_grads = grads[:len(sources)]
      read_grads = grads[len(sources):len(sources) + len(reads)]
      variable_grads = grads[len(sources) + len(reads):]
      # The stack rows the block overwrote: their adjoint went to the
      # values written. The rows it read get the reads' adjoints.
      stacks = {}
      for name in names:
        stack = adjoint_after["stacks"][name]
        if name in pushed:
          write = writes[name]
          stack = stack_banks.apply_stack_write(stack, write._replace(
              value=tf.nest.map_structure(lambda x: tf.zeros_like(x[0]),
                                          stack)))
        leaves = tf.nest.flatten(stack)
        for (read_name, j, sp, _), g in zip(reads, read_grads):
          if read_name == name:
            leaves[j] = stack_banks.add_at_rows(leaves[j], sp, _dense(g, leaves[j][0]))
        stacks[name] = tf.nest.pack_sequence_as(stack, leaves)
      before = {"registers": _with_float_leaves(
          state["registers"],
          [_dense(g, s) for g, s in zip(register_grads, sources)]),
                "stacks": stacks}
      return _float_leaves(before), [
          _dense(g, v) for g, v in zip(variable_grads, variables)]

    def body(t, stacks, adjoint, totals):
      t = t - 1
      i = record["block"].read(t)
      for name in names:
        rows, masks, values = record["undo"][name]
        stacks = dict(stacks)
        stacks[name] = stack_banks.apply_stack_write(
            stacks[name], stack_banks.StackWrite(
                rows.read(t), tf.nest.map_structure(lambda a: a.read(t),
                                                    values),
                masks.read(t)))
      state = dict(
          end, stacks=stacks,
          registers=tf.nest.pack_sequence_as(
              register_structure, [a.read(t) for a in record["registers"]]))
      adjoint, grads = tf.switch_case(i, [
          (lambda i=i: step_adjoint(i, state, adjoint, totals))
          for i in blocks])
      totals = [t + g for t, g in zip(totals, grads)]
      return t, stacks, adjoint, totals

    totals = [tf.zeros_like(v) for v in variables]
    _, _, adjoint, totals = tf.while_loop(
        lambda t, *_: t > 0, body,
        (steps, end["stacks"], adjoint, totals))
    return adjoint, totals


def _added(total, gradient):
  """`total + gradient`; a sparse gradient (a table's rows read by a
  gather) is added at its rows, in place under XLA."""
  if isinstance(gradient, tf.IndexedSlices):
    return tf.tensor_scatter_nd_add(total, gradient.indices[:, None],
                                    gradient.values)
  return total + gradient


def _expand(mask, like):
  """A [Z] mask broadcast against [Z, ...] `like`."""
  return tf.reshape(mask, [-1] + [1] * (like.shape.rank - 1))
