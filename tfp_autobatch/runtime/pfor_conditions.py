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
(`_tf_private.in_xla_context`).

Under `as_selects()` too, a split, concatenation, reduction or
cumulative sum or product whose axis is a constant keeps its (shifted)
axis a constant, where pfor computes it in the graph. XLA needs the axes
of their gradients at compile time: `pc:xla`'s gradient (`reverse_vm`)
differentiates the blocks inside its loop, where a computed axis is a
value XLA cannot read as a constant. And a per-example `tf.where` on a
scalar condition computes its per-row condition once where the select is
large (`CONDITION_ONCE_FROM_ELEMENTS`).
"""
import contextlib

import numpy as np
import tensorflow as tf

from tfp_autobatch.runtime import _xla
from tfp_autobatch.runtime import batch_state
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


def _shifted_axis(axis):
  """pfor's axis (or axes) of an op on the stacked rows for the
  per-example op's `axis` (a tensor), as a Python int (or list); None if
  `axis` is not constant."""
  value = tf.get_static_value(axis)
  if value is None:
    return None
  return np.where(value >= 0, value + 1, value).tolist()


def _make_split_converter(pfor_converter):
  def convert_split(pfor_input):
    axis = _shifted_axis(pfor_input.unstacked_input(0))
    if axis is None:
      return pfor_converter(pfor_input)
    parts = tf.split(pfor_input.stacked_input(1),
                     pfor_input.get_attr("num_split"), axis=axis)
    return [_pfor.wrap(t, True) for t in parts]
  return convert_split


def _make_concat_converter(pfor_converter):
  def convert_concat(pfor_input):
    n = pfor_input.num_inputs
    axis = _shifted_axis(pfor_input.unstacked_input(n - 1))
    if axis is None:
      return pfor_converter(pfor_input)
    pfor_input.stack_inputs(stack_indices=range(n - 1))
    return _pfor.wrap(tf.concat([x.t for x in pfor_input.inputs[:n - 1]],
                                axis=axis), True)
  return convert_concat


def _make_axis_op_converter(op, **attrs):
  """A converter for an op of (input, axis), a reduction or a cumulative
  sum or product, that calls `op(stacked input, shifted axis, keyword=
  the op's attribute, ...)` for `attrs` {keyword: attribute name}."""
  def make(pfor_converter):
    def convert(pfor_input):
      axis = _shifted_axis(pfor_input.unstacked_input(1))
      if axis is None:
        return pfor_converter(pfor_input)
      return _pfor.wrap(op(pfor_input.stacked_input(0), axis, **{
          keyword: pfor_input.get_attr(name)
          for keyword, name in attrs.items()}), True)
    return convert
  return make


# A per-example `tf.where` with a scalar condition and values of several
# elements selects on a per-row condition. XLA fuses that condition's
# computation into the select and evaluates it again for every element of
# the row; NUTS's merges (an acceptance test, a log-sum-exp, a divergence
# check) spent most of their register writes doing so. From this many
# elements of the select's result, the condition is computed once per row
# (`_xla.computed_once`), at the price of a kernel of its own, which a
# small select does not repay (`python -m benchmarks.nuts_vm_steps
# --model=eight_schools` times both sides of the threshold).
CONDITION_ONCE_FROM_ELEMENTS = 1024


def _make_select_converter(pfor_converter):
  def convert_select(pfor_input):
    cond, cond_stacked, _ = pfor_input.input(0)
    if not cond_stacked or cond.shape.rank != 1:
      return pfor_converter(pfor_input)
    pfor_input.expanddim_inputs_for_broadcast()
    cond, t, e = (pfor_input.input(i)[0] for i in range(3))
    shape = tf.broadcast_static_shape(
        cond.shape, tf.broadcast_static_shape(t.shape, e.shape))
    if (not shape.is_fully_defined()
        or shape.num_elements() < CONDITION_ONCE_FROM_ELEMENTS
        or shape.num_elements() == shape[0]):
      return _pfor.wrap(tf.where(cond, t, e), True)
    once = _xla.computed_once(tf.cast(cond, tf.float32)) > 0.5
    return _pfor.wrap(tf.where(once, t, e), True)
  return convert_select


def _select_converters():
  if _pfor is None:
    return {}
  registry = _pfor._pfor_converter_registry  # pylint: disable=protected-access
  makers = {"If": _make_if_converter, "StatelessIf": _make_if_converter,
            "Case": _make_case_converter,
            "SelectV2": _make_select_converter,
            "StatelessCase": _make_case_converter,
            "Split": _make_split_converter,
            "ConcatV2": _make_concat_converter,
            "Cumsum": _make_axis_op_converter(
                tf.math.cumsum, exclusive="exclusive", reverse="reverse"),
            "Cumprod": _make_axis_op_converter(
                tf.math.cumprod, exclusive="exclusive", reverse="reverse")}
  makers.update({op: _make_axis_op_converter(reduce, keepdims="keep_dims")
                 for op, reduce in (
      ("Sum", tf.reduce_sum), ("Prod", tf.reduce_prod),
      ("Max", tf.reduce_max), ("Min", tf.reduce_min),
      ("Mean", tf.reduce_mean), ("All", tf.reduce_all),
      ("Any", tf.reduce_any))})
  return {op: make(registry[op]) for op, make in makers.items()
          if op in registry}


_SELECT_CONVERTERS = _select_converters()

@contextlib.contextmanager
def as_selects():
  """Within it, pfor vectorises per-example conditionals as selects (and
  keeps constant axes constant: see the module docstring)."""
  converters = dict(_SELECT_CONVERTERS)
  if not converters:
    yield
    return
  registry = _pfor._pfor_converter_registry  # pylint: disable=protected-access
  saved = {op: registry[op] for op in converters}
  registry.update(converters)
  try:
    yield
  finally:
    registry.update(saved)
