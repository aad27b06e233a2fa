"""`windowed_adaptive_nuts`: TFP's turnkey NUTS, running our kernel.

    draws, trace = nuts.windowed_adaptive_nuts(1000, model, observed=y)
    # instead of tfp.experimental.mcmc.windowed_adaptive_nuts(...)

Same signature, defaults and return values as
`tfp.experimental.mcmc.windowed_adaptive_nuts` (TFP 0.25), plus keywords of
ours after TFP's: `backend`, `progress_bar` and `chunk_size`. Written from
its documentation and Stan's warm-up (`nuts/warmup_schedule.py`), composed
of TFP's public pieces: a pinned `JointDistribution` and its event-space
bijector (`nuts/unconstrained.py`), `init_near_unconstrained_zero` and
`retry_init` for Stan's uniform(-2, 2) starts,
`tfp.mcmc.DualAveragingStepSizeAdaptation` around `nuts.NoUTurnSampler`
with a diagonal `momentum_distribution`, and `tfp.mcmc.sample_chain`.

Steps run in chunks of `chunk_size` `sample_chain` calls. Called eagerly,
each chunk is one compiled call, so a progress bar moves between chunks
and Ctrl-C returns the draws so far (`nuts/progress.py`); inside a
`tf.function` the same chunks are traced one after another, so both modes
give the same draws for the same seed.
"""
import warnings

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from nuts import kernel as nuts_kernel
from nuts import progress
from nuts import unconstrained
from nuts import warmup_schedule
from nuts import windowed_replicas

__all__ = ["windowed_adaptive_nuts", "default_nuts_trace_fn"]

DEFAULT_CHUNK_SIZE = 25


def _innermost(results):
  """The innermost kernel results (the NUTS kernel's)."""
  while hasattr(results, "inner_results"):
    results = results.inner_results
  return results


def default_nuts_trace_fn(state, bijector, is_adapting, pkr):
  """The default trace of `windowed_adaptive_nuts`: TFP's keys
  (`step_size`, `tune`, `target_log_prob`, `diverging`, `accept_ratio`,
  `variance_scaling` (the diagonal metric, one tensor per flat part),
  `n_steps`, `is_accepted`), and `energy` (the Hamiltonian) and
  `tree_depth` (doublings of the trajectory), which ArviZ reads."""
  del state, bijector
  results = _innermost(pkr)
  step_size = results.step_size
  if isinstance(step_size, (list, tuple)) and len(step_size) == 1:
    step_size = step_size[0]
  n_steps = results.leapfrogs_taken
  momentum = getattr(results, "momentum_distribution", None)
  scaling = ([d.variance() for d in momentum.model]
             if momentum is not None else [])
  return {
      "step_size": step_size,
      "tune": is_adapting,
      "target_log_prob": results.target_log_prob,
      "diverging": results.has_divergence,
      "accept_ratio": tf.exp(tf.minimum(results.log_accept_ratio, 0.)),
      "variance_scaling": scaling,
      "n_steps": n_steps,
      "is_accepted": results.is_accepted,
      # Our kernel's `energy` is minus the Hamiltonian (TFP's sign).
      "energy": -results.energy,
      # A trajectory of depth j takes 2**(j-1) to 2**j - 1 leapfrog steps.
      "tree_depth": tf.cast(tf.math.ceil(tf.math.log(
          tf.cast(n_steps, tf.float32) + 1.) / tf.math.log(2.)), tf.int32),
  }


