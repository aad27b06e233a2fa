"""Per-example `tf.cond`/`tf.switch_case` vectorised as selects, for XLA.

pfor vectorises a conditional whose predicate differs by row by
partitioning the rows (`DynamicPartition`), running each branch on its
part and stitching the results back (`DynamicStitch`). XLA cannot compile
that inside the VM's loop: the parts have sizes known only at run time,
and `DynamicStitch` needs its indices as constants ("Reading input as
constant from a dynamic tensor is not yet supported"). Under
`as_selects()` such a conditional runs every branch on every row and
selects each row's result with `tf.where`, as the VM does for its own
blocks (XLA never raises, so a branch's junk rows are harmless). A
conditional whose predicate is the same for every row keeps pfor's own
conversion. `pc:xla` always vectorises under `as_selects()`; `pc:graph`
does where it is traced inside a user's `tf.function(jit_compile=True)`
(`in_xla_context`).
"""
import contextlib

import tensorflow as tf

from tfp_autobatch.runtime import batch_state
from tfp_autobatch.runtime._tf_private import control_flow_util
from tfp_autobatch.runtime._tf_private import pfor as _pfor



def _selected(pfor_input, branch_names, index):
  """Every branch's outputs on every row; row r takes branch index[r]'s
  (an index out of range the last branch's, as `tf.switch_case` does)."""
  inputs = pfor_input.inputs[1:]
  outputs = [_pfor._outputs_for_branch(name, None, pfor_input, inputs)  # pylint: disable=protected-access
             for name in branch_names]
  result = outputs[-1]
  for i, branch_outputs in enumerate(outputs[:-1]):
    result = batch_state.where(tf.equal(index, i), branch_outputs, result)
  return [_pfor.wrap(t, True) for t in result]


def _make_if_converter(pfor_converter):
  def convert_if(pfor_input):
    cond, stacked, _ = pfor_input.input(0)
    if not stacked:
      return pfor_converter(pfor_input)
    return _selected(pfor_input, [pfor_input.get_attr("else_branch").name,
                                  pfor_input.get_attr("then_branch").name],
                     tf.cast(cond, tf.int32))
  return convert_if


def _make_case_converter(pfor_converter):
  def convert_case(pfor_input):
    index, stacked, _ = pfor_input.input(0)
    if not stacked:
      return pfor_converter(pfor_input)
    return _selected(pfor_input,
                     [b.name for b in pfor_input.get_attr("branches")], index)
  return convert_case


def _select_converters():
  if _pfor is None:
    return {}
  registry = _pfor._pfor_converter_registry  # pylint: disable=protected-access
  makers = {"If": _make_if_converter, "StatelessIf": _make_if_converter,
            "Case": _make_case_converter,
            "StatelessCase": _make_case_converter}
  return {op: make(registry[op]) for op, make in makers.items()
          if op in registry}


_SELECT_CONVERTERS = _select_converters()


def in_xla_context():
  """Whether the graph being built will be compiled by XLA: traced for
  `pc:xla`, or inside a user's `tf.function(jit_compile=True)`."""
  return control_flow_util.GraphOrParentsInXlaContext(
      tf.compat.v1.get_default_graph())


@contextlib.contextmanager
def as_selects():
  """Within it, pfor vectorises per-example conditionals as selects."""
  if not _SELECT_CONVERTERS:
    yield
    return
  registry = _pfor._pfor_converter_registry  # pylint: disable=protected-access
  saved = {op: registry[op] for op in _SELECT_CONVERTERS}
  registry.update(_SELECT_CONVERTERS)
  try:
    yield
  finally:
    registry.update(saved)
