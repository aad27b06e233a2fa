"""Runs single-example primitives on a batch.

Each `Primitive` is vectorised once per input signature: its code, written for
one example, is traced through pfor (`tf.vectorized_map`'s machinery) inside a
cached `tf.function` whose batch dimension is unknown (static under
`pc:xla`, which then reads each row without a gather), optionally compiled
with XLA. A primitive that several blocks run (inlined or tail-duplicated
code) is traced once and called from each. A `batched=True` primitive already
maps over the batch and is called as is. A primitive whose code has
rewritten subscripts returns one more output: each row's fault record
(`subscripts`), the runtime's to act on. Under XLA a batched primitive
reads the small eager tensors it captures (a model's parameters) as
constants (`KernelCache.get`).

In a graph, pfor is called directly (`_pfor_in_graph`) rather than through
`tf.vectorized_map`, which inside an XLA computation wraps every call in one
more `tf.function` (with AutoGraph) of its own. Together with the tracing
once per primitive this cut the first call of one NUTS step (trace and XLA
compilation) by a quarter to a third, with the same step times (the first
call's time, `first_call_sec`, in `python -m benchmarks.nuts_vm_steps`).

Within `for_reverse_vm()`, where `pc:xla`'s gradient (`reverse_vm`)
traces the VM, a kernel is traced into the graph of each block that calls
it instead: the gradient of a function call passes the constants its
backward reads (split axes, shapes) out of the forward function as
outputs, which XLA then cannot read as constants ("must be a compile-time
constant"). (The block runner there runs `@batched_primitive`s in
buckets with a gradient of their own:
`batched_primitive_calls.on_members_in_buckets_with_vjp`.)
"""
import collections
import contextlib
import contextvars
import functools
import logging
import os
import weakref

import tensorflow as tf

from tfp_autobatch import errors
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.operators import single_example
from tfp_autobatch.operators.single_example import conform
from tfp_autobatch.passes import infer_types
from tfp_autobatch.runtime import _tf_private
from tfp_autobatch.runtime import _xla
from tfp_autobatch.runtime import batch_state
from tfp_autobatch.runtime import constant_work
from tfp_autobatch.runtime import pfor_conditions
from tfp_autobatch.runtime._tf_private import pfor_impl as _pfor_impl


def strict_vectorization():
  """Whether a primitive pfor cannot vectorise is an error (else a warning).

  Without vectorisation pfor falls back to a sequential loop over the batch:
  correct, but slow. The test suite sets TFP_AUTOBATCH_STRICT_PFOR=1.
  """
  return os.environ.get("TFP_AUTOBATCH_STRICT_PFOR", "0") == "1"


# The code already warned of (once each, not at every trace).
_WARNED_OF_CUSTOM_GRADIENTS = weakref.WeakSet()


def _warn_of_custom_gradients(ops, code):
  """pfor vectorises an op by its own gradient, so a `@tf.custom_gradient`
  (an op carrying a gradient override) in single-example code is lost from
  the batched program's gradient: say so once, naming the code."""
  if code in _WARNED_OF_CUSTOM_GRADIENTS:
    return
  for op in ops:
    try:
      op.get_attr("_gradient_op_type")
    except ValueError:
      continue
    logging.warning(
        "tfp_autobatch: the code at %s:%d (`%s`) uses a custom gradient "
        "(@tf.custom_gradient), which the batched program does not keep: "
        "a gradient through it is the ordinary one of the ops it wraps. "
        "To keep it, call it, written for the batch, from a "
        "@tab.batched_primitive.",
        code.filename, code.lineno, code.source)
    _WARNED_OF_CUSTOM_GRADIENTS.add(code)
    return


def _pfor_in_graph(per_example, batched_args, code):
  """`per_example` on every row, vectorised by pfor into the current graph
  (no loop fallback: raises ValueError on an op pfor cannot vectorise)."""
  graph = tf.compat.v1.get_default_graph()
  def loop_fn(i):
    # One axis for every gather: a constant each cost the trace an op per
    # input of every primitive.
    axis = tf.constant(0)
    first_op = len(graph.get_operations())
    outs = per_example(*tf.nest.map_structure(
        lambda x: tf.gather(x, i, axis=axis), tuple(batched_args)))
    _warn_of_custom_gradients(graph.get_operations()[first_op:], code)
    return outs
  first = tf.nest.flatten(batched_args)[0]
  # A static size lets pfor take `tf.gather(x, i)` to be x itself.
  n = first.shape[0] if first.shape[0] is not None else tf.shape(first)[0]
  return _pfor_impl(loop_fn, n, fallback_to_while_loop=False)


