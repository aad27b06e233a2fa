"""The program-counter VM's stacks, kept in banks under XLA.

Each stacked variable (and the pc) has a stack of D frames per member: a
nest of [D, Z, ...] buffers. A block reads them (pops) and returns one
`StackWrite` per stack it pushes; the VM's loop applies the writes after
the block, in place (see `pc_vm`). Applied one stack at a time, that is a
scatter per stack leaf and per VM step, also for the stacks the block left
alone: NUTS has 22 stack leaves, so 22 scatters a step, each a kernel of
its own in XLA's compiled loop, whose dispatch is a sizeable part of a VM
step at one chain.

`StackBanks` keeps the leaves of one dtype and per-example shape together,
as [D, S, Z, ...] (S leaves), and applies a block's writes to a bank with
one scatter of K * Z rows, K being the most leaves of that bank any one
block of its dispatch writes (`dispatch.Dispatch`). Reading a stack is a
static slice `bank[:, slot]`, which XLA fuses into the gather of the
popped rows. Masked-off rows and padding get the out-of-range row D,
which XLA's scatter skips.

Banks are for XLA only. Elsewhere TensorFlow raises on out-of-range rows,
and a static slice is a copy, so with `enabled=False` every leaf stays a
stack of its own and is written as before.
"""
import collections
import contextlib
import contextvars

import numpy as np
import tensorflow as tf

from tfp_autobatch import errors
from tfp_autobatch.runtime import _tf_private
from tfp_autobatch.runtime import batch_state

# `stack[row[i], i] = value[i]` where `mask[i]`, applied after a block.
StackWrite = collections.namedtuple("StackWrite", ["row", "value", "mask"])


def _row_pairs(rows):
  """Gather/scatter indices `(rows[i], i)` of a [D, Z, ...] stack, as XLA
  takes them (see `_flat_rows` for elsewhere)."""
  return tf.stack([rows, batch_state.row_indices(batch_state.size(rows))],
                  axis=1)


def _flat_rows(depth, sp):
  """Rows `sp[i] * Z + i` of a [D, Z, ...] stack seen as [D * Z, ...] (see
  `_as_rows`), `sp` clipped into the stack.

  One row index per member, where `tf.gather_nd` needs a [Z, 2] index
  built with a stack of two vectors: TensorFlow's CPU kernel copies that
  element by element, a noticeable part of a `pc:graph` step on thousands
  of members.

  int32 where D * Z is known to fit, else int64 (a stack of 2**31 rows or
  more, or a batch size unknown at trace time)."""
  z = batch_state.size(sp)
  sp = tf.clip_by_value(sp, 0, depth - 1)
  rows = batch_state.row_indices(z)
  if not (isinstance(depth, int) and isinstance(z, int)
          and depth * z <= np.iinfo(np.int32).max):
    sp, rows, z = (tf.cast(x, tf.int64) for x in (sp, rows, z))
  return sp * z + rows


def _as_rows(s):
  """A [D, Z, ...] stack as [D * Z, ...] (event shapes are static)."""
  return tf.reshape(s, [-1] + s.shape[2:].as_list())


# `_filled` makes a constant of at most this many elements (as `tf.zeros`
# does): a larger one would be carried whole in the graph and the HLO.
_CONSTANT_FILL_MAX_ELEMENTS = 1024


def _filled(shape, value):
  """An int32 tensor of `shape` (a size, or a tuple of sizes) filled with
  `value`: one constant where the sizes are Python ints (under `pc:xla`,
  always) and few (`tf.fill` costs the trace three ops, in every block's
  every stack write), else `tf.fill`."""
  shape = shape if isinstance(shape, tuple) else (shape,)
  if (all(isinstance(n, int) for n in shape)
      and np.prod(shape) <= _CONSTANT_FILL_MAX_ELEMENTS):
    return tf.constant(np.full(shape, value, np.int32))
  return tf.fill(list(shape), value)


def _row_or_skip(write, depth):
  """The rows a write goes to under XLA: out of range (so XLA's scatter
  skips it) for the members masked off."""
  return tf.where(write.mask, tf.clip_by_value(write.row, 0, depth - 1),
                  depth)


_ON_READ = contextvars.ContextVar("tfp_autobatch_on_stack_read",
                                  default=None)


