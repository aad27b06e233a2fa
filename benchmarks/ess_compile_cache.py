r"""First calls in fresh processes, with and without TensorFlow's persistent
XLA compilation cache (`TF_XLA_FLAGS=--tf_xla_persistent_cache_directory`).

  python -m benchmarks.ess_compile_cache --model=eight_schools --chains=4 \
      --systems=tfp,pc:xla --output=benchmarks/results/ess_compile_cache.json

For each system it starts fresh Python processes, one after the other, each
timing the first call of the ESS benchmark's harness
(`benchmarks/ess_harness.py`: bootstrap and one call of `--steps_per_call`
steps, conversion, tracing and XLA compilation included), then the same
call again: with no cache; then with an empty cache folder (cold: the
process writes it); then twice more with that folder (warm: the processes
read it). The cache saves XLA's compilation only; conversion and tracing
are paid again by every process. docs/compile_cache.md says how to use it.
"""
import json
import os
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

flags.DEFINE_string("model", "eight_schools", "model (benchmarks.ess_models)")
flags.DEFINE_integer("chains", 4, "chains")
flags.DEFINE_list("systems", ["tfp", "pc:xla"], "systems (benchmarks.ess)")
flags.DEFINE_integer("steps_per_call", 10, "steps in the first call")
flags.DEFINE_integer("warm_runs", 2, "processes reading the warm cache")
flags.DEFINE_string("output", None, "JSON output")
flags.DEFINE_string("child", None, "internal: time one first call of this "
                    "system and print it as JSON")
FLAGS = flags.FLAGS


def _child():
  # Imported here: the parent process must not load TensorFlow (it only
  # starts the children, whose environment sets the cache).
  from benchmarks import ess_harness   # pylint: disable=g-import-not-at-top
  from benchmarks import ess_models   # pylint: disable=g-import-not-at-top
  model = ess_models.make_model(FLAGS.model)
  init = ess_models.initial_state(model, FLAGS.chains, 0)
  result = ess_harness.run(
      FLAGS.child, model, init, num_warmup=FLAGS.steps_per_call,
      num_draws=FLAGS.steps_per_call, steps_per_call=FLAGS.steps_per_call)
  print("RESULT " + json.dumps({"first_call_s": result.first_call_s,
                                "repeat_s": result.repeat_s}))


def _first_call(system, cache_dir):
  env = dict(os.environ)
  if cache_dir:
    env["TF_XLA_FLAGS"] = (env.get("TF_XLA_FLAGS", "") +
                           f" --tf_xla_persistent_cache_directory={cache_dir}")
  out = subprocess.run(
      [sys.executable, "-m", "benchmarks.ess_compile_cache",
       f"--child={system}", f"--model={FLAGS.model}",
       f"--chains={FLAGS.chains}", f"--steps_per_call={FLAGS.steps_per_call}"],
      env=env, capture_output=True, text=True, check=True).stdout
  line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
  return json.loads(line[len("RESULT "):])


def main(argv):
  del argv
  if FLAGS.child:
    _child()
    return
  records = []
  for system in FLAGS.systems:
    with tempfile.TemporaryDirectory() as cache_dir:
      runs = [("no cache", None), ("cold cache", cache_dir)] + [
          (f"warm cache {i + 1}", cache_dir) for i in range(FLAGS.warm_runs)]
      for what, folder in runs:
        timing = _first_call(system, folder)
        files = len(os.listdir(cache_dir))
        records.append(dict(system=system, run=what, cache_files=files,
                            **timing))
        print(f"{system}: {what}: first call {timing['first_call_s']:.1f} s"
              f" (the steps alone {timing['repeat_s']:.2f} s), {files} "
              "files in the cache", flush=True)
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump({"model": FLAGS.model, "chains": FLAGS.chains,
                 "steps_per_call": FLAGS.steps_per_call,
                 "records": records}, f, indent=1)


if __name__ == "__main__":
  app.run(main)
