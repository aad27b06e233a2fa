"""The gradient of a `pc:xla` call made eagerly under a tape.

The forward pass is the VM that XLA compiled, as without a tape. The
backward pass is one more XLA computation, per batch size and step bound:
the reverse VM (`reverse_vm`) of the program without `pc:xla`'s
floating-point selects (whose gradients would turn an untaken arm's NaN
into a NaN gradient), as `pc:graph` traces it. It runs the VM forward
again, recording each step, then takes the steps back one block at a time.

The record has a fixed number of entries, since XLA needs its shape when
it compiles: the forward run's step count rounded up to a power of two
(few bounds, so few compilations). The `pc:graph` program may take more
steps than `pc:xla`'s; a run that hits the bound before every member
halts says so, and the backward pass runs again with the bound doubled.
The largest bound used for a batch size is kept as the next call's least.
"""
import functools

import tensorflow as tf

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
    self._backward = {}   # (batch size, bound, variables) -> tf.function
    # (batch size, variables) -> the reverse VM's plan
    # (`reverse_vm.ReverseVm`).
    self._plans = {}
    self._least_bound = {}   # batch size -> largest bound used

  def call(self, vm, args):
    """`vm(*args)` (a concrete function of the compiled VM, returning
    (result, overflow, faults, counters)), eagerly, with a gradient with
    respect to `args` and the variables `vm` reads."""
    flat_args = [tf.convert_to_tensor(x) for x in tf.nest.flatten(args)]
    structure = []

    @tf.custom_gradient
    def with_gradient(*flat):
      inputs = tf.nest.pack_sequence_as(args, list(flat))
      with record.stop_recording():
        outs = vm(*inputs)
      for variable in vm.variables:
        resource_variable_ops.variable_accessed(variable)
      structure.append(outs)
      flat_outs = tf.nest.flatten(outs)
      num_results = len(tf.nest.flatten(outs[0]))

      def gradient(*upstream, variables=None):
        steps = int(outs[3][run_counters.STEPS])
        result_upstream = [
            tf.zeros_like(r) if u is None else tf.convert_to_tensor(u)
            for r, u in zip(flat_outs[:num_results], upstream[:num_results])]
        return self._gradient(inputs, result_upstream, steps,
                              list(variables or []))
      return flat_outs, gradient

    flat_outs = with_gradient(*flat_args)
    return tf.nest.pack_sequence_as(structure[0], flat_outs)

  def _gradient(self, inputs, upstream, steps, variables):
    """(gradients of the flat inputs, gradients of `variables`)."""
    leaves = tf.nest.flatten(inputs)
    size = leaves[0].shape[0]
    bound = step_bound(steps, self._least_bound.get(size, 0))
    while True:
      # Traced first: `stop_recording` would stop the trace's own tape.
      backward = self._traced_backward(size, bound, variables, inputs,
                                       upstream)
      # Not recorded by a tape around the gradient's computation: the
      # backward pass has no gradient of its own (no second derivatives
      # through pc:xla), and a recorded call would build one at once.
      with record.stop_recording():
        grads, finished = backward(inputs, upstream)
      if bool(finished):
        break
      bound *= 2
    self._least_bound[size] = bound
    floats = [i for i, x in enumerate(leaves) if x.dtype.is_floating]
    input_grads = [None] * len(leaves)
    for i, g in zip(floats, grads[:len(floats)]):
      input_grads[i] = g
    return input_grads, list(grads[len(floats):])

  def _traced_backward(self, size, bound, variables, inputs, upstream):
    """The backward pass's concrete function. Traced again where its
    trace changed the plan it was traced with (`reverse_vm.ReverseVm`:
    variables gathered, stack leaves a block reads more than once)."""
    variables_key = tuple(v.ref() for v in variables)
    key = (size, bound, variables_key)
    plan_key = (size, variables_key)
    while True:
      backward = self._backward.get(key)
      if backward is None:
        plan = self._plans.setdefault(plan_key, {})
        reverse = reverse_vm.ReverseVm(self.differentiable, plan)
        # A partial, as for the VM (`pc_vm.PcVmRuntime.compiled_for`):
        # TF's retracing detector would count every backward as one
        # function.
        backward = self._backward[key] = tf.function(
            functools.partial(self._backward_fn(reverse, bound, variables)),
            jit_compile=True, autograph=False)
        concrete = backward.get_concrete_function(inputs, upstream)
        learned = reverse.plan_learned()
        if learned != plan:
          self._plans[plan_key] = learned
          del self._backward[key]
          continue
        return concrete
      return backward.get_concrete_function(inputs, upstream)

  @staticmethod
  def _backward_fn(reverse, bound, variables):
    def backward(inputs, upstream):
      return reverse.gradient(inputs, upstream, variables, bound)
    return backward