# The windows are a Python loop over Python ints; AutoGraph (a caller's
# `tf.function`) has nothing to convert here.
@tf.autograph.experimental.do_not_convert
def windowed_adaptive_nuts(n_draws, joint_dist, *, n_chains=64,
                           num_adaptation_steps=500, current_state=None,
                           init_step_size=None, dual_averaging_kwargs=None,
                           max_tree_depth=10, max_energy_diff=500.,
                           unrolled_leapfrog_steps=1, parallel_iterations=10,
                           trace_fn=default_nuts_trace_fn,
                           return_final_kernel_results=False,
                           discard_tuning=True, chain_axis_names=None,
                           seed=None, backend="pc:xla", progress_bar=None,
                           chunk_size=DEFAULT_CHUNK_SIZE, **pins):
  """Adapts and samples a pinned joint distribution with our NUTS kernel.

  Warm-up follows Stan (`nuts/warmup_schedule.py`): the step size by dual
  averaging in every window, a diagonal mass matrix estimated in doubling
  slow windows, chains started uniformly in (-2, 2) on the unconstrained
  scale unless `current_state` is given.

  Args:
    n_draws: draws kept after warm-up.
    joint_dist: a `tfd.JointDistribution` (possibly pinned already).
    n_chains: chains, an int or a shape (a list of ints).
    num_adaptation_steps: warm-up steps.
    current_state: optional start, shaped like
      `joint_dist.experimental_pin(**pins).sample(n_chains)`.
    init_step_size: optional first step size, a scalar or a structure like
      the state's that broadcasts with it. By default a dimension-based
      guess refined by Stan's doubling heuristic.
    dual_averaging_kwargs: keywords for
      `tfp.mcmc.DualAveragingStepSizeAdaptation` (a `num_adaptation_steps`
      in them is ignored with a warning, as TFP does); by default a
      `target_accept_prob` of 0.85 and acceptance averaged over chains by
      a harmonic mean (a chain that is stuck shrinks the step size).
    max_tree_depth, max_energy_diff, unrolled_leapfrog_steps,
      parallel_iterations: as `nuts.NoUTurnSampler`'s.
    trace_fn: `trace_fn(state, bijector, is_adapting, kernel_results)`
      where `state` is the list of flat unconstrained parts,
      `bijector.inverse(state)` the draw in the model's structure. None
      traces nothing.
    return_final_kernel_results: also return the last kernel results.
    discard_tuning: return only the `n_draws` draws after warm-up (else
      the warm-up's first).
    chain_axis_names: a name (any string) for the replica axis to split
      the chains over: call eagerly under `with strategy.scope():` of a
      `tf.distribute` strategy; `n_chains` (all chains, one int) is split
      evenly over its replicas, each step runs on every replica, and the
      step size and metric adapt over all chains, so the draws are those
      of the unsharded call (`nuts/windowed_replicas.py`). The draws hold
      every chain; with `return_final_kernel_results`, the final kernel
      results are the first local replica's.
    seed: a seed `tfp.random.sanitize_seed` takes.
    backend: ours: the `tfp_autobatch` backend of the NUTS kernel.
    progress_bar: ours: draw tqdm bars for warm-up and sampling (called
      eagerly only); None: only when stdout is a terminal.
    chunk_size: ours: steps per compiled call (the bar moves, and Ctrl-C
      is seen, between chunks).
    **pins: values of observed variables, for
      `joint_dist.experimental_pin(**pins)`.

  Returns:
    As TFP's: the draws (in the model's structure, each
    `[draws, chains..., ...]`) when `trace_fn` is None; with a `trace_fn`,
    a `tfp.mcmc.StatesAndTrace` (`all_states`, `trace`); with
    `return_final_kernel_results`, a `tfp.mcmc.CheckpointableStatesAndTrace`
    (`all_states`, `trace` (`()` without a `trace_fn`),
    `final_kernel_results`). Both unpack as tuples.
    Eagerly, a Ctrl-C returns the draws made so far with a
    `nuts.SamplingInterrupted` warning.
  """
  for arg, value in (("n_draws", n_draws),
                     ("num_adaptation_steps", num_adaptation_steps)):
    if isinstance(value, bool) or int(value) != value or value < 0:
      raise ValueError(f"{arg} must be a non-negative integer, got "
                       f"{value!r}")
  if int(chunk_size) < 1:
    raise ValueError(f"chunk_size must be positive, got {chunk_size!r}")
  model = unconstrained.UnconstrainedModel(
      unconstrained.pin(joint_dist, pins))
  # An int (a NumPy one too) or a shape, as TFP takes it.
  chain_shape = [int(n) for n in np.reshape(n_chains, [-1])]
  replica_steps = (None if chain_axis_names is None else
                   windowed_replicas.ReplicaSteps.for_call(chain_axis_names,
                                                           chain_shape))
  seed = tfp.random.sanitize_seed(seed)
  init_seed, heuristic_seed, run_seed = tfp.random.split_seed(seed, 3)
  if current_state is None:
    state = model.initial_state(chain_shape, init_seed)
  else:
    state = [tf.cast(x, model.dtype)
             for x in model.to_unconstrained(current_state)]
  if init_step_size is None:
    dims = float(sum(model.sizes))
    step_size = tf.constant(dims ** -0.25, model.dtype)
    precisions = [tf.ones([k], model.dtype) for k in model.sizes]
    step_size = warmup_schedule.reasonable_step_size(
        model.target_log_prob, state, precisions, step_size, heuristic_seed)
  else:
    step_size = _step_size_parts(init_step_size, model)
  nuts_settings = dict(
      max_tree_depth=max_tree_depth, max_energy_diff=max_energy_diff,
      unrolled_leapfrog_steps=unrolled_leapfrog_steps,
      parallel_iterations=parallel_iterations, backend=backend)
  dual_averaging = _dual_averaging(dual_averaging_kwargs)
  if replica_steps is not None:
    nuts_settings, dual_averaging = windowed_replicas.sharded_settings(
        chain_axis_names, nuts_settings, dual_averaging)
  run = _WindowedRun(model, len(chain_shape), nuts_settings, dual_averaging,
                     trace_fn, int(chunk_size), replica_steps)
  draws, trace, final_results = run(
      state, step_size, warmup_schedule.adaptation_windows(
          num_adaptation_steps), int(n_draws), discard_tuning, run_seed,
      progress.show_progress(progress_bar) and tf.executing_eagerly())
  draws = model.to_constrained(draws)
  if return_final_kernel_results:
    return tfp.mcmc.CheckpointableStatesAndTrace(
        all_states=draws, trace=() if trace_fn is None else trace,
        final_kernel_results=final_results)
  if trace_fn is None:
    return draws
  return tfp.mcmc.StatesAndTrace(all_states=draws, trace=trace)


