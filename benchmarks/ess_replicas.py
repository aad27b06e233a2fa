"""The ESS benchmark's run with the chains split over the replicas of a
`tf.distribute.MirroredStrategy` (`python -m benchmarks.ess --replicas=N`).

`ess_harness.run`'s phases and `RunResult`, run as a sharded user runs
them: `nuts.NoUTurnSampler(experimental_chain_axis_names=...)` under
`tfp.mcmc.DualAveragingStepSizeAdaptation` whose acceptance statistic is
reduced over every replica's chains, stepped by `nuts.replicas.sample_chain`
(one `strategy.run` per step; TensorFlow's mirrored strategies cannot
all-reduce inside `sample_chain`'s loop, so this harness cannot compile
whole calls of `steps_per_call` steps as `ess_harness` does). Each replica
holds `chains / N` chains; our kernel on the backend `system` compiles its
own step.

1. first call: `bootstrap_results` and `steps_per_call` steps, the first
   call of each compiled function; then the same steps again
   (`repeat_s`).
2. warm-up: `num_warmup` steps from the start, adapting the step size.
3. sampling: `num_draws` steps, kept.
"""
import functools
import time

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from benchmarks import ess_harness
import nuts
from nuts import replicas

AXIS = "chains"


def set_logical_cpus(count):
  """Splits the CPU into `count` logical devices; before any tensor."""
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * count)


def mirrored_strategy(count):
  """A MirroredStrategy over the first `count` logical CPU devices."""
  cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
  if len(cpus) < count:
    raise ValueError(f"{count} replicas need {count} logical CPU devices, "
                     f"found {len(cpus)}: call set_logical_cpus first")
  return tf.distribute.MirroredStrategy(cpus[:count])


def run(system, model, init, strategy, *, num_warmup, num_draws,
        steps_per_call, seed=0, round_index=0, max_tree_depth=10,
        num_trajectories_per_step=1, target_accept_prob=0.8):
  """Runs our backend `system` on `model` from `init` [chains, d], the
  chains split over `strategy`'s replicas; an `ess_harness.RunResult`."""
  if system == ess_harness.TFP:
    raise ValueError(
        "--replicas shards our kernel's chains; tfp.mcmc.NoUTurnSampler "
        "would draw the same randomness on every replica. Leave 'tfp' out "
        "of --systems")
  if num_trajectories_per_step != 1:
    raise ValueError("--replicas runs one trajectory per step: leave "
                     "--num_trajectories_per_step at 1")
  num_chains = init.shape[0]
  count = strategy.num_replicas_in_sync
  if num_chains % count:
    raise ValueError(f"{num_chains} chains cannot be split evenly over "
                     f"{count} replicas: give --chains in multiples of "
                     "--replicas")
  local = num_chains // count

  def target(z):   # a new object per run: nothing shared between runs
    return model.target_log_prob(z)

  kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
      nuts.NoUTurnSampler(target, model.step_size,
                          max_tree_depth=max_tree_depth, backend=system,
                          experimental_chain_axis_names=AXIS),
      num_adaptation_steps=num_warmup, target_accept_prob=target_accept_prob,
      experimental_reduce_chain_axis_names=AXIS,
      # TensorFlow has no cross-replica max, which logmeanexp needs.
      reduce_fn=functools.partial(tfp.math.reduce_logmeanexp,
                                  experimental_allow_all_gather=True))

  def trace(_, results):
    inner = results.inner_results
    return inner.leapfrogs_taken, inner.has_divergence

  def local_init(context):
    first = context.replica_id_in_sync_group * local
    return tf.constant(init[first:first + local])

  def seed_of(call):
    return tf.constant([seed * 1009 + round_index, call], tf.int32)

  def timed(*args, **kwargs):
    began = time.perf_counter()
    out = replicas.sample_chain(strategy, *args, trace_fn=trace, **kwargs)
    out.states.numpy()
    return out, time.perf_counter() - began

  _, first_call_s = timed(steps_per_call, local_init, kernel, seed_of(0))
  _, repeat_s = timed(steps_per_call, local_init, kernel, seed_of(0))
  warm, warmup_s = timed(num_warmup, local_init, kernel, seed_of(1))
  kept, sampling_s = timed(
      num_draws, warm.final_state, kernel, seed_of(2),
      previous_kernel_results=warm.final_kernel_results)
  step_size = strategy.experimental_local_results(
      kept.final_kernel_results.new_step_size)[0]
  return ess_harness.RunResult(
      first_call_s, repeat_s, warmup_s, sampling_s,
      kept.states.numpy().swapaxes(0, 1), kept.trace[0].numpy(),
      kept.trace[1].numpy(), float(np.mean(step_size)))