class _OnceOnly(logging.Filter):
  """Lets a log message that starts with `prefix` through once."""

  def __init__(self, prefix):
    super().__init__()
    self.prefix = prefix
    self.seen = False

  def filter(self, record):
    if not str(record.msg).startswith(self.prefix):
      return True
    seen, self.seen = self.seen, True
    return not seen


# `tf.vectorized_map` run eagerly (under `tf.config.run_functions_eagerly`)
# warns on every call that it overrides that setting: once per block run,
# 240 lines for three small calls. Said once while ours run.
_EAGER_FUNCTIONS_WARNING = _OnceOnly("It looks like tf.function behavior was "
                                     "disabled")


def _eager_vectorized_map(body, batched_args, fallback_to_while_loop):
  tf_logger = tf.get_logger()
  tf_logger.addFilter(_EAGER_FUNCTIONS_WARNING)
  try:
    return tf.vectorized_map(body, tuple(batched_args),
                             fallback_to_while_loop=fallback_to_while_loop)
  finally:
    tf_logger.removeFilter(_EAGER_FUNCTIONS_WARNING)


def _check_shapes_do_not_vary(per_example, batched_args, code):
  """Raises if the code, traced for one example, computes a value whose
  shape it does not know (`tf.boolean_mask(v, v > 0)`, `tf.range(n)`):
  one that may differ by example, which no batch can hold. pfor cannot
  vectorise such an op, and its loop over the batch fails with an obscure
  TensorListStack error or, compiled by XLA, returns wrong values. (Only
  called where pfor has failed: code it vectorises is left alone.)"""
  specs = tf.nest.map_structure(lambda x: tf.TensorSpec(x.shape[1:], x.dtype),
                                tuple(batched_args))
  if not all(s.shape.is_fully_defined() for s in tf.nest.flatten(specs)):
    return
  try:
    graph = single_example.trace_in_scratch_graph(per_example, specs)
  except Exception:  # pylint: disable=broad-except
    return   # the fallback reports it as before
  for op in graph.get_operations():
    for out in op.outputs:
      if (out.dtype not in (tf.resource, tf.variant)
          and out.shape.rank is not None
          and not out.shape.is_fully_defined()):
        raise errors.AutobatchError(
            f"the code at {code.filename}, line {code.lineno} "
            f"(`{code.source}`) computes a value whose shape depends on "
            f"the example (op {op.name!r} of type {op.type}, shape "
            f"{out.shape}), which a batch cannot hold: every example's "
            "values must have the same shape. Keep the shape fixed and "
            "mask instead: tf.where(v > 0, v, 0) rather than "
            "tf.boolean_mask, a fixed-length tf.range with a mask rather "
            "than tf.range(n) for a per-example n")


# What to do about ops pfor has no rule for, by op type, where the user's
# code can avoid them.
_UNVECTORISED_OP_ADVICE = {
    "ResourceGather": (
        "it gathers straight from a tf.Variable (ResourceGather), which "
        "pfor cannot vectorise: read the variable first, e.g. "
        "tf.gather(table.read_value(), i) or tf.convert_to_tensor(table)[i]"),
}


def _advice(error):
  """Advice on the ops that `error` (pfor's) names and the user's code can
  avoid, as sentences to append to a message ("" if none)."""
  found = [advice for op, advice in _UNVECTORISED_OP_ADVICE.items()
           if op in str(error)]
  return "".join(f" Advice: {advice}." for advice in found)


def vectorized_map(per_example, batched_args, code):
  """`per_example(*args)` on every row of `batched_args`, with pfor.

  If pfor cannot vectorise some op, that is an error in strict mode and
  otherwise a warning naming the user's code, and pfor loops over the rows.
  """
  body = lambda args: per_example(*args)  # pylint: disable=unnecessary-lambda-assignment
  try:
    if _pfor_impl is not None and not tf.executing_eagerly():
      return _pfor_in_graph(per_example, batched_args, code)
    return _eager_vectorized_map(body, batched_args,
                                 fallback_to_while_loop=False)
  except (ValueError, NotImplementedError, TypeError) as e:
    _check_shapes_do_not_vary(per_example, batched_args, code)
    if strict_vectorization():
      raise errors.AutobatchError(
          f"cannot vectorise the code at {code.filename}, line {code.lineno} "
          f"(`{code.source}`) over the batch: {e}{_advice(e)}") from e
    logging.warning("tfp_autobatch: the code at %s:%d (`%s`) falls back to a "
                    "sequential loop over the batch: %s%s", code.filename,
                    code.lineno, code.source, e, _advice(e))
    return _eager_vectorized_map(body, batched_args,
                                 fallback_to_while_loop=True)