def _dual_averaging(kwargs):
  settings = dict(target_accept_prob=0.85,
                  reduce_fn=tfp.math.reduce_log_harmonic_mean_exp)
  settings.update(kwargs or {})
  if "num_adaptation_steps" in settings:
    # TFP's function warns and goes on with its own count; so do we.
    warnings.warn("dual_averaging_kwargs['num_adaptation_steps'] is not "
                  "used: windowed_adaptive_nuts adapts the step size for "
                  "the num_adaptation_steps argument, window by window")
    del settings["num_adaptation_steps"]
  if "inner_kernel" in settings:
    raise ValueError("dual_averaging_kwargs may not set inner_kernel: "
                     "windowed_adaptive_nuts adapts its own NUTS kernel")
  return settings


def _step_size_parts(init_step_size, model):
  """A user's step size as the kernel takes it: a scalar tensor, or one
  tensor per flat part (a structure like the state's, flattened in the
  model's order; a list of as many entries as parts)."""
  if not tf.nest.is_nested(init_step_size):
    return tf.convert_to_tensor(init_step_size, model.dtype)
  try:
    tf.nest.assert_same_structure(init_step_size, model.structure,
                                  check_types=False)
    flat = tf.nest.flatten(init_step_size)
  except (ValueError, TypeError):
    flat = tf.nest.flatten(init_step_size)
  if len(flat) != model.num_parts:
    raise ValueError(
        f"init_step_size has {len(flat)} parts; the model has "
        f"{model.num_parts} free variables: give a scalar, or one step "
        "size per free variable in the model's structure")
  return [tf.convert_to_tensor(s, model.dtype) for s in flat]


