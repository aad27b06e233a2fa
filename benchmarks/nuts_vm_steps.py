r"""What one NUTS transition costs in VM steps, and what a VM step costs.

    python -m benchmarks.nuts_vm_steps --problem=correlated_gaussian \
        --batch_sizes=1,64 --repeats=25 \
        --output=benchmarks/results/nuts_vm_steps.json

`benchmarks.nuts` measures what users see (gradients per second); this one
takes the program-counter VM apart: for one fixed transition (same state,
same seed, so the same work every time) it reports the VM steps the
transition takes (blocks executed, from the backend's run statistics), the
leapfrog steps it computes, its model (gradient) calls and how many chains
each was made for, and the fastest and median time of the
transition traced in `tf.function` after `--warmup` untimed ones (XLA
compiled kernels start slow), hence microseconds per VM step, the
first call's seconds (conversion, tracing and XLA compilation) and the
TensorFlow ops the trace built (`traced_ops`). With
`--num_data` small, the logistic regression's gradient is nearly free and
what remains is the VM's own cost. `--model` takes an ESS benchmark model
instead (`benchmarks/ess_models.py`, e.g. eight_schools, from its starts),
and `--tfp` also times `tfp.mcmc.NoUTurnSampler`'s transition from the
same state and seed: its trajectories are not ours (another random
stream), so compare the time per lockstep leapfrog (`us_per_max_leapfrog`:
the transition's time over the most leapfrogs any chain took, which the
batch waits for in both kernels).
"""
import collections
import functools
import json
import time

from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

import nuts
from benchmarks import ess_models
from benchmarks import machine as machine_lib
from benchmarks import nuts as nuts_bench
from benchmarks import nuts_problems


def _unknown_chains(value, chains):
  """A spec of `value` with its leading dimension unknown where it is
  the chains'. A composite value (the kernel results' momentum
  distribution) keeps its own spec: the kernel reads only its precision."""
  if not tf.is_tensor(value):
    return tf.type_spec_from_value(value)
  shape = value.shape.as_list()
  if shape and shape[0] == chains:
    shape[0] = None
  return tf.TensorSpec(shape, value.dtype)


FixedTransition = collections.namedtuple("FixedTransition", [
    "kernel",     # the NoUTurnSampler
    "state",      # the chains' start, [chains, d]
    "results",    # its kernel results
    "run",        # run(): the transition traced in tf.function; its
                  # kernel results
    "run_eagerly",  # run_eagerly(): the same, eagerly (for the kernel's
                    # run statistics, `kernel.last_run_stats`)
    "concrete",   # concrete(): the traced tf.function's concrete function
])


def traced_ops(concrete):
  """The TensorFlow ops a trace built: the nodes of a concrete function's
  graph and of every function it calls (the VM's loops, conditionals and
  kernels are functions of their own). What tracing, and the first call's
  conversion to XLA, cost grows with."""
  graph_def = concrete.graph.as_graph_def()
  return len(graph_def.node) + sum(len(f.node_def)
                                   for f in graph_def.library.function)


def fixed_transition(problem, chains, num_trajectories, backend="pc:xla",
                     chains_known_at_trace=True, jit_compile=False):
  """One NUTS transition from the same state with the same seed at every
  call, so the same work each time (what the VM benchmarks take apart),
  traced in a `tf.function` compiled with XLA as a whole if
  `jit_compile`."""
  # A target of its own (a new partial): kernels with one target object
  # share their program (nuts/shared_programs.py), and `first_call_sec` counts
  # conversion and compilation from scratch.
  kernel = nuts.NoUTurnSampler(
      functools.partial(problem.target_log_prob), problem.step_size,
      backend=backend,
      num_trajectories_per_step=num_trajectories)
  return transition_of(kernel, problem, chains, chains_known_at_trace,
                       jit_compile)


def transition_of(kernel, problem, chains, chains_known_at_trace=True,
                  jit_compile=False):
  """`kernel`'s `FixedTransition` from `problem`'s start on `chains`
  chains and a fixed seed (`fixed_transition`'s, for any NUTS kernel
  whose results have `target_log_prob`)."""
  state = tf.constant(problem.initial_state(chains))
  results = kernel.bootstrap_results(state)
  seed = tf.constant([0, 7])
  signature = None
  if not chains_known_at_trace:
    signature = tf.nest.map_structure(lambda x: _unknown_chains(x, chains),
                                      [state, results, seed])
  step = tf.function(
      lambda state, results, seed: kernel.one_step(state, results,
                                                   seed=seed),
      input_signature=signature, jit_compile=jit_compile)

  def run():
    out = step(state, results, seed)[1]
    out.target_log_prob.numpy()
    return out

  def run_eagerly():
    return kernel.one_step(state, results, seed=seed)[1]
  return FixedTransition(kernel, state, results, run, run_eagerly,
                         lambda: step.get_concrete_function(state, results,
                                                            seed))


