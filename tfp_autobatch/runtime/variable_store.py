"""How the program-counter VM stores one variable of the batch.

A register is a tensor [Z, ...]. A stacked variable (one a recursive call
saves and restores) is a dict `store`:

  {top [Z, ...], sp [Z]}, and a stack [D, Z, ...] kept by the VM apart
                            (cached top, the optimised layout): the
                            current value is `top`, the saved ones sit
                            below `sp` in the stack, which a block only
                            reads; a push returns a `StackWrite` for the
                            VM's loop to apply after the block;
  {stack [D, Z, ...], sp [Z]}
                            (the unoptimised layout, kept for
                            comparison): the current value is the row at
                            `sp`, written in place.
"""
import tensorflow as tf

from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.runtime import batch_state
from tfp_autobatch.runtime import stack_banks


def _set_rows(stack, sp, value, mask):
  """`stack` with `stack[sp[i], i] = value[i]` where `mask[i]`.

  A select against a one-hot of the stack pointers rather than a scatter:
  XLA on CPU runs a scatter as a loop over rows, a select as one fused pass.
  """
  def leaf(s, v):
    rows = batch_state.row_indices(batch_state.size(s))
    hit = tf.logical_and(tf.equal(rows[:, None], sp[None, :]),
                         mask[None, :])
    return batch_state.where(hit, v[None], s)
  return tf.nest.map_structure(leaf, stack, value)


class VariableStore:
  """The stores of a program's variables.

  Args:
    stacked: the names of the stacked variables.
    cached_top: whether stacked variables keep their current value in a
      register (`top`) and their saved values in a stack the VM applies
      writes to (see the module docstring).
    depth: D, the rows of a stack.
  """

  def __init__(self, stacked, cached_top, depth):
    self.stacked = frozenset(stacked)
    self.cached_top = cached_top
    self.depth = depth

  def initial(self, v, value, type_, z):
    """`(store, stack)` of variable `v` holding `value` [Z, ...] of type
    `type_`; `stack` is the [D, Z, ...] stack the VM keeps apart (a cached
    top), else None."""
    if v not in self.stacked:
      return value, None
    stack = types_lib.zeros(type_, self.depth, z)
    sp = tf.zeros([z], tf.int32)
    if self.cached_top:
      return {"top": value, "sp": sp}, stack
    return {"stack": _set_rows(stack, sp, value, tf.ones([z], tf.bool)),
            "sp": sp}, None

  def initial_spec(self, v, type_, batch_size):
    """`(store, stack)` as `initial` returns them, as `tf.TensorSpec`s for
    a batch of `batch_size` members (None: unknown)."""
    z = batch_size
    value = tf.nest.map_structure(lambda t: t.spec((z,)), type_)
    if v not in self.stacked:
      return value, None
    stack = tf.nest.map_structure(lambda t: t.spec((self.depth, z)), type_)
    sp = tf.TensorSpec([z], tf.int32)
    if self.cached_top:
      return {"top": value, "sp": sp}, stack
    return {"stack": stack, "sp": sp}, None

  def value(self, store, v):
    """The current value of variable `v` (every row)."""
    if v not in self.stacked:
      return store
    if self.cached_top:
      return store["top"]
    return stack_banks.rows_at(store["stack"], store["sp"])

  def write(self, store, v, value, mask):
    """`store` with v's current value set to `value` where `mask`."""
    if v not in self.stacked:
      return batch_state.where(mask, value, store)
    store = dict(store)
    if self.cached_top:
      store["top"] = batch_state.where(mask, value, store["top"])
    else:
      store["stack"] = _set_rows(store["stack"], store["sp"], value, mask)
    return store

  def push(self, store, value, mask):
    """Saves `value` (the variable's current value) below a new current
    slot, where `mask`.

    Returns the new store and, with a cached top, the StackWrite that saves
    `value` (None otherwise: the stack in the store is already written).
    """
    store = dict(store)
    top = self.depth - 1
    sp = store["sp"]
    write = None
    if self.cached_top:
      # The top keeps the value: the block writes it back if it is live.
      write = stack_banks.StackWrite(tf.minimum(sp, top), value, mask)
    else:
      stack = _set_rows(store["stack"], tf.minimum(sp, top), value, mask)
      store["stack"] = _set_rows(stack, tf.minimum(sp + 1, top), value, mask)
    store["sp"] = sp + tf.cast(mask, tf.int32)
    return store, write

  def pop(self, store, mask, keep, stack=None):
    """`(store, saved)`: restores the saved value where `mask`; `keep`
    leaves the saved copy (Update). With a cached top, `stack` is the
    variable's stack."""
    store = dict(store)
    sp = store["sp"] - tf.cast(mask, tf.int32)
    if self.cached_top:
      saved = stack_banks.rows_at(stack, tf.maximum(sp, 0))
      store["top"] = batch_state.where(mask, saved, store["top"])
      if not keep:
        store["sp"] = sp
      return store, saved
    saved = stack_banks.rows_at(store["stack"], tf.maximum(sp, 0))
    if keep:
      store["stack"] = _set_rows(store["stack"], store["sp"], saved, mask)
    else:
      store["sp"] = sp
    return store, saved