def _computed_once(outs, ins):
  """`outs`, with each floating-point value that is several of them, and
  not one of the inputs `ins`, computed once by XLA (`_xla.computed_once`).

  One primitive often returns a value under several names (NUTS starts a
  trajectory with `p_left = p_right = p_s = rho = p`, the momentum it
  draws), and the VM writes each to a register of its own. Those writes
  are one concatenation (`register_file`), and XLA's loop fusion
  evaluates a concatenation's operands row by row: a value fused into it
  is computed again for every register it goes to. NUTS's draw (a hash,
  then Box-Muller's logarithm and cosine per element) made the block that
  starts a trajectory about three times as slow as computing it once
  (`python -m benchmarks.nuts_profile` times each block).
  """
  count = collections.Counter(id(v) for v in outs)
  inputs = {id(x) for x in tf.nest.flatten(ins)}
  once = {}
  for v in outs:
    if (count[id(v)] > 1 and id(v) not in inputs and id(v) not in once
        and v.dtype.is_floating):
      once[id(v)] = _xla.computed_once(v)
  return tuple(once.get(id(v), v) for v in outs)


def _with_rows(outs, n, code):
  """A batched primitive's outputs, each checked to have the `n` rows it
  was called on. One that does not (a model with a parameter per batch
  row, which does not know which rows it was given) would have its rows
  handed to the wrong members: an error instead, when traced if the
  shapes say so, else when the graph runs (`batch_state.with_rows`)."""
  message = (
      f"the @tab.batched_primitive `{code.source}` ({code.filename}, line "
      f"{code.lineno}) returned a different number of rows than it was "
      "given: it must map over its leading dimension row by row, for any "
      "number of rows (it is called on the members that reach it, such as "
      "the NUTS chains still running), so nothing in it may have a size "
      "per batch row (per-chain parameters)")
  static_n = n if isinstance(n, int) else tf.get_static_value(n)
  leaves = tf.nest.flatten(outs)
  for y in leaves:
    if (static_n is not None and y.shape.rank and y.shape[0] is not None
        and y.shape[0] != static_n):
      raise errors.AutobatchError(
          f"{message}: {y.shape[0]} rows for {static_n}")
  if tf.executing_eagerly() or all(
      static_n is not None and y.shape[0] is not None for y in leaves):
    return outs
  return batch_state.with_rows(outs, n, message)


def _as_declared(op, ins, out_types):
  """The outputs of a `@tab.batched_primitive` whose `output_signature`
  gave its types, which type inference took without tracing it: its first
  trace is this one. So it fails as type inference reports a failure
  (`tab.TypeInferenceError`, the cause chained), and what it returns must
  be what the signature said, which would otherwise be cast to it."""
  try:
    outs = op.code.fn(*ins)
  except errors.AutobatchError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    infer_types.raise_fails_on(
        op, [types_lib.type_of_value(x, batched=True) for x in ins], e)
  def check(t, v):
    v = tf.convert_to_tensor(v)
    if v.dtype != t.dtype or not v.shape[1:].is_compatible_with(t.shape):
      raise errors.TypeInferenceError(
          f"the batched primitive `{op.code.source}` ({op.code.filename}, "
          f"line {op.code.lineno}) returned "
          f"{types_lib.TensorType(v.dtype, tuple(v.shape[1:].as_list()))} "
          f"per example where its output_signature gives "
          f"{types_lib.format_type(t)}: correct the signature")
  try:
    for t, v in zip(out_types, outs):
      tf.nest.map_structure(check, t, v, check_types=False)
  except (TypeError, ValueError) as e:
    raise errors.TypeInferenceError(
        f"the batched primitive `{op.code.source}` ({op.code.filename}, "
        f"line {op.code.lineno}) returned a structure other than its "
        f"output_signature's: {e}") from e
  return outs


