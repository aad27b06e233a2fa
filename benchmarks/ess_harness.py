"""One harness for every kernel of the ESS benchmark, as a TFP user runs one.

`tfp.mcmc.sample_chain` with `tfp.mcmc.DualAveragingStepSizeAdaptation`
around the kernel, inside `tf.function(jit_compile=True)`, from the same
starts and seeds for every system. The chain advances in calls of
`steps_per_call` steps of one compiled function (so that the warm-up and
the sampling run the same compiled code, and the compilation is timed
once, apart):

1. first call: `bootstrap_results` and one call of `steps_per_call` steps,
   each a first call of its `tf.function` (AutoGraph conversion, tracing,
   our program's conversion, XLA compilation, and the steps); then the same
   call again (`repeat_s`, the steps alone), whose difference from the
   first is the compile time; both results are discarded.
2. warm-up: `num_warmup` steps from the start, adapting the step size
   (dual averaging for all of them; the averaged step size from then on).
3. sampling: `num_draws` steps, whose states are kept (with
   `num_trajectories_per_step` = k > 1, all k draws of each step, from
   `trajectory_states`), with the leapfrogs and divergences of each step.

A fused step (k > 1) is k trajectories, so a fused run takes k times the
warm-up and sampling trajectories of an unfused one with the same steps;
its ESS/s counts all of its draws over its sampling seconds.

Each run builds its own target closure and functions, so no run reuses
another's traces or compilations (our kernel shares programs by target
identity; TensorFlow by function).
"""
import collections
import time

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

import nuts

TFP = "tfp"   # tfp.mcmc.NoUTurnSampler; any other system is our backend

RunResult = collections.namedtuple("RunResult", [
    "first_call_s",   # bootstrap + first call of steps_per_call steps
    "repeat_s",       # the same call again (no compilation)
    "warmup_s", "sampling_s",
    "draws",          # [chains, draws (x k), d] float32, unconstrained
    "leapfrogs",      # [num_draws, chains] leapfrogs per step (all k)
    "divergences",    # [num_draws, chains] bool
    "step_size",      # the adapted step size
])


def make_kernel(system, target, step_size, max_tree_depth,
                num_trajectories_per_step):
  """The NUTS kernel of `system`: TFP's, or ours on the backend `system`."""
  if system == TFP:
    if num_trajectories_per_step != 1:
      raise ValueError("tfp.mcmc.NoUTurnSampler runs one trajectory per "
                       "step; num_trajectories_per_step applies to ours")
    return tfp.mcmc.NoUTurnSampler(target, step_size,
                                   max_tree_depth=max_tree_depth)
  return nuts.NoUTurnSampler(
      target, step_size, max_tree_depth=max_tree_depth,
      num_trajectories_per_step=num_trajectories_per_step, backend=system)


def compiled_calls(kernel, steps_per_call, trace_fn):
  """The harness's two XLA-compiled functions: `start(state)`, the
  kernel's bootstrap results, and `advance(state, results, seed)`,
  `steps_per_call` steps of `sample_chain` giving (all states, trace,
  final kernel results)."""

  @tf.function(jit_compile=True)
  def start(state):
    return kernel.bootstrap_results(state)

  @tf.function(jit_compile=True)
  def advance(state, results, seed):
    out = tfp.mcmc.sample_chain(
        steps_per_call, state, previous_kernel_results=results,
        kernel=kernel, seed=seed, trace_fn=trace_fn,
        return_final_kernel_results=True)
    return out.all_states, out.trace, out.final_kernel_results

  return start, advance


def _seed(seed, round_index, call):
  return tf.constant([seed * 1009 + round_index, call], tf.int32)


def run(system, model, init, *, num_warmup, num_draws, steps_per_call,
        seed=0, round_index=0, max_tree_depth=10,
        num_trajectories_per_step=1, target_accept_prob=0.8):
  """Runs `system` on `model` from `init` [chains, d]; a `RunResult`."""
  for what, n in (("num_warmup", num_warmup), ("num_draws", num_draws)):
    if n % steps_per_call:
      raise ValueError(f"steps_per_call={steps_per_call} must divide "
                       f"{what}={n}: the chain advances in whole calls of "
                       "one compiled function")
  fused = num_trajectories_per_step > 1

  def target(z):   # a new object per run: nothing shared between runs
    return model.target_log_prob(z)

  kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
      make_kernel(system, target, model.step_size, max_tree_depth,
                  num_trajectories_per_step),
      num_adaptation_steps=num_warmup,
      target_accept_prob=target_accept_prob)

  def trace(_, results):
    inner = results.inner_results
    return (inner.trajectory_states if fused else (),
            inner.leapfrogs_taken, inner.has_divergence)

  start, advance = compiled_calls(kernel, steps_per_call, trace)
  init = tf.constant(init)
  began = time.perf_counter()
  results = start(init)
  probe = advance(init, results, _seed(seed, round_index, 0))
  tf.nest.map_structure(lambda t: t.numpy(), probe, expand_composites=True)
  first_call_s = time.perf_counter() - began
  began = time.perf_counter()
  probe = advance(init, results, _seed(seed, round_index, 0))
  tf.nest.map_structure(lambda t: t.numpy(), probe, expand_composites=True)
  repeat_s = time.perf_counter() - began

  def advance_calls(state, results, first, count, keep):
    kept = []
    for call in range(first, first + count):
      states, traced, results = advance(state, results,
                                        _seed(seed, round_index, call))
      state = states[-1]
      if keep:
        kept.append((states, traced))
    state.numpy()
    return state, results, kept

  began = time.perf_counter()
  state, results, _ = advance_calls(init, start(init), 0,
                                    num_warmup // steps_per_call, False)
  warmup_s = time.perf_counter() - began
  began = time.perf_counter()
  _, results, kept = advance_calls(state, results,
                                   num_warmup // steps_per_call,
                                   num_draws // steps_per_call, True)
  sampling_s = time.perf_counter() - began

  if fused:   # [n, k, chains, d] -> [chains, n * k, d]
    draws = np.concatenate([t[0].numpy() for _, t in kept])
    draws = draws.reshape((-1,) + draws.shape[2:]).swapaxes(0, 1)
  else:       # [n, chains, d] -> [chains, n, d]
    draws = np.concatenate([s.numpy() for s, _ in kept]).swapaxes(0, 1)
  return RunResult(
      first_call_s, repeat_s, warmup_s, sampling_s, draws,
      np.concatenate([t[1].numpy() for _, t in kept]),
      np.concatenate([t[2].numpy() for _, t in kept]),
      float(np.mean(results.new_step_size)))
