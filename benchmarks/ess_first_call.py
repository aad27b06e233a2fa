r"""Where the ESS benchmark's first call goes: tracing, then XLA's passes.

    python -m benchmarks.ess_first_call --model=eight_schools --chains=4 \
        --system=pc:xla

`benchmarks.ess` times each system's first call as a whole (conversion,
tracing, XLA compilation and the first steps). This one takes the same
harness (`ess_harness`: `sample_chain` with dual averaging inside
`tf.function(jit_compile=True)`) apart, for one system, model and number
of chains:

- `bootstrap_s`: the compiled `bootstrap_results`, traced, compiled, run;
- `trace_s`: tracing the compiled `sample_chain` call (AutoGraph, the
  kernel's step, for ours the program's conversion and the VM's trace);
- `compile_and_run_s`: its first call, which XLA compiles, run under
  TensorFlow's profiler, whose events name XLA's compiler passes: the
  costliest are listed (`--top`), their seconds summed over every thread
  (XLA compiles fusions on several), so they can exceed the wall time;
- `repeat_s`: the same call again (the steps alone);
- `hlo_instructions`: the size of the HLO that XLA starts from.

Each phase's CPU seconds (`cpu_s`, every thread of the process) are given
beside its wall seconds: on a machine that other jobs load, they say more
than the wall clock about what the phase costs.

Run it for `tfp` and for our backend under the same load, and compare.
"""
import collections
import json
import tempfile
import time

from absl import app
from absl import flags
import tensorflow as tf
import tensorflow_probability as tfp

from benchmarks import ess_harness
from benchmarks import ess_models
from benchmarks import xla_profile

FLAGS = flags.FLAGS


def define_flags():
  """The command line's flags, defined only when run as a program, so
  that importing this module (as the tests do, beside other benchmarks
  whose flags share names) defines none."""
  flags.DEFINE_string("model", "eight_schools",
                      f"one of: {', '.join(ess_models.MODELS)}")
  flags.DEFINE_integer("chains", 4, "number of chains")
  flags.DEFINE_string("system", "pc:xla",
                      "'tfp' (tfp.mcmc.NoUTurnSampler) or our backend")
  flags.DEFINE_integer("steps_per_call", 10, "steps of the compiled call")
  flags.DEFINE_integer("top", 20, "profiler events listed, costliest first")
  flags.DEFINE_string("output", None, "JSON file for the record")


def event_seconds(space):
  """{event name: (seconds summed over its occurrences, count)} of every
  event of a profile's XSpace, on every plane and thread. A name's text
  after its first ':' (an instance's detail) is dropped."""
  seconds = collections.Counter()
  counts = collections.Counter()
  for plane in space.planes:
    names = {key: m.name for key, m in plane.event_metadata.items()}
    for line in plane.lines:
      for event in line.events:
        name = names.get(event.metadata_id, "?").split(":")[0]
        seconds[name] += event.duration_ps * 1e-12
        counts[name] += 1
  return {name: (s, counts[name]) for name, s in seconds.items()}


def measure(system, model, num_chains, steps_per_call, top):
  """The first call of `ess_harness`'s compiled step, taken apart."""
  init = tf.constant(ess_models.initial_state(model, num_chains, 0))

  def target(z):
    return model.target_log_prob(z)

  kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
      ess_harness.make_kernel(system, target, model.step_size,
                              max_tree_depth=10, num_trajectories_per_step=1),
      num_adaptation_steps=100, target_accept_prob=0.8)

  start, advance = ess_harness.compiled_calls(kernel, steps_per_call,
                                              trace_fn=None)

  def run(results, seed):
    out = advance(init, results, seed)
    tf.nest.map_structure(lambda t: t.numpy(), out, expand_composites=True)

  wall, cpu = {}, {}

  def timed(phase, fn, *args):
    began, began_cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    wall[phase] = time.perf_counter() - began
    cpu[phase] = time.process_time() - began_cpu
    return out

  def bootstrap():
    results = start(init)
    tf.nest.map_structure(lambda t: t.numpy(), results,
                          expand_composites=True)
    return results

  results = timed("bootstrap", bootstrap)
  seed = tf.constant([0, 0])
  timed("trace", advance.get_concrete_function, init, results, seed)
  logdir = tempfile.mkdtemp()
  tf.profiler.experimental.start(logdir)
  timed("compile_and_run", run, results, seed)
  tf.profiler.experimental.stop()
  timed("repeat", run, results, seed)
  hlo = advance.experimental_get_compiler_ir(init, results, seed)(
      stage="hlo")
  events = event_seconds(xla_profile.read_profile(logdir))
  costliest = sorted(events.items(), key=lambda kv: -kv[1][0])[:top]
  return {
      "system": system, "model": model.name, "num_chains": num_chains,
      "steps_per_call": steps_per_call,
      **{f"{phase}_s": s for phase, s in wall.items()},
      "cpu_s": cpu,
      "hlo_instructions": sum(" = " in line for line in hlo.splitlines()),
      "profile_events": [{"name": name, "seconds": s, "count": n}
                         for name, (s, n) in costliest],
  }


def report(record):
  phases = ", ".join(
      f"{phase.replace('_', ' ')} {record[phase + '_s']:.1f} s "
      f"(CPU {cpu:.1f} s)" for phase, cpu in record["cpu_s"].items())
  lines = [f"{record['system']} on {record['model']}, "
           f"{record['num_chains']} chains: {phases}; "
           f"{record['hlo_instructions']} HLO instructions",
           "profile events (seconds summed over threads):"]
  lines += [f"  {e['seconds']:8.2f} s {e['count']:6d}x  {e['name']}"
            for e in record["profile_events"]]
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if FLAGS.model not in ess_models.MODELS:
    raise app.UsageError(f"unknown model {FLAGS.model!r}; models: "
                         f"{', '.join(ess_models.MODELS)}")
  record = measure(FLAGS.system, ess_models.make_model(FLAGS.model),
                   FLAGS.chains, FLAGS.steps_per_call, FLAGS.top)
  print(report(record))
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump(record, f, indent=1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