def batched_fn(op, out_types, inside_xla=False, compiled_by_xla=False,
               model_constants=False, move_into=None):
  """`f(batch_size, *batched_ins) -> tuple of batched outs` for one Primitive.

  `inside_xla`: the kernel runs inside the VM's XLA computation, which
  then computes a value the primitive returns under several names once
  (see `_computed_once`). `compiled_by_xla`: XLA compiles it (so also
  `pc:graph` inside a user's `jit_compile`), and the VM's loop cannot
  hold pfor's partitioned conditionals (`pfor_conditions`).
  `model_constants`: a batched primitive reads its small eager tensors
  as constants (`KernelCache.get`). `move_into`: the graph a batched
  primitive's work on fixed matrices moves into (`constant_work`)."""
  if op.batched:
    def run_batched(n, *ins):
      with (_tf_private.eager_captures_as_constants() if model_constants
            else contextlib.nullcontext()):
        if op.code.declared_outputs is None:
          outs = op.code.fn(*ins)
        else:
          outs = _as_declared(op, ins, out_types)
      outs = constant_work.move(outs, move_into)
      return _with_rows(tuple(conform(v, t) for v, t in zip(outs, out_types)),
                        n, op.code)
    return run_batched
  per_example_fn = single_example.single_example_fn(op, out_types)
  if not op.ins:
    def run_constant(n, *ins):
      del ins
      outs = per_example_fn()
      return tf.nest.map_structure(
          lambda x: tf.broadcast_to(x, tf.concat([[n], tf.shape(x)], 0)), outs)
    return run_constant

  def run_vectorized(n, *ins):
    del n
    if not compiled_by_xla:
      return vectorized_map(per_example_fn, ins, op.code)
    with pfor_conditions.as_selects():
      outs = vectorized_map(per_example_fn, ins, op.code)
    return _computed_once(outs, ins) if inside_xla else outs
  return run_vectorized


_FOR_REVERSE_VM = contextvars.ContextVar(
    "tfp_autobatch_for_reverse_vm", default=False)


@contextlib.contextmanager
def for_reverse_vm():
  """Within it, the reverse VM (`reverse_vm`, `pc:xla`'s gradient) traces
  the VM's blocks: `KernelCache.get` returns kernels traced in place (see
  the module docstring)."""
  token = _FOR_REVERSE_VM.set(True)
  try:
    yield
  finally:
    _FOR_REVERSE_VM.reset(token)


def tracing_for_reverse_vm():
  """Whether the reverse VM is tracing the VM's blocks (`for_reverse_vm`)."""
  return _FOR_REVERSE_VM.get()


class KernelCache:
  """Batched primitives, one `tf.function` per (primitive, input types,
  batch size: static under `pc:xla`, see `PcVmRuntime.compiled_for`),
  traced once and called from every block that runs the primitive (inside
  a compiled VM, XLA inlines the calls)."""

  def __init__(self, jit_compile, inside_xla=False):
    """`inside_xla`: the kernels are called from an XLA computation (see
    `batched_fn`)."""
    self.jit_compile = jit_compile
    self.inside_xla = inside_xla
    self._kernels = {}

  def get(self, op, in_types, out_types, batch_size=None, move_into=None):
    """The kernel of `op` for inputs of `in_types`, on batches of
    `batch_size` rows (None: any number, known only when it runs).
    `move_into`: for a batched primitive, the graph its work on fixed
    matrices moves into (`constant_work.target()`), or None."""
    # (A kernel traced for XLA, also the user's `jit_compile` around
    # pc:graph, vectorises conditionals differently: `pfor_conditions`.)
    compiled_by_xla = self.inside_xla or _tf_private.in_xla_context()
    if _FOR_REVERSE_VM.get():
      return batched_fn(op, out_types, self.inside_xla, compiled_by_xla)
    # Under XLA a batched primitive (the user's model) reads its small
    # eager tensors as constants (`_tf_private.eager_captures_as_constants`),
    # so that XLA computes what depends on them alone once, when it
    # compiles, instead of at every VM step that calls the model. Not
    # where a gradient may reach them: a tape that watches an eager tensor
    # follows it into a function only through its capture (so not for
    # `pc:xla`'s gradient, above, nor under a tape recording the trace).
    # The choice is part of the key: a kernel traced with constants must
    # not serve a caller whose tape watches them.
    model_constants = (op.batched and compiled_by_xla
                       and not _tf_private.record.could_possibly_record())
    if not op.batched:
      move_into = None
    key = (op.code, op.batched, types_lib.hashable(tuple(in_types)),
           batch_size, compiled_by_xla, model_constants, move_into)
    kernel = self._kernels.get(key)
    if kernel is None:
      signature = [tf.TensorSpec([], tf.int32)] + [
          tf.nest.map_structure(lambda t: t.spec((batch_size,)), t)
          for t in in_types]
      # A partial has no __code__, so TF's retracing detector counts each
      # kernel on its own instead of all kernels as one function.
      kernel = self._kernels[key] = tf.function(
          functools.partial(batched_fn(op, out_types, self.inside_xla,
                                       compiled_by_xla, model_constants,
                                       move_into)),
          input_signature=signature, jit_compile=self.jit_compile,
          autograph=False)
    return kernel
