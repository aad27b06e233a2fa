"""The gradient of a `pc:xla` call made eagerly under a tape.

Under a tape, the forward pass is the reverse VM's recording run
(`reverse_vm`): the program without `pc:xla`'s floating-point selects
(whose gradients would turn an untaken arm's NaN into a NaN gradient), as
`pc:graph` traces it, compiled by XLA, run forward while it records what
each step's block needs to run again. Its result is the call's result,
and its record stays on the device for the backward pass: one more XLA
computation, which takes the steps back one block at a time. Running the
compiled VM for the result and the recording run in the backward pass
instead ran the program forward twice a training step.

The record has a fixed number of entries, since XLA needs its shape when
it compiles: a bound on the steps, a power of two (few bounds, so few
compilations). A batch size's first call runs the compiled VM once
(without a record) for its step count; a run that hits the bound before
every member halts says so, and runs again with the bound doubled. The
largest bound used for a batch size is kept as the next call's.
"""

import functools

import tensorflow as tf

from tfp_autobatch.runtime import _tf_private
from tfp_autobatch.runtime import reverse_vm
from tfp_autobatch.runtime import run_counters
from tfp_autobatch.runtime._tf_private import record
from tfp_autobatch.runtime._tf_private import resource_variable_ops

# The least bound on the backward loop's steps.
MIN_STEP_BOUND = 16


def step_bound(steps, least=MIN_STEP_BOUND):
  """The least power of two at or above `steps` and `least`."""
  bound = max(int(least), MIN_STEP_BOUND)
  while bound < steps:
    bound *= 2
  return bound


class XlaGradient:
  """Calls a compiled VM with the gradient described in the module
  docstring.

  Args:
    differentiable: the `pc_vm.PcVmRuntime` (mode "graph") of the program
      without floating-point selects, which the reverse VM runs.
  """

  def __init__(self, differentiable):
    self.differentiable = differentiable
    self._recordings = {}   # (batch size, bound) -> _Recording
    # The reverse VM's plan (`reverse_vm.ReverseVm`), in two parts:
    # batch size -> its stack reads (the recording run's);
    # (batch size, variables) -> its gathered variables (the backward's).
    self._read_plans = {}
    self._gathered_plans = {}
    self._least_bound = {}   # batch size -> largest bound used

  def call(self, vm, args):
    """`vm(*args)` (a concrete function of the compiled VM, returning
    (result, overflow, faults, counters)), eagerly, with a gradient with
    respect to `args` and the variables `vm` reads: the outputs of the
    reverse VM's recording run."""
    flat_args = [tf.convert_to_tensor(x) for x in tf.nest.flatten(args)]
    structure = []

    @tf.custom_gradient
    def with_gradient(*flat):
      inputs = tf.nest.pack_sequence_as(args, list(flat))
      recording, outs, saved = self._recorded(vm, inputs)
      for variable in vm.variables:
        resource_variable_ops.variable_accessed(variable)
      structure.append(outs)
      flat_outs = tf.nest.flatten(outs)
      num_results = len(tf.nest.flatten(outs[0]))

      def gradient(*upstream, variables=None):
        result_upstream = [
            tf.zeros_like(r) if u is None else tf.convert_to_tensor(u)
            for r, u in zip(flat_outs[:num_results], upstream[:num_results])]
        return self._gradient(recording, inputs, result_upstream, saved,
                              list(variables or []))
      return flat_outs, gradient

    flat_outs = with_gradient(*flat_args)
    return tf.nest.pack_sequence_as(structure[0], flat_outs)

  def _recorded(self, vm, inputs):
    """`(recording, outputs, saved)`: the recording run on `inputs`, for
    the least bound its steps fit in."""
    size = tf.nest.flatten(inputs)[0].shape[0]
    bound = self._least_bound.get(size)
    if bound is None:
      with record.stop_recording():
        steps = int(vm(*inputs)[3][run_counters.STEPS])
      bound = step_bound(steps)
    while True:
      recording = self._recording(size, bound, inputs)
      with record.stop_recording():
        outs, saved, finished = recording.forward(*inputs)
      if bool(finished):
        break
      bound *= 2
    self._least_bound[size] = bound
    return recording, outs, saved

  def _recording(self, size, bound, inputs):
    """The `_Recording` of a batch size and bound, traced (again where its
    trace changed the stack reads its plan has)."""
    key = (size, bound)
    while key not in self._recordings:
      reads = self._read_plans.setdefault(size, {})
      recording = _Recording(self.differentiable, reads, bound, inputs)
      learned = recording.reverse.plan_learned()["reads"]
      if learned == reads:
        self._recordings[key] = recording
      else:
        self._read_plans[size] = learned
    return self._recordings[key]

  def _gradient(self, recording, inputs, upstream, saved, variables):
    """(gradients of the flat inputs, gradients of `variables`)."""
    leaves = tf.nest.flatten(inputs)
    size = leaves[0].shape[0]
    plan_key = (size, tuple(v.ref() for v in variables))
    backward = recording.backward(
        variables, self._gathered_plans.get(plan_key, {}), inputs, upstream,
        saved)
    self._gathered_plans[plan_key] = recording.gathered(variables)
    # Not recorded by a tape around the gradient's computation: the
    # backward pass has no gradient of its own (no second derivatives
    # through pc:xla), and a recorded call would build one at once.
    with record.stop_recording():
      grads = backward(inputs, upstream, saved)
    floats = [i for i, x in enumerate(leaves) if x.dtype.is_floating]
    input_grads = [None] * len(leaves)
    for i, g in zip(floats, grads[:len(floats)]):
      input_grads[i] = g
    return input_grads, list(grads[len(floats):])