def time_calls(call, warmup, repeats):
  """`(first call's result, its seconds, seconds of each of `repeats`
  calls)` of `call()`, timed after `warmup` untimed calls (XLA-compiled
  kernels run slower for their first few calls); `call` ends by reading a
  result into NumPy, so that the work is done when it returns."""
  start = time.perf_counter()
  out = call()
  first = time.perf_counter() - start
  for _ in range(warmup):
    call()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
  return out, first, times


def time_transitions(transition, warmup, repeats):
  """`time_calls` of a `FixedTransition`: its kernel results, the first
  call's seconds and those of each timed call."""
  return time_calls(transition.run, warmup, repeats)


def _lockstep(seconds, leapfrogs_taken):
  """The most leapfrogs any chain took, and `seconds` per such leapfrog
  in microseconds: the batch's cost per leapfrog, which waits for its
  longest trajectory."""
  most = int(np.max(leapfrogs_taken))
  return {"max_leapfrogs": most, "us_per_max_leapfrog": seconds / most * 1e6}


def measure_tfp(problem, chains, repeats, warmup=10, jit_compile=False):
  """One record of `tfp.mcmc.NoUTurnSampler`'s transition from the
  fixed state and seed `fixed_transition` takes, timed as `measure`
  times ours (no VM steps: its kernel has none)."""
  kernel = tfp.mcmc.NoUTurnSampler(problem.target_log_prob,
                                   problem.step_size)
  out, first, times = time_transitions(
      transition_of(kernel, problem, chains, jit_compile=jit_compile),
      warmup, repeats)
  median = float(np.median(times))
  return {
      "problem": problem.name, "backend": "tfp", "batch_size": chains,
      "jit_compile": jit_compile, "num_dims": problem.num_dims,
      "warmup": warmup, "leapfrogs": int(np.sum(out.leapfrogs_taken)),
      "first_call_sec": first, "min_sec": min(times), "median_sec": median,
      **_lockstep(median, out.leapfrogs_taken),
  }


def measure(problem, chains, num_trajectories, repeats, backend, warmup=10,
            chains_known_at_trace=True, jit_compile=False):
  """One record: VM steps and timings of one fixed transition."""
  transition = fixed_transition(problem, chains, num_trajectories, backend,
                                chains_known_at_trace, jit_compile)
  out, first, times = time_transitions(transition, warmup, repeats)
  transition.run_eagerly()
  stats = transition.kernel.last_run_stats
  steps = stats.steps
  return {
      "problem": problem.name, "backend": backend, "batch_size": chains,
      "chains_known_at_trace": chains_known_at_trace,
      "jit_compile": jit_compile,
      "num_trajectories_per_step": num_trajectories,
      "num_dims": problem.num_dims, "warmup": warmup,
      "vm_steps": steps,
      "leapfrogs": int(np.sum(out.leapfrogs_taken)),
      # The model's gradient calls, and how many chains each was made for
      # ({chains: calls}; calls for a few stragglers cost more than their
      # share).
      "model_calls": stats.batched_primitive_calls,
      "chains_per_model_call": {
          str(k): n for k, n in sorted(stats.batched_primitive_members.items())},
      "first_call_sec": first,
      "traced_ops": traced_ops(transition.concrete()),
      "min_sec": min(times), "median_sec": float(np.median(times)),
      "us_per_vm_step": float(np.median(times)) / steps * 1e6,
      **_lockstep(float(np.median(times)), out.leapfrogs_taken),
  }


# Command line. Flags are defined only when run as a program, so importing
# this module (as the tests and `benchmarks.nuts_profile` do) defines none.

def define_transition_flags(fv):
  """Defines on `fv` the flags that choose the fixed transition (read by
  `problem_from_flags`, shared with `benchmarks.nuts_profile`)."""
  flags.DEFINE_enum("problem", "correlated_gaussian", nuts_problems.PROBLEMS,
                    "Target (see benchmarks/nuts_problems.py).",
                    flag_values=fv)
  flags.DEFINE_enum("model", None, ess_models.MODELS,
                    "An ESS benchmark model (benchmarks/ess_models.py) "
                    "instead of --problem, from the ESS benchmark's starts.",
                    flag_values=fv)
  flags.DEFINE_float("step_size", None,
                     "Step size (default: the problem's or model's).",
                     flag_values=fv)
  flags.DEFINE_integer("num_trajectories_per_step", 1,
                       "Trajectories fused into one transition.",
                       flag_values=fv)
  flags.DEFINE_integer("warmup", 10,
                       "Untimed transitions after the first call "
                       "(XLA-compiled kernels run slower for their first "
                       "few calls).", flag_values=fv)
  flags.DEFINE_integer("num_dims", None, "State dimension (default 100).",
                       flag_values=fv)
  flags.DEFINE_integer("num_data", None,
                       "Logistic regression data points (default 10,000).",
                       flag_values=fv)


