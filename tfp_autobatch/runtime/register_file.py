"""Register files: a nest of [Z, ...] tensors packed into one [width, Z]
tensor per dtype.

The program-counter VM's loop state and each block's results pass through
`tf.switch_case`. Under XLA every tensor a branch returns is a separate
buffer the branch must fill, so a branch that leaves a variable alone still
copies it: with a hundred small variables a VM step ran a hundred copy
kernels, which cost more than the block's own work at small batch sizes.
Packed, a step copies a few wide rows instead (one per dtype): the same
bytes, a few kernels. Reading a variable is a static row slice, which XLA
fuses into the reader. A file of more than `fusible.MAX_FUSED_OPERANDS`
leaves is laid out in chunks of at most that many registers' worth of
leaves, padded to one width, and packed as a `fusible.stack` of chunks, so
that writing a block's registers back is one kernel, not one per register
plus a copy (the padding registers are never read).

For a batch of at least `ROWS_FROM_BATCH` members a file is [width, Z],
each register a contiguous row of the batch (as in a bank), else [Z,
width]. XLA's CPU kernel that writes a file back evaluates its
concatenation element by element, which over a [Z, width] file picks the
source anew for every element, and over rows copies runs of Z; on few
members rows cost more than they save (transposes of the leaves with a
per-member shape, such as NUTS's seeds). `python -m benchmarks.programs`
(fib under `pc:xla` at 1,024 and 4,096 members) and `python -m
benchmarks.nuts_vm_steps` (4 and 64 chains) show both sides.

Only integer and boolean leaves are packed (the pc, stack pointers, loop
counters, flags: most of the leaves, and tiny); booleans go in the int32
file as 0 and 1, so a VM step writes one file, not two. Floating-point
registers stay loose: packed, their slices are fused into the model's
operands, and NUTS on a logistic regression took longer per step, where
packing ints and bools alone made VM steps cheaper (`python -m
benchmarks.nuts`).

Floating-point registers go to `RegisterBanks` instead: [R, Z, ...] per
dtype and shape, so a register is a contiguous row, and written by a
scatter after the block, so a branch returns only what it may change.
Integer and boolean registers go there too where the layout says so
(`vm_layout`: a program with many of them, on enough members): a file is
written back whole by every block, and NUTS's fifty integer and boolean
variables, of which a block changes a few, made that copy a large part of
a VM step from tens of chains on.
"""
import collections

import numpy as np
import tensorflow as tf

from tfp_autobatch import errors
from tfp_autobatch.runtime import _xla
from tfp_autobatch.runtime import batch_state
from tfp_autobatch.runtime import fusible

# A file holds registers as rows ([width, Z]) from this many members, as
# columns ([Z, width]) below (see the module docstring).
ROWS_FROM_BATCH = 128


def is_integer_or_bool(dtype):
  """Whether registers of `dtype` hold integers: integer dtypes, and
  booleans, held as int32 (`stored_dtype`)."""
  return dtype.is_integer or dtype == tf.bool


def stored_dtype(dtype):
  """The dtype a register of `dtype` is held as in a file or a bank:
  booleans as int32 (0 and 1), beside the int32 registers, so that a VM
  step writes one tensor for both; any other dtype as itself."""
  return tf.int32 if dtype == tf.bool else dtype


# A packed leaf: its dtype, the dtype of the file it is packed in, and its
# registers there.
_Slot = collections.namedtuple("_Slot",
                               ["dtype", "file", "width", "event_shape"])


