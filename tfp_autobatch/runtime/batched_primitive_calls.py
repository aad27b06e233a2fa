"""Calls of a `@batched_primitive` (the user's model) on a block's members.

The program-counter VM runs a block's other ops on every row of the batch
and keeps the members' results; the model, the expensive part, it runs on
the members only, gathered. Under XLA, which needs static shapes, the
members go into the smallest of a few fixed sizes that holds them
(`member_bucket_sizes`, `on_members_in_buckets`); elsewhere into exactly as
many rows as there are members (`on_members_exactly`). Either way every
row gets outputs back: the members their own, the others a member's
(junk that the block discards, but values the model made, so nothing
raises on them).
"""
import functools
import logging
import weakref

import tensorflow as tf

from tfp_autobatch.runtime import _tf_private

# Under XLA a @batched_primitive (the user's model) runs on the block's
# members gathered into the smallest of Z, Z/2, Z/4, ... rows (each rounded
# up, down to one row) that holds them all, instead of on all Z rows: XLA
# needs static shapes, so a few sizes, each compiled, stand in for the
# member count (`member_bucket_sizes`). Halving down to one row lets the
# last chain or two of a NUTS step run on a row or two: with buckets down to
# Z/8 only, those calls ran on Z/8 rows, several times slower on the
# logistic regression, and the kernel's gradient utilisation was visibly
# lower (`python -m benchmarks.nuts` reports it).
# A batch size unknown at trace time gets Z/2, Z/4 and Z/8 (how many sizes
# must be fixed before Z is known).
UNKNOWN_BATCH_SIZE_BUCKETS = (2, 4, 8)

# Up to this many rows there are no buckets: a call with members runs on all
# Z rows. Each bucket size traces the model (and its gradient) once more and
# compiles it once more, which on Inference Gym models costs seconds of the
# first call, while on a few rows a model costs about the same whatever their
# number, so NUTS's draws take as long without them (docs/benchmarks.md, "No
# buckets up to 4 chains"). A call on every row cannot tell a primitive that
# does not map row by row (one with a parameter per batch row) by its number
# of rows, as a gathered call does (`vectorize._with_rows`): that error then
# shows from 5 rows on.
ALL_ROWS_UP_TO = 4
# For the same reason the buckets of a larger batch skip the sizes between
# one row and ALL_ROWS_UP_TO: two or three members run in the bucket of
# ALL_ROWS_UP_TO rows, which costs them about what two rows would, and one
# member alone still runs on one row (half of four rows' cost on the
# logistic regression: docs/benchmarks.md, "The model and a call alone").

# Nor are there buckets for a model that costs fewer floating-point
# operations a row than this (TensorFlow's estimate, `_tf_private.float_ops`,
# of its kernel on all Z rows): there the rows a bucket leaves out save less
# than gathering the members and scattering their results back costs, and
# each size is a trace and a compilation more. NUTS on Inference Gym models
# at 64 chains: eight_schools (about 600 a row) and brownian_motion (2,200)
# sampled as fast on all rows, with first calls 5 s and 37 s shorter; the
# correlated Gaussian (60,000) sampled 25% slower on all rows
# (docs/benchmarks.md, "Buckets for costly models only"). A model whose
# cost cannot be told keeps its buckets (stochastic_volatility's density
# runs a loop: TFP's `batched_las_vegas_algorithm`).
BUCKETS_FROM_FLOAT_OPS_PER_ROW = 25_000

# Each kernel's estimate (`buckets_pay`), read once: a block that calls the
# model twice (NUTS's two leaves) would otherwise walk its graph twice.
_FLOAT_OPS = weakref.WeakKeyDictionary()


