r"""What a NUTS transition pays outside the VM: the model, and the call.

    python -m benchmarks.nuts_fixed_costs --problem=logistic_regression \
        --rows=1,2,16,64 --output=benchmarks/results/nuts_fixed_costs.json

`benchmarks.nuts_vm_steps` times a whole transition. Two of its costs do
not depend on the VM, and this module times them alone, XLA-compiled like
everything `pc:xla` runs:

- **The model's gradient, per call, by rows.** One call of the problem's
  log density and its gradient (`nuts_systems.value_and_gradient`, as the
  kernels call it) on R rows. `--calls` calls run in a `tf.while_loop` in
  one compiled function, each on the previous call's result (a leapfrog
  step's update, so XLA cannot hoist one out of the loop), and a call
  costs the loop's time over `--calls`: what a gradient call costs inside
  a compiled program such as the VM's. A NUTS transition's gradient calls
  cost at least the sum of these over the rows each call was made for
  (`nuts_vm_steps` records those as `chains_per_model_call`).
- **Entering a compiled function from Python.** An XLA-compiled function
  that returns a NUTS state and its kernel results unchanged
  (`nuts.NoUTurnSampler.bootstrap_results` on R chains), called from
  Python: what every `one_step` called from Python pays beyond its work,
  and what `benchmarks.nuts --steps_per_call` pays once per call.

Each is timed `--repeats` times after `--warmup` untimed calls (XLA's
kernels start slow; `nuts_vm_steps.time_calls`); a record keeps the
fastest and the median.
"""
from absl import flags
import numpy as np
import tensorflow as tf

import nuts
from benchmarks import nuts as nuts_bench
from benchmarks import nuts_problems
from benchmarks import nuts_systems
from benchmarks import nuts_vm_steps

# The step of the leapfrog-like update between the loop's model calls:
# small, so the states stay where the problem starts them.
_STEP = 1e-4


def gradient_loop(problem, calls):
  """An XLA-compiled `q -> (q, sum of log densities)` that calls the
  problem's value and gradient `calls` times in a loop, each call on the
  state the previous call's gradient moved."""

  @tf.function(jit_compile=True)
  def run(q):
    def body(k, q, total):
      logp, grad = nuts_systems.value_and_gradient(problem.target_log_prob,
                                                   q)
      return k + 1, q + _STEP * grad, total + logp
    _, q, total = tf.while_loop(
        lambda k, *_: k < calls, body,
        (tf.constant(0), q, tf.zeros(tf.shape(q)[:1], q.dtype)))
    return q, total
  return run


def pass_through():
  """An XLA-compiled `(state, results) -> (state, results)` that returns
  its arguments unchanged: the cost of a call and nothing else."""
  return tf.function(
      lambda state, results: (tf.identity(state),
                              tf.nest.map_structure(tf.identity, results)),
      jit_compile=True)


def measure_gradient(problem, rows, calls, warmup, repeats):
  """One record: the model's value and gradient on `rows` rows, per call
  inside a compiled loop of `calls` calls."""
  if calls < 1:
    raise ValueError(f"calls must be at least 1, not {calls}")
  run = gradient_loop(problem, calls)
  q = tf.constant(problem.initial_state(rows))
  _, first, times = nuts_vm_steps.time_calls(
      lambda: [t.numpy() for t in run(q)], warmup, repeats)
  return {
      "cost": "gradient", "problem": problem.name, "rows": rows,
      "num_dims": problem.num_dims, "calls_per_loop": calls,
      "warmup": warmup, "repeats": repeats, "first_call_sec": first,
      "min_ms_per_call": min(times) / calls * 1e3,
      "median_ms_per_call": float(np.median(times)) / calls * 1e3,
  }


def measure_call(problem, chains, warmup, repeats):
  """One record: entering an XLA-compiled function from Python with a
  NUTS state and its kernel results on `chains` chains, and leaving it."""
  kernel = nuts.NoUTurnSampler(problem.target_log_prob, problem.step_size)
  state = tf.constant(problem.initial_state(chains))
  results = kernel.bootstrap_results(state)
  run = pass_through()

  def call():
    return run(state, results)[0].numpy()
  _, first, times = nuts_vm_steps.time_calls(call, warmup, repeats)
  return {
      "cost": "call", "problem": problem.name, "chains": chains,
      "num_dims": problem.num_dims,
      "tensors_in": len(tf.nest.flatten((state, results))),
      "warmup": warmup, "repeats": repeats, "first_call_sec": first,
      "min_ms_per_call": min(times) * 1e3,
      "median_ms_per_call": float(np.median(times)) * 1e3,
  }


# Command line. Flags are defined only when run as a program, so importing
# this module (as the tests do) defines none.

def define_flags(flag_values=None):
  """Defines the flags on `flag_values` (default absl's); returns them."""
  fv = flags.FLAGS if flag_values is None else flag_values
  flags.DEFINE_enum("problem", "logistic_regression",
                    nuts_problems.PROBLEMS,
                    "Target (see benchmarks/nuts_problems.py).",
                    flag_values=fv)
  flags.DEFINE_integer("num_dims", None, "State dimension (default 100).",
                       flag_values=fv)
  flags.DEFINE_integer("num_data", None,
                       "Logistic regression data points (default 10,000).",
                       flag_values=fv)
  flags.DEFINE_list("rows", ["1", "2", "16", "64"],
                    "Rows (chains) of each measurement.", flag_values=fv)
  flags.DEFINE_integer("calls", 100,
                       "Model calls per compiled loop (a gradient record's "
                       "per-call time is the loop's over this).",
                       flag_values=fv)
  flags.DEFINE_integer("warmup", 5,
                       "Untimed calls before the timed ones (XLA-compiled "
                       "kernels run slower for their first few calls).",
                       flag_values=fv)
  flags.DEFINE_integer("repeats", 20, "Timed calls.", flag_values=fv)
  flags.DEFINE_string("output", None, "JSON file for the results.",
                      flag_values=fv)
  return fv


def run_from_flags(fv):
  """Measures as the parsed flags `fv` say; returns the records."""
  problem = nuts_vm_steps.problem_from_flags(fv)
  records = []
  for rows in [int(r) for r in fv.rows]:
    g = measure_gradient(problem, rows, fv.calls, fv.warmup, fv.repeats)
    c = measure_call(problem, rows, fv.warmup, fv.repeats)
    records += [g, c]
    print(f"{problem.name} d={problem.num_dims} rows={rows}: gradient "
          f"{g['median_ms_per_call']:.3f} ms a call (fastest "
          f"{g['min_ms_per_call']:.3f}) in a loop of {fv.calls}; entering "
          f"a compiled function with a NUTS state and results "
          f"({c['tensors_in']} tensors) {c['median_ms_per_call']:.3f} ms "
          f"(fastest {c['min_ms_per_call']:.3f})")
  if fv.output:
    nuts_vm_steps.write_results(fv.output, records=records)
  return records


if __name__ == "__main__":
  nuts_bench.run_program(define_flags, run_from_flags)