class RegisterFile:
  """The packing of one nest structure; built from an example of it
  (tensors or `tf.TensorSpec`s: only the structure, dtypes and shapes are
  read).

  Floating-point leaves, leaves whose shape past the leading (batch)
  dimension is not fully known at trace time or has no elements, and
  scalars are not packed: they travel beside the files.
  """

  def __init__(self, example, enabled=True):
    """`enabled=False` packs nothing: every leaf travels loose."""
    self.structure = example
    sizes = {leaf.shape[0] for leaf in tf.nest.flatten(example)
             if leaf.shape.rank}
    # The axis of a file's registers: 0 (rows) for a large known batch.
    self.axis = 0 if (len(sizes) == 1 and None not in sizes
                      and sizes.pop() >= ROWS_FROM_BATCH) else 1
    self._slots = []
    self.widths = {}
    for leaf in tf.nest.flatten(example):
      shape = leaf.shape
      if (not enabled or leaf.dtype.is_floating
          or shape.rank is None or shape.rank == 0
          or not shape[1:].is_fully_defined()
          or shape[1:].num_elements() == 0):
        self._slots.append(None)
        continue
      # Booleans are packed with the int32s: a file fewer for every VM
      # step to write.
      file = stored_dtype(leaf.dtype)
      key = file.name
      event_shape = shape[1:].as_list()
      width = int(np.prod(event_shape, dtype=np.int64))
      self._slots.append(_Slot(leaf.dtype, file, width, event_shape))
      self.widths[key] = self.widths.get(key, 0) + width
    # Each file's leaves in the order they are laid out: by dtype, so that
    # `pack` casts a run of booleans into the int32 file as one stack (a
    # cast per leaf cost the trace about twenty ops a block for NUTS).
    self._order = {
        key: sorted((i for i, slot in enumerate(self._slots)
                     if slot is not None and slot.file.name == key),
                    key=lambda i: self._slots[i].dtype != self._slots[i].file)
        for key in self.widths}
    self._chunks = {key: self._chunk([self._slots[i].width for i in order])
                    for key, order in self._order.items()}
    # Each packed leaf's first register (row or column) in its file (for
    # `unpack` and `unpack_leaf`): chunks in turn, each followed by its
    # padding.
    self._first = {}
    for key, chunks in self._chunks.items():
      leaves = iter(self._order[key])
      start = 0
      for chunk, padding in chunks:
        for width in chunk:
          self._first[next(leaves)] = start
          start += width
        start += padding

  @staticmethod
  def _chunk(widths):
    """`[(chunk, padding)]`: the leaves (their widths, in order) in chunks
    of at most `fusible.MAX_FUSED_OPERANDS` - 1, each padded (`padding`
    registers) to the widest, so that a file is a `fusible.stack` of chunks,
    each one concatenation of at most `MAX_FUSED_OPERANDS` operands with
    its padding. A file of few leaves is one chunk with no padding."""
    if len(widths) <= fusible.MAX_FUSED_OPERANDS:
      return [(widths, 0)]
    size = fusible.MAX_FUSED_OPERANDS - 1
    chunks = [widths[i:i + size] for i in range(0, len(widths), size)]
    width = max(sum(c) for c in chunks)
    return [(c, width - sum(c)) for c in chunks]

  def pack(self, nest):
    """`(files, loose)`: {dtype name: [width, Z] or [Z, width] (`axis`)}
    and the unpacked leaves.

    A run of per-member scalars is one `tf.stack` of them as registers,
    not a reshape of each then a concatenation: the same XLA computation,
    built from two ops fewer per leaf (NUTS's file has about fifty scalar
    leaves, packed again by every block)."""
    leaves = tf.nest.flatten(nest)
    loose = [leaf for leaf, slot in zip(leaves, self._slots) if slot is None]
    registers = {key: [(leaves[i], self._slots[i]) for i in order]
                 for key, order in self._order.items()}
    files = {}
    for key, leaves_in_file in registers.items():
      first = leaves_in_file[0][0]
      leaves_in_file = iter(leaves_in_file)
      pieces = []
      for chunk, padding in self._chunks[key]:
        piece = _as_registers([next(leaves_in_file) for _ in chunk],
                              self.axis)
        if padding:
          piece.append(tf.zeros(
              self._file_shape(padding, batch_state.size(first)),
              piece[0].dtype))
        pieces.append(piece[0] if len(piece) == 1
                      else tf.concat(piece, axis=self.axis))
      width = sum(sum(c) + p for c, p in self._chunks[key])
      files[key] = (pieces[0] if len(pieces) == 1 else tf.reshape(
          fusible.stack(pieces, axis=self.axis),
          self._file_shape(width, -1)))
    return files, loose

  def _file_shape(self, width, z):
    """The shape of `width` registers of `z` members: [width, z] as rows,
    [z, width] as columns (`axis`)."""
    return [width, z] if self.axis == 0 else [z, width]

  def unpack(self, files, loose):
    """The nest packed by `pack`."""
    # One op takes every register of a file apart: per-member scalars
    # (most leaves) are its registers as they are; other leaves are read
    # alone (`unpack_leaf`). A slice per leaf cost the trace (and the first
    # call's compilation) a few ops each, hundreds of times.
    # Registers are unstacked once per dtype they are read as: the boolean
    # leaves of an int32 file from one cast of the whole file, not a cast
    # each (NUTS's blocks read about forty flags).
    registers = {}
    def register(slot, i):
      key = (slot.file.name, slot.dtype)
      if key not in registers:
        file = files[slot.file.name]
        registers[key] = tf.unstack(tf.cast(file, slot.dtype),
                                    num=file.shape[self.axis],
                                    axis=self.axis)
      return registers[key][self._first[i]]
    loose_leaves = iter(loose)
    leaves = []
    for i, slot in enumerate(self._slots):
      if slot is None:
        leaves.append(next(loose_leaves))
      elif slot.event_shape:
        leaves.append(self.unpack_leaf(files, loose, i))
      else:
        leaves.append(register(slot, i))
    return tf.nest.pack_sequence_as(self.structure, leaves)

  @property
  def num_leaves(self):
    """The leaves of the packed nest."""
    return len(self._slots)

  def unpack_leaf(self, files, loose, index):
    """Leaf `index` (its flat position) of the nest packed by `pack`,
    alone: one slice of its file, where `unpack` rebuilds every leaf (the
    VM reads the pc this way, which would otherwise cost the trace a few
    hundred ops each time)."""
    slot = self._slots[index]
    if slot is None:
      return loose[sum(s is None for s in self._slots[:index])]
    start = self._first[index]
    file = files[slot.file.name]
    if self.axis == 1:
      leaf = tf.reshape(file[:, start:start + slot.width],
                        [-1] + slot.event_shape)
    else:
      rows = file[start:start + slot.width]
      leaf = rows[0] if not slot.event_shape else tf.reshape(
          tf.transpose(rows), [-1] + slot.event_shape)
    return tf.cast(leaf, slot.dtype)