@contextlib.contextmanager
def reads_observed(on_read):
  """Within it, each `rows_at(stack, sp)` calls `on_read(stack, sp, rows)`
  with the rows it read, before they are used, and returns what that
  returns instead where not None: the reverse VM (`reverse_vm`) records
  the rows a block read, and when it runs the block again, serves them
  from its record, watches them, and sends their adjoints to those rows
  of the stack's adjoint (rather than differentiating the read, whose
  gradient would be a dense [D, Z, ...] buffer)."""
  token = _ON_READ.set(on_read)
  try:
    yield
  finally:
    _ON_READ.reset(token)


def rows_at(stack, sp):
  """`stack[sp[i], i]` for each row i, per leaf."""
  depth = batch_state.size(tf.nest.flatten(stack)[0])
  if _tf_private.in_xla_context():
    # XLA fuses a bank's static slice (`StackBanks.view`) into this gather.
    idx = _row_pairs(tf.clip_by_value(sp, 0, depth - 1))
    rows = tf.nest.map_structure(lambda s: tf.gather_nd(s, idx), stack)
  else:
    flat = _flat_rows(depth, sp)
    rows = tf.nest.map_structure(lambda s: tf.gather(_as_rows(s), flat),
                                 stack)
  on_read = _ON_READ.get()
  if on_read is not None:
    replaced = on_read(stack, sp, rows)
    if replaced is not None:
      rows = replaced
  return rows


def add_at_rows(stack, sp, values):
  """`stack` with `values[i]` added to `stack[sp[i], i]` for each row i,
  per leaf (`sp` clipped into the stack, as `rows_at` reads)."""
  def leaf(s, v):
    idx = _row_pairs(tf.clip_by_value(sp, 0, batch_state.size(s) - 1))
    return tf.tensor_scatter_nd_add(s, idx, v)
  return tf.nest.map_structure(leaf, stack, values)


def apply_stack_write(stack, write, xla=False):
  """`stack` with one `StackWrite` applied: a scatter of Z rows, in place
  under XLA. Under XLA masked-off members get an out-of-range row, which
  XLA's scatter skips; elsewhere (TF raises on such rows) their old rows
  are gathered and written back unchanged."""
  if xla:
    idx = _row_pairs(
        _row_or_skip(write, batch_state.size(tf.nest.flatten(stack)[0])))
    return tf.nest.map_structure(
        lambda s, v: batch_state.tensor_scatter_nd_update(s, idx, v), stack,
        write.value)
  rows = _flat_rows(batch_state.size(tf.nest.flatten(stack)[0]), write.row)
  def leaf(s, v):
    flat = _as_rows(s)
    new = batch_state.where(write.mask, v, tf.gather(flat, rows))
    return tf.reshape(
        batch_state.tensor_scatter_nd_update(flat, rows[:, None], new),
        tf.shape(s))
  return tf.nest.map_structure(leaf, stack, write.value)


def no_write(stack, z, zeros=None):
  """A StackWrite of `stack` (a nest of [D, Z, ...] tensors or
  `tf.TensorSpec`s) that writes nothing (every row masked off).

  `zeros`: a dict that the no-writes of one block share, so that they
  share their zeros too (the rows and mask, and one value per dtype and
  shape), instead of each building its own: every stack a block leaves
  alone needs one, and under pc:graph they were about a tenth of the ops
  of a NUTS trace."""
  zeros = {} if zeros is None else zeros
  def shared(key, make):
    if key not in zeros:
      zeros[key] = make()
    return zeros[key]
  return StackWrite(
      shared("row", lambda: tf.zeros([z], tf.int32)),
      tf.nest.map_structure(
          lambda s: shared((s.dtype, tuple(s.shape[2:])),
                           lambda: tf.zeros([z] + s.shape[2:].as_list(),
                                            s.dtype)), stack),
      shared("mask", lambda: tf.zeros([z], tf.bool)))


