r"""Where a training step's gradient goes on `pc:xla`: the reverse VM's
recording run (the forward pass under a tape) and its backward steps,
block by block.

    python -m benchmarks.neural_profile --workload=tree_lstm \
        --batch_size=64 --threads=1

`benchmarks.neural` says how fast a training step is; this one says where
the gradient's time goes. It takes one batch of a workload (`examples/`,
the DyNet paper's sizes, the batch `benchmarks.neural` times), computes
`examples.training.gradients` on `pc:xla` (the batch's mean loss and its
gradient, without the optimizer's update) `--repeats` times, then as many
times again under TensorFlow's profiler, and reads back every XLA kernel
both compiled programs of the reverse VM (`reverse_vm`) ran: the forward
pass (the `pc:graph` program run, recording each step), and the backward
pass (its steps taken back one block at a time). Each kernel is charged
(`xla_profile.HloIndex`) to

- "recording <block>" or "backward <block>": the ops of that block of the
  recording run, or of a backward step (the block run again under a tape,
  and its gradient);
- "recording loop", "backward loop": that loop outside its blocks
  (register and stack writes, the schedule; the record's reads and
  writes; the stack adjoints' row updates, the gradients' totals);
- "around the VMs": before and after the loops (the inputs' and the
  result's adjoints, the start state's gradient).

A place's runs are its block's executions (the loop's: VM steps), from a
`pc:graph` call on the same batch, the program the reverse VM runs.
(The VM `pc:xla` compiled runs under a tape only on a batch size's first
call, which is not profiled.) A line above the tables gives the matrix
products' floating-point operations a gradient (two a multiply-add,
counted from the dots of XLA's optimised programs), their kernels' time
and so their rate (`xla_profile.matrix_products`). Kernel times are
summed over threads (see
`benchmarks.nuts_profile` for what that means when reading them).
"""
import numpy as np
import tensorflow as tf

from benchmarks import machine as machine_lib
from benchmarks import neural_systems
from benchmarks import nuts as nuts_bench
from benchmarks import nuts_vm_steps
from benchmarks import xla_profile
from examples import neural_data
from examples import training
from tfp_autobatch.runtime import reverse_vm

RECORDING, BACKWARD = "recording", "backward"
PHASES = {reverse_vm.RECORDING_SCOPE: RECORDING,
          reverse_vm.BACKWARD_SCOPE: BACKWARD}
AROUND = "around the VMs"
BACKEND = "pc:xla"
# The program the reverse VM runs, whose run gives its blocks' executions.
GRADIENT_BACKEND = "pc:graph"   # the program the reverse VM runs


def loop_place(phase):
  return f"{phase} loop"


def block_place(phase, label):
  return f"{phase} {label}"


def profile(workload, batch_size, batched_cells, warmup, repeats,
            sizes=None, seed=0):
  """One record: the gradient's time, and its kernels by place."""
  sizes = dict(neural_systems.PAPER_SIZES, **(sizes or {}))
  pool = neural_systems.make_pools(sizes, batch_size, seed)[workload]
  spec = training.WORKLOADS[workload]
  model = neural_systems.make_model(workload, sizes, pool, batched_cells)
  batch = neural_data.take(pool, 0, batch_size)

  def gradient():
    loss, grads = training.gradients(spec.batched_loss, model, batch,
                                     BACKEND)
    tf.nest.map_structure(lambda t: t.numpy(), (loss, grads),
                          expand_composites=True)

  _, first_call, times = nuts_vm_steps.time_calls(gradient, warmup, repeats)
  space, profiled = xla_profile.profiled(gradient, repeats)

  forward = spec.forward(model)
  args = spec.inputs(batch)
  forward(*args, backend=GRADIENT_BACKEND)
  stats = forward.last_stats
  labels = [b.label for b in
            forward.ir(level=2, backend=GRADIENT_BACKEND).blocks]
  executions = {}
  for phase in PHASES.values():
    executions[loop_place(phase)] = stats.steps
    executions.update({block_place(phase, label): n for label, n in
                       stats.block_executions.items() if n})

  def place(scope, block):
    if scope is None:
      return AROUND
    phase = PHASES[scope]
    if block is None:
      return loop_place(phase)
    return block_place(phase, labels[block])

  kernels = xla_profile.charged_kernels(space, tuple(PHASES), place, repeats,
                                        per="step")
  places = xla_profile.by_place(kernels, executions, per="step")
  return {
      "workload": workload, "batch_size": batch_size,
      "cells": "batched" if batched_cells else "per_example",
      "warmup": warmup, "repeats": repeats,
      "steps": stats.steps,
      "first_call_ms": first_call * 1e3,
      "step_ms": float(np.median(times)) * 1e3,
      "profiled_step_ms": profiled * 1e3,
      "kernel_ms_per_step": sum(p["us_per_step"] for p in places) / 1e3,
      "matrix_products": xla_profile.matrix_products(kernels, "step"),
      "places": places, "kernels": kernels,
  }