def member_bucket_sizes(z, static_z):
  """The bucket sizes below the batch size, largest first: the halvings of
  `static_z` (rounded up) down to 1, less those between 1 and
  `ALL_ROWS_UP_TO`, and none up to `ALL_ROWS_UP_TO` rows; with `static_z`
  None, `z` (a tensor) divided by `UNKNOWN_BATCH_SIZE_BUCKETS`, rounded
  up."""
  if static_z is None:
    return [(z + d - 1) // d for d in UNKNOWN_BATCH_SIZE_BUCKETS]
  if static_z <= ALL_ROWS_UP_TO:
    return []
  sizes, size = [], static_z
  while size > 1:
    size = (size + 1) // 2
    if size >= ALL_ROWS_UP_TO or size == 1:
      sizes.append(size)
  return sizes


def fine_bucket_sizes(sizes, static_z):
  """`sizes` (`member_bucket_sizes` of a batch of `static_z`) with three
  quarters of each size and of the batch between them (rounded up, from
  `ALL_ROWS_UP_TO` rows), largest first: a call then pads its members by a
  third at most, where halvings pad them by up to twice
  (`tab.batched_primitive`'s `fine_buckets`)."""
  fine = set(sizes)
  for size in [static_z] + list(sizes):
    three_quarters = (3 * size + 3) // 4
    if ALL_ROWS_UP_TO <= three_quarters < static_z:
      fine.add(three_quarters)
  return sorted(fine, reverse=True)


def on_members_in_buckets(kernel_for, z, members, ins, skip, fine=False):
  """`(the kernel's outputs on all Z rows, rows computed, members)`,
  computing only on the members' rows gathered into the smallest bucket
  (see `member_bucket_sizes`; with `fine`, `fine_bucket_sizes`) that holds
  them, with `kernel_for(rows)`,
  the kernel for that many rows; the outputs of the other rows
  are junk, which the block discards. With no members (a guarded call
  whose guard holds for none) it computes nothing and returns `skip()`.
  Only under XLA, where the bucket sizes are compile-time constants (Z is
  static once compiled). Up to `ALL_ROWS_UP_TO` rows, and for a kernel
  that costs little per row (`buckets_pay`), there are no buckets: the
  call runs on every row, or not at all."""
  count, sizes, index = _bucket_choice(kernel_for, z, members, ins, fine)

  def everyone():
    return list(kernel_for(z)(z, *ins)), z

  def bucket(size):
    def run():
      before = _members_before(members)
      order = _members_first(members, before, count)[:size]
      taken = tf.nest.map_structure(lambda x: tf.gather(x, order), ins)
      return _to_all_rows(kernel_for(size)(size, *taken), before,
                          size), size
    return run

  outs, rows = tf.switch_case(index, [everyone] + [bucket(n) for n in sizes]
                              + [skip])
  return opaque_to_constant_inference(outs), rows, count


def _bucket_choice(kernel_for, z, members, ins, fine):
  """`(count, sizes, index)`: the members' count, the bucket sizes
  (`member_bucket_sizes`, with `fine` `fine_bucket_sizes`, none where they
  do not pay: `buckets_pay`) and
  the branch to run: 0 for every row, i for `sizes[i - 1]`, and
  `len(sizes) + 1` for no members. `on_members_in_buckets` and its
  gradient (`on_members_in_buckets_with_vjp`) branch on the same."""
  count = tf.reduce_sum(tf.cast(members, tf.int32))
  sizes = member_bucket_sizes(z, members.shape[0])
  if sizes and not buckets_pay(kernel_for(z), z, ins):
    sizes = []
  elif fine and members.shape[0] is not None:
    sizes = fine_bucket_sizes(sizes, members.shape[0])
  # Sizes fall, largest first: the last one holding `count` wins;
  # past them (the 0), the branch for no members.
  index = tf.reduce_sum(tf.cast(tf.stack(sizes + [0]) >= count, tf.int32))
  return count, sizes, index


def buckets_pay(kernel, z, ins=()):
  """Whether `kernel` (a function of the rows and the inputs `ins`: a
  `tf.function` traced for `z` rows, or one traced in place, as for the
  reverse VM) costs enough per row for buckets to pay: at least
  `BUCKETS_FROM_FLOAT_OPS_PER_ROW` floating-point operations a row, or a
  cost that cannot be told (a loop inside, a batch size unknown when
  traced)."""
  if not isinstance(z, int):
    return True
  if kernel not in _FLOAT_OPS:
    if not hasattr(kernel, "get_concrete_function"):
      kernel = tf.function(functools.partial(kernel, z), autograph=False)
      specs = tf.nest.map_structure(tf.TensorSpec.from_tensor, ins)
      graph = kernel.get_concrete_function(*specs).graph
    else:
      graph = kernel.get_concrete_function().graph
    _FLOAT_OPS[kernel] = _tf_private.float_ops(graph)
  total = _FLOAT_OPS[kernel]
  return total is None or total >= BUCKETS_FROM_FLOAT_OPS_PER_ROW * z


# The batched primitives already checked (`warn_of_matrix_work_on_constants`).
_CHECKED_FOR_CONSTANT_WORK = weakref.WeakSet()


def warn_of_matrix_work_on_constants(kernel, code):
  """Warns, once per `code` (a `@batched_primitive`'s call), where its
  `kernel` (a traced `tf.function`) factorises or solves a matrix that does
  not depend on its inputs (`_tf_private.matrix_work_on_constants`): a
  model's fixed Cholesky factor, say, that a Gaussian's density solves
  against. Under XLA the call runs in a conditional (one block of the VM,
  one bucket), out of which XLA does not move work that depends on
  constants alone, as it does out of a plain loop (TFP's kernels), so that
  work, often a loop of its own, is redone at every call. Computed once
  outside the primitive (the factor's inverse), it costs nothing per call
  (docs/backends.md, "Work on constants in a batched primitive")."""
  if code in _CHECKED_FOR_CONSTANT_WORK:
    return
  _CHECKED_FOR_CONSTANT_WORK.add(code)
  found = _tf_private.matrix_work_on_constants(
      kernel.get_concrete_function().graph)
  if not found:
    return
  first_at = {}   # each op type where it is first made: the value's own
  for op_type, at in found:   # op comes before its gradient's
    first_at.setdefault(op_type, at)
  where = [f"{op_type} (made at {at})" if at else op_type
           for op_type, at in sorted(first_at.items())]
  logging.warning(
      "tfp_autobatch: the batched primitive called at %s:%d (with NUTS, "
      "the target log density) computes %s on a matrix that does not "
      "depend on its inputs. Under XLA it runs "
      "inside the batched program's conditionals, out of which XLA does not "
      "move such work, so it is redone at every call. Compute it once "
      "outside the function (for a fixed Cholesky factor L that a Gaussian "
      "solves against, its inverse, and multiply by that): see "
      "docs/backends.md, \"Work on constants in a batched primitive\".",
      code.filename, code.lineno, ", ".join(where))


# The name scope of the ops that gather a bucket's members (`_members_first`).
MEMBERS_FIRST = "members_first"


def _members_before(members):
  """Each row's count of the members before it: a member's slot among
  the gathered rows (`_members_first` and `_to_all_rows` share it)."""
  return tf.cumsum(tf.cast(members, tf.int32), exclusive=True)


def _members_first(members, before, count):
  """The rows of the members in row order, then the other rows in row
  order (`before`: `_members_before(members)`; `count`: the members').
  Each row's place follows from the running count, and one scatter puts
  the rows there: XLA's CPU sort, which a stable `tf.argsort` of the rows
  by membership would be, calls a comparator per comparison and cost
  several times the scatter on every bucketed call."""
  with tf.name_scope(MEMBERS_FIRST):
    rows = tf.range(tf.size(before))
    place = tf.where(members, before, count + rows - before)
    return tf.scatter_nd(place[:, tf.newaxis], rows, tf.shape(before))


def _to_all_rows(outs, before, size):
  """Outputs computed on the members gathered into `size` rows (members
  first, in row order), on all Z rows: member i's are in its slot,
  `before[i]` (`_members_before`), the count of members before it; the
  other rows get the next member's (or the last row's)."""
  slot = tf.minimum(before, size - 1)
  return tf.nest.map_structure(lambda y: tf.gather(y, slot), list(outs))


def on_members_exactly(kernel, members, ins, skip, eager):
  """`(kernel's outputs on all Z rows, rows computed, members)`, computing
  on the members' rows only, gathered (eager and graph modes, where shapes may
  vary from call to call). The other rows get a member's outputs: junk,
  which the block discards, but values the model made, so nothing raises
  on them. With no members it computes nothing and returns `skip()`."""
  rows = tf.cast(tf.reshape(tf.where(members), [-1]), tf.int32)
  count = tf.size(rows)

  def compute():
    taken = tf.nest.map_structure(lambda x: tf.gather(x, rows), ins)
    return _to_all_rows(kernel(count, *taken), _members_before(members),
                        count), count

  if eager:
    outs, computed = compute() if int(count) else skip()
  else:
    outs, computed = tf.cond(count > 0, compute, skip)
  return outs, computed, count


def opaque_to_constant_inference(values):
  """`values`, passed through a loop that never runs.

  When TF lowers a `tf.switch_case` to XLA, it first tries to prove
  compile-time constant its branch index and the inputs its branches need
  constant, and that proof follows them back through earlier conditionals
  into their branches, evaluating those on the host (up to a million
  elements a value). A model call's outputs feed the block's next guards
  and model calls, so every later call re-evaluated the model: a 64-row
  logistic-regression gradient (two dots with a 10,000 x 100 matrix) in
  XLA's slow constant evaluator, seconds a call site. The inference takes a
  while loop's results as unknowable and stops there; XLA deletes the
  loop, which runs zero times, when it optimises, so it costs nothing when
  the program runs.
  """
  if not values:
    return values
  return list(tf.while_loop(lambda *_: False, lambda *v: v, values))


def on_members_in_buckets_with_vjp(kernel_for, z, members, ins, skip):
  """`on_members_in_buckets`, for the reverse VM (`reverse_vm`): with a
  gradient taken bucket by bucket. The vector-Jacobian product runs in a
  conditional of its own on the same bucket: the members' rows and their
  upstream gradients gathered, the kernel run again under a tape inside
  the branch, the inputs' gradients scattered back to the members' rows.
  TensorFlow's gradient of the forward conditional would instead make its
  branches return every intermediate the gradient reads, and XLA copies
  each intermediate that is a branch's input (the model's weights, at
  every call).

  Its buckets are the halvings, whatever the primitive's `fine_buckets`:
  here each size traces and compiles the kernel's gradient as well, so
  more sizes lengthen the first call by more than the padded rows save."""
  count, sizes, index = _bucket_choice(kernel_for, z, members, ins,
                                       fine=False)
  flat_ins = tf.nest.flatten(ins)
  float_positions = [i for i, x in enumerate(flat_ins) if x.dtype.is_floating]

  def with_floats(floats):
    flat = list(flat_ins)
    for i, x in zip(float_positions, floats):
      flat[i] = x
    return tf.nest.pack_sequence_as(ins, flat)

  structure = []   # the outputs' nest, which custom_gradient flattens

  @tf.custom_gradient
  def call(*floats):
    outs, rows, _ = on_members_in_buckets(kernel_for, z, members,
                                          with_floats(floats), skip)
    structure.append(outs)
    outs = tf.nest.flatten(outs)

    def gradient(*upstream, variables=None):
      variables = list(variables or [])
      upstream = [tf.zeros_like(o) if u is None else tf.convert_to_tensor(u)
                  for o, u in zip(outs, upstream)]

      def vjp(size, order):
        def run():
          taken = [x if order is None else tf.gather(x, order)
                   for x in floats]
          taken_upstream = [u if order is None else tf.gather(u, order)
                            for u in upstream]
          with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(taken)
            tape.watch(variables)
            result = tf.nest.flatten(list(kernel_for(size)(
                size, *with_floats(taken))))
          grads = tape.gradient(
              [r for r in result if r.dtype.is_floating], taken + variables,
              output_gradients=[u for r, u in zip(result, taken_upstream)
                                if r.dtype.is_floating],
              unconnected_gradients=tf.UnconnectedGradients.ZERO)
          grads = [tf.convert_to_tensor(g) for g in grads]
          input_grads = grads[:len(taken)]
          if order is not None:
            input_grads = [tf.scatter_nd(order[:, None], g, tf.shape(x))
                           for g, x in zip(input_grads, floats)]
          return input_grads, grads[len(taken):]
        return run

      def bucket(size):
        def run():
          before = _members_before(members)
          order = _members_first(members, before, count)[:size]
          return vjp(size, order)()
        return run

      def nothing():
        return ([tf.zeros_like(x) for x in floats],
                [tf.zeros_like(v) for v in variables])

      input_grads, variable_grads = tf.switch_case(
          index, [vjp(z, None)] + [bucket(n) for n in sizes] + [nothing])
      return input_grads, variable_grads
    return outs + [rows], gradient

  results = call(*[flat_ins[i] for i in float_positions])
  return (tf.nest.pack_sequence_as(structure[0], list(results[:-1])),
          results[-1], count)