class _Recording:
  """A reverse VM's recording run for one batch size and bound, compiled
  (`forward`, its concrete function), and its backward passes, per list of
  variables (`backward`).

  Args:
    differentiable: as `XlaGradient`'s.
    reads: the stack reads of the reverse VM's plan
      (`reverse_vm.ReverseVm`).
    bound: the bound on the steps.
    inputs: the VM's inputs (a list), which the forward is traced for.
  """

  def __init__(self, differentiable, reads, bound, inputs):
    self.reverse = reverse_vm.ReverseVm(differentiable, {"reads": reads})
    # A partial, as for the VM (`pc_vm.PcVmRuntime.compiled_for`): TF's
    # retracing detector would count every recording run as one function.
    def forward(*args):
      return self.reverse.recorded_run(list(args), bound)
    self.forward = _tf_private.traced_without_tapes(
        tf.function(functools.partial(forward), jit_compile=True,
                    autograph=False), *inputs)
    self._backward = {}   # variables -> (gathered, concrete function)

  def gathered(self, variables):
    """The gathered variables of the plan `variables`' backward was last
    traced with."""
    return self._backward[tuple(v.ref() for v in variables)][0]

  def backward(self, variables, gathered, inputs, upstream, saved):
    """The backward pass's concrete function for `variables`, traced with
    the `gathered` variables of its plan (again where the trace found
    others)."""
    key = tuple(v.ref() for v in variables)
    traced = self._backward.get(key)
    while traced is None or traced[0] != gathered:
      self.reverse.gathered = dict(gathered)
      def backward(inputs, upstream, saved):
        return self.reverse.gradient_from_saved(inputs, upstream, variables,
                                                saved)
      # Traced here, under the tape of the gradient's caller: the
      # backward pass's own tapes must record.
      concrete = tf.function(functools.partial(backward), jit_compile=True,
                             autograph=False).get_concrete_function(
                                 inputs, upstream, saved)
      traced = self._backward[key] = (gathered, concrete)
      gathered = self.reverse.plan_learned()["gathered"]
    return traced[1]