def report(record, top):
  """The record as text: places, then the costliest kernels."""
  return xla_profile.report(
      f"{record['workload']} batch={record['batch_size']} "
      f"cells={record['cells']} on {BACKEND}: {record['steps']} VM steps "
      f"recorded and taken back; {record['step_ms']:.1f} ms a gradient "
      f"(median of "
      f"{record['repeats']}; {record['profiled_step_ms']:.1f} ms "
      f"profiled; first call {record['first_call_ms'] / 1e3:.1f} s), "
      f"{record['kernel_ms_per_step']:.1f} ms of XLA kernels (summed over "
      "threads)", record, top, per="step")


# Command line. Flags are defined only when run as a program, so importing
# this module (as the tests do, beside other benchmarks) defines none.

def define_flags(flag_values=None):
  """Defines the flags on `flag_values` (default absl's); returns them."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  fv = flags.FLAGS if flag_values is None else flag_values
  flags.DEFINE_enum("workload", "tree_lstm", list(training.WORKLOADS),
                    "The workload.", flag_values=fv)
  flags.DEFINE_integer("batch_size", 64, "Examples in the batch.",
                       flag_values=fv)
  flags.DEFINE_enum("cells", "batched", ["per_example", "batched"],
                    "How the model's cells run: vectorised with the "
                    "per-example code, or as @tab.batched_primitives.",
                    flag_values=fv)
  flags.DEFINE_integer("threads", None,
                       "TensorFlow's intra- and inter-op threads (default: "
                       "TensorFlow's).", flag_values=fv)
  flags.DEFINE_integer("embedding_size", 256, "Word embedding size.",
                       flag_values=fv)
  flags.DEFINE_integer("hidden_size", 256, "LSTM state size.",
                       flag_values=fv)
  flags.DEFINE_integer("vocabulary_size", 10_000, "Vocabulary size.",
                       flag_values=fv)
  flags.DEFINE_integer("warmup", 1, "Untimed gradients after the first.",
                       flag_values=fv)
  flags.DEFINE_bool("tf_cpu_bfc_allocator", True,
                    "TensorFlow's pooled host allocator, as "
                    "benchmarks.neural runs it.", flag_values=fv)
  xla_profile.define_report_flags(fv, "Gradients")
  return fv


def run_from_flags(fv):
  """Profiles as the parsed flags `fv` say; prints the report, writes the
  JSON if asked, and returns the record."""
  machine_lib.use_tf_cpu_bfc_allocator(fv.tf_cpu_bfc_allocator)
  if fv.threads:
    # Before TensorFlow runs its first op (it fixes its pools then).
    tf.config.threading.set_intra_op_parallelism_threads(fv.threads)
    tf.config.threading.set_inter_op_parallelism_threads(fv.threads)
  record = profile(fv.workload, fv.batch_size, fv.cells == "batched",
                   fv.warmup, fv.repeats,
                   sizes=dict(embedding_size=fv.embedding_size,
                              hidden_size=fv.hidden_size,
                              vocabulary_size=fv.vocabulary_size))
  print(report(record, fv.top))
  if fv.output:
    nuts_vm_steps.write_results(fv.output, record=record)
  return record


if __name__ == "__main__":
  nuts_bench.run_program(define_flags, run_from_flags)
