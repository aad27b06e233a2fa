"""Stacking and concatenation that XLA on CPU fuses into one kernel.

XLA's CPU compiler fuses a concatenation with the ops that compute its
operands only if it has at most `MAX_FUSED_OPERANDS` operands; a longer one
runs as a kernel per operand, then a copy kernel. The program-counter VM
builds long ones every step: a block's register writes, stacked per bank,
and its integer and boolean registers, packed into a file per dtype. With
tiny tensors (one chain) each kernel costs more than its work, so a block of
NUTS ran dozens of one-row kernels to assemble what it returns.

`stack` builds a long stack as a tree of stacks of at most
`MAX_FUSED_OPERANDS`, each level along its own axis (so XLA's simplifier,
which merges a concatenation of concatenations along one axis, keeps the
tree), and the whole tree fuses into one kernel with the operands'
producers. That roughly halves the kernels of NUTS's larger blocks and
makes a transition faster at every chain count
(`python -m benchmarks.nuts_vm_steps`).
"""
import tensorflow as tf

MAX_FUSED_OPERANDS = 8


def stack(values, axis=0):
  """`tf.stack(values, axis)` of equally shaped tensors, as a tree of stacks
  of at most `MAX_FUSED_OPERANDS` (zero-padded: the padding is sliced off)."""
  n = len(values)
  if n <= MAX_FUSED_OPERANDS:
    return tf.stack(values, axis)
  width = MAX_FUSED_OPERANDS
  groups = [list(values[i:i + width]) for i in range(0, n, width)]
  groups[-1] += [tf.zeros_like(values[0])] * (width - len(groups[-1]))
  # [..., G, width, ...]: `width` at `axis` + 1, the groups at `axis`.
  tree = stack([tf.stack(g, axis) for g in groups], axis)
  static = values[0].shape
  merged = (None if static.rank is None else static[:axis].concatenate(
      [len(groups) * width]).concatenate(static[axis:]))
  if static.is_fully_defined():
    # One constant for the shape: computing it in the graph costs the
    # trace about ten ops.
    flat = tf.reshape(tree, merged)
  else:
    shape = tf.shape(tree)
    flat = tf.reshape(tree, tf.concat(
        [shape[:axis], [shape[axis] * width], shape[axis + 2:]], 0))
    # Static shapes survive the reshape where they are known.
    if merged is not None:
      flat = tf.ensure_shape(flat, merged)
  return flat[(slice(None),) * axis + (slice(0, n),)]
