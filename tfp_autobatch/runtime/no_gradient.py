"""Calling a VM that XLA compiles, which has no gradient, under tapes.

(Where `pc:xla` is called in a graph, or `pc:graph` inside the user's
`jit_compile`. Called eagerly, `pc:xla` differentiates: `xla_gradient`.)

XLA compiles the VM's while loop and its in-place stack writes, neither of
which TensorFlow can differentiate. `call` makes the VM's call stand for
"no gradient here" instead: a forward call under a recording tape works
(recording the bare call fails at once, as TensorFlow builds the backward
function of a recorded function call then), a gradient asked for eagerly
or in the graph of the call is a clear `AutobatchError`, and a backward
function TensorFlow builds in another graph without being asked (for an
eager tape recording the user's `tf.function`) gets NaN gradients behind
an assertion that fails when it runs (XLA drops the assertion, leaving the
NaNs).

Eagerly this is a `tf.custom_gradient`. In a graph it is not: there
`tf.custom_gradient` registers a gradient function per call in
TensorFlow's global gradient registry, whose closure holds the call's
tensors, so every graph that ever traced a call stayed alive (about
1.5 MB for each `tf.function` traced around a small program). In a graph
the results pass instead through an `IdentityN` whose gradient is this
module's, registered once for each signature of the call (its results'
count and its inputs' dtypes and shapes; a closure over that count and
the message only), so the registry grows with the programs and batch
sizes traced, not with the traces. One per signature, not one for all:
`tf.saved_model.save` traces the gradient of each registered name once,
with the inputs of the first op of that name it meets, and a loaded
model calls that trace for every op of the name.
"""
import hashlib
import threading

import tensorflow as tf

from tfp_autobatch import errors
from tfp_autobatch.runtime._tf_private import ops
from tfp_autobatch.runtime._tf_private import record
from tfp_autobatch.runtime._tf_private import resource_variable_ops



def tape_may_record():
  """Whether an active `tf.GradientTape` (or forward accumulator) may
  record what runs now. A caller that runs a `pc:xla` program eagerly can
  then choose to call it inside a `tf.function` only when no tape could
  record that call (a recorded call of an XLA-compiled program fails as
  TensorFlow builds its gradient)."""
  return record.could_possibly_record()


_registered = set()   # the gradient names registered (`_gradient_name`)
_registering = threading.Lock()


def call(vm, args, message):
  """`vm(*args)` with no gradient: the error `message` (see the module
  docstring). `vm` is a concrete function (traced apart from the tapes,
  `PcVmRuntime._concrete_for`), called with the tapes stopped (a tape
  recording it would build its backward function at once, which fails)
  and its variables reported to them, so that a gradient with respect to
  one is the error too, not None."""
  flat_args = [tf.convert_to_tensor(x) for x in tf.nest.flatten(args)]
  inputs = tf.nest.pack_sequence_as(args, flat_args)
  if tf.executing_eagerly():
    return _eager_call(vm, inputs, flat_args, message)
  with record.VariableWatcher() as watcher:
    outs = _forward(vm, inputs)
  variables = sorted(watcher.watched_variables(), key=lambda v: v.name)
  flat_outs = tf.nest.flatten(outs)
  ends = flat_outs + flat_args + [tf.convert_to_tensor(v) for v in variables]
  graph = tf.compat.v1.get_default_graph()
  name = _gradient_name(len(flat_outs), message, ends)
  with graph.gradient_override_map({"IdentityN": name}):
    passed = tf.raw_ops.IdentityN(input=ends)
  op = passed[0].op
  # For a tape recording in this graph (its closure lives as long as the
  # tape does).
  gradient = ops.gradient_registry.lookup(name)
  record.record_operation("tfp_autobatch_no_gradient", passed, ends,
                          lambda *upstream: gradient(op, *upstream))
  return tf.nest.pack_sequence_as(outs, passed[:len(flat_outs)])


def _gradient_name(num_results, message, ends):
  """The registered gradient for an `IdentityN` of `ends` whose first
  `num_results` are the VM's results (see the module docstring)."""
  signature = (num_results, message, tuple(
      (t.dtype.name, None if t.shape.rank is None else t.shape.as_list())
      for t in ends))
  name = "TfpAutobatchNoGradient_" + hashlib.sha256(
      repr(signature).encode()).hexdigest()[:24]
  with _registering:
    if name not in _registered:
      ops.RegisterGradient(name)(_no_gradient(num_results, message))
      _registered.add(name)
  return name


def _forward(vm, inputs):
  with record.stop_recording():
    outs = vm(*inputs)
  for variable in vm.variables:
    resource_variable_ops.variable_accessed(variable)
  return outs


def _eager_call(vm, inputs, flat_args, message):
  """Eagerly, a `tf.custom_gradient` (which registers nothing globally)."""
  @tf.custom_gradient
  def without_gradient(*unused_flat_args):
    def no_gradient(*unused_upstream, variables=None):
      del variables
      raise errors.AutobatchError(message)
    return _forward(vm, inputs), no_gradient
  return without_gradient(*flat_args)


def _no_gradient(num_results, message):
  """The gradient of a VM call's `IdentityN`: none for the results (the
  VM's own ops are not differentiated), the error `message` for the rest
  (the call's arguments and the variables it read)."""
  def gradient(op, *upstream):
    # `op` is None where `tf.saved_model.save` traces the gradient (with
    # the op's inputs as `upstream`).
    if op is not None and tf.compat.v1.get_default_graph() is op.graph:
      raise errors.AutobatchError(message)
    with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
      # XLA drops the assertion; it cannot compile these ops, whose name
      # is then its error. They read nothing of the forward pass: a
      # forward tensor read here is one more output of the forward
      # function, and in a while loop one more accumulator (which XLA
      # cannot compile without a bound on the iterations, so the forward
      # call failed under a tape). A timestamp is not constant-folded.
      unsupported = tf.strings.length(tf.strings.as_string(
          tf.timestamp(name=XLA_ERROR), name=XLA_ERROR))
      # Shaped like the upstream gradient, or where it is not a dense
      # tensor (None, IndexedSlices) like the input.
      return [None] * num_results + [
          _nan_like(g if isinstance(g, tf.Tensor) else op.inputs[i],
                    unsupported)
          for i, g in enumerate(upstream[num_results:], num_results)]
  return gradient


# The name of the op that fails a backward function XLA compiles.
XLA_ERROR = ("tfp_autobatch_pc_xla_is_not_differentiable_take_gradients_"
             "through_backend_pc_graph_in_a_tf_function_without_jit_compile")


def _nan_like(x, after):
  """NaNs shaped like `x` (by its static shape where known: the backward
  function may be built in another graph, a while loop's gradient, than
  `x`'s), computed from `after`."""
  if not x.dtype.is_floating:
    return None
  shape = x.shape if x.shape.is_fully_defined() else tf.shape(x)
  return tf.fill(shape, tf.constant(float("nan"), x.dtype)
                 + tf.cast(after, x.dtype))
