r"""Work on constants inside the target: ours against TFP's kernel.

    python -m benchmarks.constant_work --chains=8 \
        --output=benchmarks/results/constant_work.json

Inference Gym's `IllConditionedGaussian` (`--num_dims` dimensions, a fixed
covariance) computes its log density with `tfd.MultivariateNormalTriL`: a
triangular solve against a fixed Cholesky factor, which XLA does by
inverting the factor (a loop) and multiplying. Work on constants alone
runs once in `tfp.mcmc.NoUTurnSampler`, whose leapfrog loop XLA moves it
out of; ours runs its calls inside the VM's conditionals, out of which
XLA moves nothing, so the VM moves that work before its loop itself
(docs/backends.md, "Work on constants in a batched primitive"). The same
density written against the factor's inverse, computed once outside the
target, has no such work: the two targets should take the same time.

For each target ("model": the model's own density; "inverse factor": the
rewritten one), number of chains and kernel, one NUTS transition compiled
whole (`jit_compile`) from the same state and seed, as
`benchmarks.nuts_vm_steps` times it: the median of `--repeats` calls after
`--warmup`, per lockstep leapfrog (the transition's time over the most
leapfrogs a chain took; the kernels' trajectories differ).
"""
import numpy as np
import tensorflow as tf

from benchmarks import nuts as nuts_bench
from benchmarks import nuts_problems
from benchmarks import nuts_vm_steps

TARGETS = ("model", "inverse factor")


def problems(num_dims, step_size):
  """`{target name: nuts_problems.Problem}`, the two targets of one
  `IllConditionedGaussian`: its own density and the same one (up to a
  constant) against the inverse of its Cholesky factor."""
  from inference_gym import using_tensorflow as gym   # pylint: disable=g-import-not-at-top
  model = gym.targets.IllConditionedGaussian(ndims=num_dims)
  factor = model._gaussian.scale.to_dense()   # pylint: disable=protected-access
  factor_inverse = tf.linalg.triangular_solve(factor, tf.eye(num_dims),
                                              lower=True)

  def own(x):
    return model.unnormalized_log_prob(x)

  def against_the_inverse(x):
    z = tf.linalg.matvec(factor_inverse, x)
    return -0.5 * tf.reduce_sum(z * z, -1)

  def initial_state(num_chains):
    rng = np.random.default_rng([num_dims, num_chains])
    return (0.1 * rng.standard_normal((num_chains, num_dims))).astype(
        np.float32)

  return {name: nuts_problems.Problem(
      f"ill_conditioned_gaussian ({name})", num_dims, target, initial_state,
      step_size, None, None, None,
      f"Inference Gym IllConditionedGaussian, {num_dims}-d, {name}")
          for name, target in zip(TARGETS, (own, against_the_inverse))}


def measure(num_dims, chains, step_size, repeats, warmup, backend,
            jit_compile):
  """The records: per target and number of chains, ours then TFP's."""
  records = []
  for name, problem in problems(num_dims, step_size).items():
    for n in chains:
      ours = nuts_vm_steps.measure(problem, n, 1, repeats, backend, warmup,
                                   jit_compile=jit_compile)
      tfp = nuts_vm_steps.measure_tfp(problem, n, repeats, warmup,
                                      jit_compile)
      for record in (ours, tfp):
        records.append(dict(record, target=name))
      print(f"{name}, {n} chains: ours {ours['us_per_max_leapfrog']:.1f} us "
            f"per lockstep leapfrog, tfp.mcmc.NoUTurnSampler "
            f"{tfp['us_per_max_leapfrog']:.1f} (ours / TFP's "
            f"{ours['us_per_max_leapfrog'] / tfp['us_per_max_leapfrog']:.2f}x)"
            f"; first calls {ours['first_call_sec']:.1f} / "
            f"{tfp['first_call_sec']:.1f} s")
  return records


def define_flags():
  """The command line's flags, defined only when run as a program."""
  from absl import flags   # pylint: disable=g-import-not-at-top
  flags.DEFINE_integer("num_dims", 100, "The Gaussian's dimension.")
  flags.DEFINE_list("chains", ["8"], "Numbers of chains.")
  flags.DEFINE_float("step_size", 0.66,
                     "Step size (about where dual averaging takes it).")
  flags.DEFINE_integer("repeats", 10, "Timed transitions.")
  flags.DEFINE_integer("warmup", 3, "Untimed transitions before them.")
  flags.DEFINE_string("backend", "pc:xla", "Our kernel's backend.")
  flags.DEFINE_bool("jit_compile", True,
                    "Compile each transition whole with XLA, as the ESS "
                    "harness does.")
  flags.DEFINE_string("output", None, "JSON file for the records.")


def run_from_flags(fv):
  """Measures as the parsed flags `fv` say; returns the records."""
  records = measure(fv.num_dims, [int(c) for c in fv.chains], fv.step_size,
                    fv.repeats, fv.warmup, fv.backend, fv.jit_compile)
  if fv.output:
    nuts_vm_steps.write_results(fv.output, records=records)
  return records


if __name__ == "__main__":
  nuts_bench.run_program(define_flags, run_from_flags)
