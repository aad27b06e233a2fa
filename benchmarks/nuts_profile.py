r"""Where one NUTS transition's time goes: XLA's kernels, VM block by block.

    python -m benchmarks.nuts_profile --problem=correlated_gaussian \
        --batch_size=64 \
        --output=benchmarks/results/nuts_profile_gaussian_64.json

`benchmarks.nuts_vm_steps` says what a transition costs in VM steps and
time; this one says where the time goes. It takes the same fixed
transition on `pc:xla` (same state and seed every call), times it, then
runs it `--repeats` more times under TensorFlow's profiler and reads back
every XLA kernel the compiled step ran. The profile carries the optimised
HLO module that made the kernels, so each kernel is named by its HLO
instruction (opcode, shape; a dot's contracting dimensions) and charged
to where that instruction sits:

- a VM block: the instruction comes from that block's ops (the blocks are
  IR-2's, `kernel.batched_program(...).ir(level=2)`; the VM names each
  block's ops by its index, see `xla_profile.HloIndex`);
- "VM loop": in the VM's loops but outside the blocks: applying a block's
  register and stack writes, the schedule, the run counters;
- "around the VM": the kernel's code before and after the batched program
  (flattening the state, the chains' seeds, the results).

A line above the tables gives the matrix products' floating-point
operations a transition (two a multiply-add, counted from the dots of
XLA's optimised program), their kernels' time and so their rate
(`xla_profile.matrix_products`), where the model has any.

Kernel times are summed over threads: XLA splits some kernels across the
intra-op thread pool and runs some beside others, so the sum can exceed the
transition's wall time (`transition_ms`, the median of `--repeats` calls
timed without the profiler). Compare kernels and blocks with each other.
The profiler's own bookkeeping slows the profiled calls
(`profiled_transition_ms`, their mean) and adds most to the smallest
kernels.
"""
from absl import flags
import numpy as np
import tensorflow as tf

from benchmarks import nuts as nuts_bench
from benchmarks import nuts_vm_steps
from benchmarks import xla_profile
from tfp_autobatch.ir import ir2
from tfp_autobatch.runtime import pc_vm

VM_LOOP = "VM loop"
AROUND_VM = "around the VM"


def attribute(space, block_labels, repeats):
  """Kernel time per transition, by kernel and by place (see the module
  docstring). `block_labels` are the VM's blocks, by block index (IR-2's
  order)."""
  def label(scope, block):
    if block is not None:
      return block_labels[block]
    return VM_LOOP if scope is not None else AROUND_VM
  return xla_profile.charged_kernels(space, (pc_vm.BLOCK_SCOPE,), label,
                                     repeats, per="transition")


def profile(problem, chains, num_trajectories, warmup, repeats):
  """One record: the transition's time and its kernels by place."""
  transition = nuts_vm_steps.fixed_transition(problem, chains,
                                              num_trajectories)
  _, _, times = nuts_vm_steps.time_transitions(transition, warmup, repeats)
  space, profiled = xla_profile.profiled(transition.run, repeats)
  transition.run_eagerly()
  stats = transition.kernel.last_run_stats
  blocks = transition.kernel.batched_program(
      transition.state, transition.results).ir(level=2).blocks
  labels = [b.label for b in blocks]
  kernels = attribute(space, labels, repeats)
  places = xla_profile.by_place(
      kernels, dict(stats.block_executions, **{VM_LOOP: stats.steps}),
      per="transition")
  return {
      "problem": problem.name, "batch_size": chains,
      "num_trajectories_per_step": num_trajectories,
      "num_dims": problem.num_dims, "warmup": warmup, "repeats": repeats,
      "vm_steps": stats.steps,
      "blocks": labels,
      "block_executions": stats.block_executions,
      "model_blocks": [b.label for b in blocks
                       if ir2.calls_batched_primitive(b)],
      "transition_ms": float(np.median(times)) * 1e3,
      "profiled_transition_ms": profiled * 1e3,
      "kernel_ms_per_transition": sum(
          p["us_per_transition"] for p in places) / 1e3,
      "matrix_products": xla_profile.matrix_products(kernels, "transition"),
      "places": places, "kernels": kernels,
  }


def report(record, top):
  """The record as text: places, then the costliest kernels."""
  return xla_profile.report(
      f"{record['problem']} d={record['num_dims']} "
      f"chains={record['batch_size']} "
      f"k={record['num_trajectories_per_step']}: {record['vm_steps']} VM "
      f"steps, {record['transition_ms']:.2f} ms a transition (median of "
      f"{record['repeats']}; {record['profiled_transition_ms']:.2f} ms "
      f"profiled), {record['kernel_ms_per_transition']:.2f} ms of XLA "
      "kernels (summed over threads)", record, top, per="transition")


# Command line. Flags are defined only when run as a program, so importing
# this module (as the tests do, beside other benchmarks) defines none.

def define_flags(flag_values=None):
  """Defines the flags on `flag_values` (default absl's); returns them."""
  fv = flags.FLAGS if flag_values is None else flag_values
  nuts_vm_steps.define_transition_flags(fv)
  flags.DEFINE_integer("batch_size", 64, "Number of chains.", flag_values=fv)
  xla_profile.define_report_flags(fv, "Transitions")
  return fv


def run_from_flags(fv):
  """Profiles as the parsed flags `fv` say; prints the report, writes the
  JSON if asked, and returns the record."""
  record = profile(nuts_vm_steps.problem_from_flags(fv), fv.batch_size,
                   fv.num_trajectories_per_step, fv.warmup, fv.repeats)
  print(report(record, fv.top))
  if fv.output:
    nuts_vm_steps.write_results(fv.output, record=record)
  return record


if __name__ == "__main__":
  nuts_bench.run_program(define_flags, run_from_flags)