def define_flags(flag_values=None):
  """Defines the flags on `flag_values` (default absl's); returns them."""
  fv = flags.FLAGS if flag_values is None else flag_values
  define_transition_flags(fv)
  flags.DEFINE_list("batch_sizes", ["1", "64"], "Numbers of chains.",
                    flag_values=fv)
  flags.DEFINE_integer("repeats", 25, "Timed transitions.", flag_values=fv)
  flags.DEFINE_string("backend", "pc:xla", "A pc backend.", flag_values=fv)
  flags.DEFINE_bool("tfp", False,
                    "Also time tfp.mcmc.NoUTurnSampler's transition from "
                    "the same state and seed.", flag_values=fv)
  flags.DEFINE_bool("chains_known_at_trace", True,
                    "Trace the transition with the number of chains static "
                    "(as a fixed state gives it); false traces it with that "
                    "dimension unknown, as in a caller's tf.function with "
                    "[None, ...] signatures, where pc:xla runs its trace for "
                    "any batch size instead of one per size.",
                    flag_values=fv)
  flags.DEFINE_bool("jit_compile", False,
                    "Trace the transition in a tf.function with "
                    "jit_compile=True, as a sample_chain user is advised "
                    "to (one XLA program, no hop from TensorFlow's "
                    "executor into the kernel's XLA computation); false: "
                    "a plain tf.function.", flag_values=fv)
  flags.DEFINE_string("output", None, "JSON file for the results.",
                      flag_values=fv)
  return fv


def problem_from_flags(fv):
  """The problem that `--problem` (or `--model`), `--num_dims`,
  `--num_data` and `--step_size` name; `--model` and `--step_size` only
  where the program defines them (`benchmarks.nuts_fixed_costs` does
  not)."""
  sizes = {k: v for k, v in (("num_dims", fv.num_dims),
                             ("num_data", fv.num_data)) if v is not None}
  model, step_size = (fv[name].value if name in fv else None
                      for name in ("model", "step_size"))
  if model is not None:
    if sizes:
      raise ValueError(
          "--num_dims and --num_data size --problem's targets; an ESS "
          "model (--model) has its own size")
    return ess_models.as_problem(ess_models.make_model(model), step_size)
  problem = nuts_problems.make_problem(fv.problem, **sizes)
  if step_size is not None:
    problem = problem._replace(step_size=step_size)
  return problem


def write_results(path, **payload):
  """Writes `payload` and the machine's description as JSON to `path`.
  The description is taken first: a new results file in the working tree
  would make its commit read "+dirty"."""
  record = dict(machine=machine_lib.machine_info(), **payload)
  with open(path, "w") as f:
    json.dump(record, f, indent=1)
  print(f"wrote {path}")


def run_from_flags(fv):
  """Measures as the parsed flags `fv` say; returns the records."""
  problem = problem_from_flags(fv)
  records = []
  for chains in [int(b) for b in fv.batch_sizes]:
    r = measure(problem, chains, fv.num_trajectories_per_step,
                fv.repeats, fv.backend, fv.warmup,
                fv.chains_known_at_trace, fv.jit_compile)
    records.append(r)
    print(f"{r['problem']} d={r['num_dims']} chains={chains} "
          f"k={r['num_trajectories_per_step']}: {r['vm_steps']} VM steps, "
          f"{r['leapfrogs']} leapfrogs, {r['model_calls']} model calls, "
          f"median {r['median_sec'] * 1e3:.2f} ms"
          f" (fastest {r['min_sec'] * 1e3:.2f} ms), "
          f"{r['us_per_vm_step']:.1f} us per VM step, "
          f"{r['us_per_max_leapfrog']:.1f} us per lockstep leapfrog; first "
          f"call {r['first_call_sec']:.1f} s, {r['traced_ops']:,} ops traced")
    if fv.tfp:
      t = measure_tfp(problem, chains, fv.repeats, fv.warmup, fv.jit_compile)
      records.append(t)
      print(f"  tfp.mcmc.NoUTurnSampler: {t['leapfrogs']} leapfrogs (at most "
            f"{t['max_leapfrogs']} a chain), median "
            f"{t['median_sec'] * 1e3:.2f} ms, "
            f"{t['us_per_max_leapfrog']:.1f} us per lockstep leapfrog "
            f"(ours / TFP's: "
            f"{r['us_per_max_leapfrog'] / t['us_per_max_leapfrog']:.2f}x)")
  if fv.output:
    write_results(fv.output, records=records)
  return records


if __name__ == "__main__":
  nuts_bench.run_program(define_flags, run_from_flags)