class StackBanks:
  """The layout of the VM's stacks, built from an example of them.

  Args:
    stacks: {name: nest of [D, Z, ...] tensors or `tf.TensorSpec`s}, the
      initial stacks (only their structure, dtypes and shapes are read).
    depth: D.
    enabled: bank the leaves (XLA); otherwise every leaf is its own stack.
  """

  def __init__(self, stacks, depth, enabled=True):
    self.names = sorted(stacks)
    self.depth = depth
    self.structure = {k: stacks[k] for k in self.names}
    self.enabled = enabled
    self._slots = {}      # name -> per flat leaf (bank key, slot)
    self.sizes = {}       # bank key -> leaves S
    for name in self.names:
      slots = []
      for leaf in tf.nest.flatten(stacks[name]):
        key = (leaf.dtype.name, tuple(leaf.shape[2:].as_list()))
        slots.append((key, self.sizes.get(key, 0)))
        self.sizes[key] = self.sizes.get(key, 0) + 1
      self._slots[name] = slots

  def initial(self, stacks):
    """The loop's stack state: {bank key: [D, S, Z, ...]} when banked."""
    if not self.enabled:
      return dict(stacks)
    columns = {key: [None] * n for key, n in self.sizes.items()}
    for name in self.names:
      for leaf, (key, slot) in zip(tf.nest.flatten(stacks[name]),
                                   self._slots[name]):
        columns[key][slot] = leaf
    return {key: tf.stack(c, axis=1) for key, c in columns.items()}

  def view(self, state, name):
    """Stack `name` as a nest of [D, Z, ...] (static slices of its banks)."""
    if not self.enabled:
      return state[name]
    leaves = [state[key][:, slot] for key, slot in self._slots[name]]
    return tf.nest.pack_sequence_as(self.structure[name], leaves)

  def written(self, names):
    """{bank key: leaves}: how many leaves of each bank a block writing the
    stacks `names` writes."""
    return collections.Counter(key for name in names
                               for key, _ in self._slots[name])

  def capacity(self, written_names):
    """{bank key: K}, each bank's write sized for the most leaves that one
    block writes there; `written_names` holds, per block, the stacks it
    writes."""
    capacity = {key: 0 for key in self.sizes}
    for names in written_names:
      for key, n in self.written(names).items():
        capacity[key] = max(capacity[key], n)
    return capacity

  def pack(self, writes, z, capacity):
    """A block's writes ({name: StackWrite}) in the form `apply` takes,
    each bank's sized by `capacity` (see `capacity`)."""
    if not self.enabled:
      zeros = {}
      return {name: writes.get(name) or no_write(self.structure[name], z,
                                                 zeros)
              for name in self.names}
    rows = {key: [] for key in self.sizes}
    values = {key: [] for key in self.sizes}
    members = batch_state.row_indices(z)
    for name, write in writes.items():
      row = _row_or_skip(write, self.depth)
      for value, (key, slot) in zip(tf.nest.flatten(write.value),
                                    self._slots[name]):
        rows[key].append(tf.stack([row, _filled(z, slot), members], axis=1))
        values[key].append(value)
    packed = {}
    for key, reserved in capacity.items():
      if not reserved:
        continue
      pad = reserved - len(rows[key])
      if pad < 0:
        raise errors.IRError(f"a block writes {len(rows[key])} stacks of "
                             f"bank {key}, more than the {reserved} reserved")
      if pad:   # out-of-range rows: skipped
        dtype, event_shape = key
        rows[key].append(_filled((pad * z, 3), self.depth))
        values[key].append(tf.zeros(
            [pad * z, *event_shape] if isinstance(z, int) else tf.concat(
                [[pad * z], tf.constant(event_shape, tf.int32)], 0), dtype))
      packed[key] = (tf.concat(rows[key], 0), tf.concat(values[key], 0))
    return packed

  def packed_spec(self, batch_size, capacity):
    """The `tf.TensorSpec`s of what `pack` returns for a batch of
    `batch_size` members (None: unknown), each bank's sized by
    `capacity`: a block's stack writes as a value, before any is traced."""
    z = batch_size
    if not self.enabled:
      def row_spec(s):
        return tf.TensorSpec([z] + s.shape[2:].as_list(), s.dtype)
      return {name: StackWrite(
          tf.TensorSpec([z], tf.int32),
          tf.nest.map_structure(row_spec, self.structure[name]),
          tf.TensorSpec([z], tf.bool)) for name in self.names}
    packed = {}
    for key, reserved in capacity.items():
      if reserved:
        dtype, event_shape = key
        rows = None if z is None else reserved * z
        packed[key] = (tf.TensorSpec([rows, 3], tf.int32),
                       tf.TensorSpec([rows] + list(event_shape), dtype))
    return packed

  def apply(self, state, packed, xla):
    """The stacks with a block's packed writes applied."""
    if not self.enabled:
      return {name: apply_stack_write(state[name], packed[name], xla=xla)
              for name in self.names}
    if not xla:
      raise ValueError("banked stacks are written with XLA's scatter, which "
                       "skips out-of-range rows: build StackBanks with "
                       "enabled=False outside XLA")
    out = dict(state)
    for key, (idx, values) in packed.items():
      out[key] = batch_state.tensor_scatter_nd_update(state[key], idx,
                                                      values)
    return out