class RegisterBanks:
  """Registers kept in banks [R, Z, ...], one per dtype and per-example
  shape, written back outside the block dispatch: the floating-point
  ones, and the integer and boolean ones that `integer_leaves` names
  (booleans in the int32 bank of their shape, as 0 and 1: a scatter fewer
  a VM step).

  A `tf.switch_case` branch under XLA copies every tensor it returns, also
  the ones it leaves alone: with forty [Z, 100] float registers, NUTS's VM
  step on 64 chains copied 2 MB and spent most of its time doing so. In a
  bank a register is a static slice `bank[i]` (contiguous, so the readers
  fuse it), and a block returns only the registers it may change, as
  `(indices [K], values [K, Z, ...])` per bank (K the most any block of its
  dispatch changes, see `dispatch.Dispatch`; the padding writes go to row R,
  past the end, with zeros); the loop applies them in place with one XLA
  scatter per bank, which skips the padding. (XLA only: the other modes pass
  tensors through the dispatch without copies.) One scatter rather than a
  dynamic-update-slice per row, and banks rather than loose registers,
  because XLA then copies far fewer buffers in the compiled loop (count the
  copies in its optimised HLO; `python -m benchmarks.nuts_vm_steps` times a
  fixed NUTS transition).

  Leaves are picked from an example nest (tensors or `tf.TensorSpec`s):
  floating point (or integer or boolean where `integer_leaves`, one flag
  per flat leaf, says so), rank >= 1 (the batch), a known non-empty
  per-example shape. `enabled=False` banks nothing. `names`, one per flat
  leaf, name them in errors.
  """

  def __init__(self, example, enabled=True, names=None,
               integer_leaves=None):
    self.structure = example
    self.names = names or [f"leaf {i}" for i in
                           range(len(tf.nest.flatten(example)))]
    self._slots = []      # per leaf: (bank key, index in the bank) or None
    self.sizes = {}       # bank key -> registers R
    leaves = tf.nest.flatten(example)
    integer_leaves = integer_leaves or [False] * len(leaves)
    for leaf, integer_ok in zip(leaves, integer_leaves):
      shape = leaf.shape
      banked_dtype = leaf.dtype.is_floating or (
          integer_ok and is_integer_or_bool(leaf.dtype))
      if (not enabled or not banked_dtype or shape.rank is None
          or shape.rank == 0 or not shape[1:].is_fully_defined()
          or shape[1:].num_elements() == 0):
        self._slots.append(None)
        continue
      # Booleans share the int32 bank (`stored_dtype`): a scatter fewer
      # for every VM step to run.
      key = (stored_dtype(leaf.dtype).name, tuple(shape[1:].as_list()))
      self._slots.append((key, self.sizes.get(key, 0)))
      self.sizes[key] = self.sizes.get(key, 0) + 1

  @staticmethod
  def _in_bank(leaf):
    """A leaf as its bank holds it (`stored_dtype`)."""
    return tf.cast(leaf, stored_dtype(leaf.dtype))

  def split(self, nest):
    """`(banks, rest)`: {key: [R, Z, ...]} and the unbanked leaves."""
    columns = {key: [] for key in self.sizes}
    for leaf, slot in zip(tf.nest.flatten(nest), self._slots):
      if slot is not None:
        columns[slot[0]].append(self._in_bank(leaf))
    return ({key: tf.stack(c) for key, c in columns.items()},
            self.rest(nest))

  def rest(self, nest):
    """The unbanked leaves of `nest`."""
    return [leaf for leaf, slot in zip(tf.nest.flatten(nest), self._slots)
            if slot is None]

  def join(self, banks, rest):
    """The nest whose banked leaves are rows of `banks`."""
    rest = iter(rest)
    rows = {key: tf.unstack(bank, num=self.sizes[key])
            for key, bank in banks.items()}
    # A row is cast back to its leaf's dtype (`stored_dtype`; the same
    # tensor where that is the bank's).
    leaves = [next(rest) if slot is None
              else tf.cast(rows[slot[0]][slot[1]], spec.dtype)
              for slot, spec in zip(self._slots,
                                    tf.nest.flatten(self.structure))]
    return tf.nest.pack_sequence_as(self.structure, leaves)

  def written(self, positions):
    """{bank key: registers}: how many registers of each bank a block that
    may change the flat `positions` writes."""
    return collections.Counter(self._slots[i][0] for i in positions
                               if self._slots[i] is not None)

  def capacity(self, position_sets):
    """{bank key: K}, each bank's write sized for the largest of
    `position_sets` (the leaves, by flat position, that one block may
    change)."""
    capacity = {key: 0 for key in self.sizes}
    for positions in position_sets:
      for key, n in self.written(positions).items():
        capacity[key] = max(capacity[key], n)
    return capacity

  def changes(self, new, old, positions, capacity):
    """The bank writes taking `old` to `new`, which differ at most at the
    flat `positions` (checked: a change elsewhere would be lost), sized by
    `capacity` (from `capacity`: the same for every block of a dispatch)."""
    old_leaves = tf.nest.flatten(old)
    writes = {key: ([], []) for key, k in capacity.items() if k}
    for i, (a, b, slot) in enumerate(zip(tf.nest.flatten(new), old_leaves,
                                         self._slots)):
      if slot is None:
        continue
      if i not in positions:
        if a is not b:
          raise errors.IRError(
              f"register '{self.names[i]}' changed in a block that was not "
              "expected to write it")
        continue
      writes[slot[0]][0].append(slot[1])
      writes[slot[0]][1].append(self._in_bank(a))
    packed = {}
    for key, (index, values) in writes.items():
      # Padding writes go to row R, past the bank's end: XLA's scatter
      # skips them. Their values are zeros, which cost no reads.
      pad = capacity[key] - len(index)
      filler = tf.zeros_like(
          self._in_bank(old_leaves[self._slots.index((key, 0))]))
      packed[key] = (tf.constant(index + [self.sizes[key]] * pad, tf.int32),
                     fusible.stack(values + [filler] * pad))
    return packed

  def apply(self, banks, writes):
    """`banks` with `writes` written in: one scatter of K rows per bank, in
    place under XLA, which skips the padding rows (past the bank's end)."""
    out = dict(banks)
    for key, (index, values) in writes.items():
      out[key] = _xla.overwrite_rows(banks[key], index, values)
    return out


def _as_registers(leaves, axis):
  """`(leaf, slot)` pairs of one chunk as pieces of its file's dtype to
  concatenate along `axis` ([width, Z] for 0, [Z, width] for 1): each run
  of per-member scalars of one dtype stacked, then cast, in one op each,
  other leaves flattened per member (and transposed to rows) and cast."""
  pieces, run = [], []
  for leaf, slot in leaves + [(None, None)]:
    scalar = slot is not None and not slot.event_shape
    if run and not (scalar and run[0][1].dtype == slot.dtype):
      pieces.append(tf.cast(tf.stack([x for x, _ in run], axis=axis),
                            run[0][1].file))
      run = []
    if scalar:
      run.append((leaf, slot))
    elif slot is not None:
      flat = tf.cast(tf.reshape(leaf, [-1, slot.width]), slot.file)
      pieces.append(tf.transpose(flat) if axis == 0 else flat)
  return pieces
