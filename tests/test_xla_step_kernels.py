"""What the VM's per-step bookkeeping costs under XLA, in kernels.

Every kernel in the VM's loop body is launched on every VM step (about a
microsecond each on a CPU, beside the block's own work): a NUTS transition
on 4 chains runs 27 steps. These tests compile the run counters' and the
schedule's per-step code in a `tf.while_loop` and count the kernels XLA
makes of it, so that a change that splits them apart again shows here and
not only in a benchmark.
"""
import re

import tensorflow as tf

from tfp_autobatch.ir import ir2
from tfp_autobatch.runtime import run_counters
from tfp_autobatch.runtime import schedule as schedule_lib

# Instructions that launch nothing (views, tuples, constants).
_NOT_KERNELS = ("get-tuple-element", "tuple", "constant", "bitcast",
                "parameter")


def _loop_body_kernels(function, *args):
  """The opcodes of the kernels in the body of the one `tf.while_loop` of
  `function`, compiled by XLA."""
  hlo = function.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
  bodies = [c for c in re.split(r"\n(?=%|ENTRY)", hlo)
            if re.match(r"%(wide\.)?while_body", c)]
  assert len(bodies) == 1, hlo
  opcodes = re.findall(r"^\s+(?:ROOT )?%\S+ = .*? ([a-z\-]+)\(", bodies[0],
                       re.M)
  return [op for op in opcodes if op not in _NOT_KERNELS]


def _counters_loop(num_blocks, z):
  @tf.function(jit_compile=True)
  def loop(members):
    def body(i, counters):
      block = i % num_blocks
      return i + 1, run_counters.after_step(
          counters, block, num_blocks, tf.constant(3), members + block % 2)
    return tf.while_loop(lambda i, _: i < 20, body, (
        tf.constant(0), run_counters.initial(tf.constant(z), num_blocks)))
  return loop


def test_run_counters_take_one_kernel_a_step_whatever_the_members():
  # The loop's own `i + 1`, `i % num_blocks` and the copy of `i` it reads
  # three times, then the counters: five kernels when each counter was a
  # tensor of its own (steps, active, rows, high, executions, histogram),
  # and at 256 members six when the step reduced the members' pcs and
  # stack pointers (now kept per member, in registers the blocks write).
  loop_own = 3
  for z in (4, 256):
    kernels = _loop_body_kernels(_counters_loop(num_blocks=10, z=z),
                                 tf.constant([2, -1]))
    assert len(kernels) - loop_own <= 1, (z, kernels)


def _program_with_model_blocks(num_blocks, model_blocks):
  """A stand-in IR-2 program: `num_blocks` blocks, those in `model_blocks`
  calling a batched primitive (all `Schedule` reads of a program)."""
  class Block:
    def __init__(self, i, calls):
      self.label = f"f/b{i}"
      self.calls = calls
      # The last block returns from the entry, which no block calls: a
      # halting block (`schedule.halting_blocks`), a tier of its own.
      self.terminator = (ir2.Return() if i == num_blocks - 1
                         else ir2.Jump(f"f/b{i + 1}"))
  class Program:
    halt = num_blocks
    blocks = [Block(i, i in model_blocks) for i in range(num_blocks)]
  return Program


def test_primitives_last_schedule_takes_three_kernels_a_step(monkeypatch):
  monkeypatch.setattr(ir2, "calls_batched_primitive", lambda b: b.calls)
  schedule = schedule_lib.Schedule(
      _program_with_model_blocks(10, model_blocks={6}), "primitives_last")

  @tf.function(jit_compile=True)
  def loop(pc_top):
    def body(i, nxt, pc_top):
      pc_top = (pc_top + nxt) % 10
      return i + 1, schedule.next_block(pc_top), pc_top
    return tf.while_loop(lambda i, *_: i < 20, body,
                         (tf.constant(0), tf.constant(0), pc_top))

  kernels = _loop_body_kernels(loop, tf.constant([1, 2, 3, 4]))
  # The loop's own `i + 1`, the copy of `i` and the pc update, then the
  # schedule: the members per block, every tier's maximum (one
  # reduction), the pick.
  # Four when the maxima were two reductions and the masked counts a
  # kernel of their own (five in the NUTS program's loop).
  loop_own = 3
  assert len(kernels) - loop_own <= 3, kernels