class _WindowedRun:
  """The windows of one call, run chunk by chunk."""

  def __init__(self, model, chain_ndims, nuts_settings, dual_averaging,
               trace_fn, chunk_size, replica_steps=None):
    self.model = model
    self.replica_steps = replica_steps
    self.chain_ndims = chain_ndims
    self.nuts_settings = nuts_settings
    self.dual_averaging = dual_averaging
    self.trace_fn = trace_fn
    self.chunk_size = chunk_size
    self._compiled = {}

  def _kernel(self, step_size, precisions, state, num_adaptation_steps):
    sampler = nuts_kernel.NoUTurnSampler(
        self.model.target_log_prob, step_size,
        momentum_distribution=warmup_schedule.momentum_distribution(
            precisions, state), **self.nuts_settings)
    return tfp.mcmc.DualAveragingStepSizeAdaptation(
        sampler, num_adaptation_steps=num_adaptation_steps,
        **self.dual_averaging)

  def _bootstrap(self, state, step_size, precisions, num_adaptation_steps):
    kernel = self._kernel(step_size, precisions, state, num_adaptation_steps)
    return kernel.bootstrap_results(state)

  def _chunk(self, num_steps, state, results, precisions,
             num_adaptation_steps, is_adapting, seed):
    step_size = _innermost(results).step_size
    kernel = self._kernel(step_size, precisions, state, num_adaptation_steps)
    model = self.model
    user_trace = self.trace_fn

    def trace(s, r):
      return (s, () if user_trace is None
              else user_trace(s, model.bijector, is_adapting, r))
    out = tfp.mcmc.sample_chain(
        num_steps, state, previous_kernel_results=results, kernel=kernel,
        trace_fn=trace, return_final_kernel_results=True, seed=seed)
    states, user = out.trace
    return states, user, out.final_kernel_results

  def _call(self, name, *args):
    """Runs `_bootstrap` or `_chunk`; eagerly as one compiled call, traced
    once for every chunk length (the length is a tensor there)."""
    if self.replica_steps is not None:
      return self.replica_steps.call(self, name, *args)
    fn = getattr(self, name)
    if not tf.executing_eagerly():
      return fn(*args)
    if name not in self._compiled:
      self._compiled[name] = tf.function(fn, autograph=False)
    if name == "_chunk":
      args = (tf.constant(args[0], tf.int32),) + args[1:]
    return self._compiled[name](*args)

  def __call__(self, state, step_size, windows, n_draws, discard_tuning,
               seed, show_bar):
    phases = [(w.length, w.estimates_metric, True) for w in windows]
    phases.append((n_draws, False, False))
    seeds = tfp.random.split_seed(seed, len(phases) + 1)
    dtype = self.model.dtype
    precisions = [tf.ones([k], dtype) for k in self.model.sizes]
    kept_states, kept_traces = [], []
    results = None
    bars = progress.PhaseProgress(show_bar, {
        "warm-up": sum(w.length for w in windows), "sampling": n_draws})
    phase_name, done = "warm-up", 0
    try:
      for i, (length, estimates_metric, adapting) in enumerate(phases):
        phase_name = "warm-up" if adapting else "sampling"
        bars.start(phase_name)
        if length == 0:
          continue
        if not adapting:
          done = 0
        window_seed, heuristic_seed = tfp.random.split_seed(seeds[i], 2)
        if i > 0 and phases[i - 1][1]:
          # A new metric: find the step size again for it (Stan does).
          step_size = warmup_schedule.reasonable_step_size(
              self.model.target_log_prob, state, precisions, step_size,
              heuristic_seed)
        num_adapt = tf.constant(length if adapting else 0, tf.int32)
        results = self._call("_bootstrap", state, step_size, precisions,
                             num_adapt)
        window_states = []
        chunks = progress.chunk_lengths(length, self.chunk_size)
        for n, chunk_seed in zip(chunks, tfp.random.split_seed(
            window_seed, len(chunks))):
          states, trace, results = self._call(
              "_chunk", n, state, results, precisions, num_adapt,
              tf.constant(adapting), chunk_seed)
          state = [s[-1] for s in states]
          window_states.append(states)
          if not (adapting and discard_tuning):
            kept_states.append(states)
            kept_traces.append(trace)
          done += n
          bars.advance(n, **_postfix(results))
        if adapting:
          step_size = tf.nest.pack_sequence_as(
              step_size, [tf.exp(s) for s in results.log_averaging_step])
        if estimates_metric:
          precisions = [
              1. / warmup_schedule.regularized_variance(
                  tf.concat([c[j] for c in window_states], 0),
                  self.chain_ndims)
              for j in range(self.model.num_parts)]
    except KeyboardInterrupt:
      if not tf.executing_eagerly() or results is None:
        raise
      total = (sum(p[0] for p in phases[:-1]) if phase_name == "warm-up"
               else n_draws)
      progress.warn_interrupted(phase_name, done, total)
    finally:
      bars.close()
    return self._assemble(kept_states, kept_traces, results, state)

  def _assemble(self, kept_states, kept_traces, results, state):
    if kept_states:
      draws = [tf.concat([c[j] for c in kept_states], 0)
               for j in range(self.model.num_parts)]
      trace = tf.nest.map_structure(lambda *xs: tf.concat(xs, 0),
                                    *kept_traces)
    else:   # stopped before any kept draw
      draws = [tf.zeros(tf.concat([[0], tf.shape(s)], 0), s.dtype)
               for s in state]
      trace = None
    return draws, trace, results


def _postfix(results):
  """What the bar shows after a chunk (eagerly): the step size and the
  divergences of the chunk's last step."""
  if not tf.executing_eagerly():
    return {}
  inner = _innermost(results)
  step = tf.nest.flatten(inner.step_size)[0]
  return {"step size": f"{float(tf.reduce_mean(step)):.3g}",
          "divergent": int(tf.reduce_sum(tf.cast(inner.has_divergence,
                                                 tf.int32)))}
