"""The samplers the NUTS benchmark (`benchmarks/nuts.py`) times, behind one
small interface.

Each system is a class built from `(problem, settings, init)` whose
`step(i)` runs MCMC step `i` for its chains (the first call also traces,
converts and compiles) and returns a `StepOutcome`; `run_steps(first, n)`
runs `steps_per_call` steps in one call (one compiled `tf.while_loop` for
the kernels when `settings.steps_per_call` > 1) and returns their outcomes:

- ours (`pc:xla`, `pc:graph`, `local:eager`, `local:eager_xla`):
  `nuts.NoUTurnSampler` with that backend; the pc backends' `one_step` runs
  inside `tf.function` (as `tfp.mcmc.sample_chain` is normally used) unless
  `settings.trace_kernel` is false (then eagerly, the batched program still
  compiled);
- `unbatched`: the same single-chain program (`nuts.tree.make_program`) run
  with `run_unbatched`, i.e. plain Python and eager TF, one chain after the
  other (the paper's Eager baseline); only the first `unbatched_cap` chains
  are run;
- `tfp_reference`: `tfp.experimental.mcmc.NoUTurnSampler` (TFP's own
  autobatched NUTS) in `tf.function(jit_compile=True)`;
- `tfp_iterative`: `tfp.mcmc.NoUTurnSampler` in `tf.function(jit_compile=True)`;
- `limit`: a raw batched leapfrog loop in `tf.function(jit_compile=True)`:
  the most gradients per second the hardware gives at that batch size;
- `limit_logp`: the same loop keeping the log density of every leapfrog
  too, as NUTS needs it (XLA drops it from `limit`): the most a NUTS
  kernel can reach.

Stan is different (one chain per process, warm-up and sampling in one call):
`nuts_stan.Stan` has `run(num_results, num_warmup)` instead of `step`.
"""
import collections
import functools

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

import nuts
import tfp_autobatch as tab
from nuts import tree

OUR_BACKENDS = ("pc:xla", "pc:graph", "local:eager", "local:eager_xla")
TRACEABLE = ("pc:xla", "pc:graph")
LIMITS = ("limit", "limit_logp")
PEERS = ("unbatched", "tfp_reference", "tfp_iterative", "stan") + LIMITS
SYSTEMS = OUR_BACKENDS + PEERS
# Systems that run several trajectories per step (trajectory fusion); the
# others are measured at num_trajectories_per_step = 1 only.
FUSING = OUR_BACKENDS + ("unbatched", "tfp_reference")

Settings = collections.namedtuple("Settings", [
    "step_size", "max_tree_depth", "unrolled_leapfrog_steps",
    "num_trajectories_per_step", "seed",
    "trace_kernel",       # run our pc backends' one_step in tf.function
    "unbatched_cap",      # chains `unbatched` runs
    "limit_leapfrogs",    # leapfrog steps per `limit` call
    "steps_per_call",     # MCMC steps per compiled call (`run_steps`)
], defaults=(1,))

StepOutcome = collections.namedtuple("StepOutcome", [
    "state",            # [chains run, d] float32 NumPy
    "grads_used",       # gradients the chains' trajectories used
    "grads_computed",   # gradients the batch computed
    "accept_stat",      # [chains run] mean acceptance statistic, or None
])

COMPUTED_ESTIMATE_NOTE = (
    "gradients computed estimated as chains x the longest chain's "
    "leapfrogs in each step (chains in lockstep)")


class SkipSystem(Exception):
  """A system cannot run here (not installed, unknown); the message says why."""


def _seed(settings, i):
  """Step `i`'s stateless seed (`i` an int or a scalar tensor). For an int
  it is one constant: every eager op a timed step runs outside the kernel
  is timed with it (the three ops of a stack took 60-130 us more than one
  constant on this machine)."""
  if isinstance(i, int):
    return tf.constant([settings.seed, i], tf.int32)
  return tf.stack([tf.constant(settings.seed, tf.int32),
                   tf.cast(i, tf.int32)])


def value_and_gradient(target_log_prob, q):
  """(log density, its gradient) of a batch of states [n, d]."""
  with tf.GradientTape() as tape:
    tape.watch(q)
    logp = target_log_prob(q)
  return logp, tape.gradient(logp, q)


class _Stepper:
  """A system's steps one Python call at a time: `run_steps` loops `step`.
  `steps_per_call` is how many MCMC steps one of its calls runs."""
  steps_per_call = 1

  def run_steps(self, first, n):
    """Steps `first` .. `first + n - 1`, a `StepOutcome` each."""
    return [self.step(i) for i in range(first, first + n)]


class _KernelChains(_Stepper):
  """Chains advanced by a `tfp.mcmc` kernel's `one_step`, bootstrapped from
  `init` on the first step.

  `step(i)` calls `one_step` once from Python (through `_one_step`, a
  `tf.function` or the bare method).  With `settings.steps_per_call` = n >
  1, `run_steps` runs n steps inside one compiled `tf.function` instead (a
  `tf.while_loop` around `one_step`, as `tfp.mcmc.sample_chain` runs it),
  with XLA when `_chain_jit_compile`: the per-call cost of entering a
  function from Python is paid once per n steps, as a `sample_chain` user
  pays it.  Both give the same steps with the same seeds.

  Subclasses set `kernel`, `_one_step`, `_init`, `_settings` and `_carry =
  None`, and define `_observe(results)` (a tuple of tensors to keep from
  each step's kernel results) and `_outcome(state, observed)` (the
  `StepOutcome` from NumPy values of a step's state and observations);
  `_seed_args(i)` gives the keyword arguments of `one_step` for step `i`
  (an int or a scalar tensor).
  """
  _chain_jit_compile = True
  _run_chain = None     # the compiled chain of steps, built on first use

  def _seed_args(self, i):
    return {"seed": _seed(self._settings, i)}

  def _start(self):
    if self._carry is None:
      state = tf.constant(self._init)
      self._carry = state, self.kernel.bootstrap_results(state)
    return self._carry

  @property
  def steps_per_call(self):
    return self._settings.steps_per_call

  def step(self, i):
    state, results = self._one_step(*self._start(), **self._seed_args(i))
    self._carry = state, results
    return self._outcome(state.numpy(),
                         [t.numpy() for t in self._observe(results)])

  def run_steps(self, first, n):
    if self.steps_per_call == 1:
      return super().run_steps(first, n)
    if n != self.steps_per_call:
      raise ValueError(f"this stepper runs {self.steps_per_call} steps per "
                       f"call; asked for {n}")
    if self._run_chain is None:
      self._run_chain = self._chain_function(n)
    state, results, states, observed = self._run_chain(
        *self._start(), tf.constant(first, tf.int32))
    self._carry = state, results
    states = states.numpy()
    observed = [t.numpy() for t in observed]
    return [self._outcome(states[k], [o[k] for o in observed])
            for k in range(n)]

  def _chain_function(self, n):
    """`(state, results, first) -> (state, results, states, observed)`:
    steps `first` .. `first + n - 1` in one compiled call, stacking each
    step's state and observations."""

    def run(state, results, first):
      kept = [tf.TensorArray(state.dtype, size=n)] + [
          tf.TensorArray(t.dtype, size=n) for t in self._observe(results)]

      def body(k, state, results, kept):
        state, results = self.kernel.one_step(
            state, results, **self._seed_args(first + k))
        values = (state,) + tuple(self._observe(results))
        return (k + 1, state, results,
                [ta.write(k, v) for ta, v in zip(kept, values)])

      _, state, results, kept = tf.while_loop(
          lambda k, *_: k < n, body, (tf.constant(0), state, results, kept))
      stacked = [ta.stack() for ta in kept]
      return state, results, stacked[0], stacked[1:]

    return tf.function(run, jit_compile=self._chain_jit_compile)


class Ours(_KernelChains):
  """`nuts.NoUTurnSampler` on one of our backends."""

  def __init__(self, problem, settings, init, backend):
    if backend not in tab.BACKENDS:
      raise SkipSystem(f"backend {backend!r} is not in tfp_autobatch.BACKENDS "
                       f"{list(tab.BACKENDS)}")
    # A target of its own (a new partial), so that `first_call_sec` counts
    # conversion and compilation from scratch at every size and for every
    # system: kernels with one target object share their program
    # (nuts/shared_programs.py), and a later size would skip the conversion.
    self.kernel = nuts.NoUTurnSampler(
        functools.partial(problem.target_log_prob), settings.step_size,
        max_tree_depth=settings.max_tree_depth,
        unrolled_leapfrog_steps=settings.unrolled_leapfrog_steps,
        num_trajectories_per_step=settings.num_trajectories_per_step,
        backend=backend)
    self.traced = backend in TRACEABLE and settings.trace_kernel
    # On pc:xla a step, or a chain of steps, is compiled whole with XLA, as
    # the peers' are. (The VM compiles with XLA on its own, but a plain
    # tf.function around it is a graph that calls the compiled VM: one call
    # inside another, 0.1-0.5 ms more a step at one chain in an in-process
    # A/B on 2026-11-26.)
    self._chain_jit_compile = backend == "pc:xla"
    self._one_step = (tf.function(self.kernel.one_step,
                                  jit_compile=self._chain_jit_compile)
                      if self.traced else self.kernel.one_step)
    self._settings = settings
    self._init = init
    self._carry = None
    self.chains_run = len(init)
    # The kernel counts the gradients its batch computed (the backend's
    # batched leaf calls), eagerly and inside tf.function alike.
    self.computed_is_estimate = False

  @property
  def steps_per_call(self):
    # The local backends run eagerly: one step per call.
    return self._settings.steps_per_call if self.traced else 1

  @staticmethod
  def _observe(results):
    # Summed in NumPy by `_outcome`, as the peers' counts are: an eager
    # reduce_sum here cost 0.35 ms a step that only this system paid.
    return (results.leapfrogs_taken, results.num_grads_computed,
            results.log_accept_ratio)

  @staticmethod
  def _outcome(state, observed):
    leapfrogs, computed, log_accept_ratio = observed
    return StepOutcome(state, int(leapfrogs.sum()), int(computed),
                       np.exp(np.minimum(log_accept_ratio, 0.)))


class Unbatched(_Stepper):
  """Our single-chain NUTS program, run per chain with no batching."""

  def __init__(self, problem, settings, init):

    @tab.batched_primitive
    def logp_and_grad(q):
      return value_and_gradient(problem.target_log_prob, q)

    self._nuts_steps = tree.make_program(
        logp_and_grad, settings.max_tree_depth,
        settings.unrolled_leapfrog_steps,
        settings.num_trajectories_per_step)[0]
    self._settings = settings
    self.chains_run = min(len(init), settings.unbatched_cap)
    q = tf.constant(init[:self.chains_run])
    logp, grad = value_and_gradient(problem.target_log_prob, q)
    self._chains = [(q[c], logp[c], grad[c]) for c in range(self.chains_run)]
    self._step = tf.fill(q.shape[1:], tf.constant(settings.step_size,
                                                  q.dtype))
    self.computed_is_estimate = False

  def step(self, i):
    used, accept, new = 0, [], []
    for c, (q, logp, grad) in enumerate(self._chains):
      seed = tf.constant([self._settings.seed, i, c], tf.int32)
      out = self._nuts_steps.run_unbatched(q, logp, grad, self._step, seed)
      new.append((out.q, out.logp, out.grad))
      used += int(out.num_leapfrogs)
      accept.append(float(np.exp(min(float(out.log_accept_ratio), 0.))))
    self._chains = new
    # One chain at a time: every gradient computed is used.
    return StepOutcome(np.stack([q.numpy() for q, _, _ in new]), used, used,
                       np.array(accept))


class TfpReference(_KernelChains):
  """`tfp.experimental.mcmc.NoUTurnSampler` (TFP's autobatched NUTS), XLA.

  It takes its seed at construction and none per step, and its kernel
  results carry running totals `leapfrogs_taken` and `leapfrogs_computed`
  per chain (no acceptance statistic): a step's counts are differences.
  """

  def __init__(self, problem, settings, init):
    self.kernel = tfp.experimental.mcmc.NoUTurnSampler(
        problem.target_log_prob, settings.step_size,
        max_tree_depth=settings.max_tree_depth,
        unrolled_leapfrog_steps=settings.unrolled_leapfrog_steps,
        num_trajectories_per_step=settings.num_trajectories_per_step,
        seed=settings.seed)
    self._one_step = tf.function(self.kernel.one_step, jit_compile=True)
    self._settings = settings
    self._init = init
    self._carry = None
    self._totals = (0, 0)
    self.chains_run = len(init)
    self.computed_is_estimate = False   # TFP's own count

  @staticmethod
  def _seed_args(i):
    del i  # seeded at construction
    return {}

  @staticmethod
  def _observe(results):
    return (tf.reduce_sum(results.leapfrogs_taken),
            tf.reduce_sum(results.leapfrogs_computed))

  def _outcome(self, state, observed):
    totals = tuple(int(t) for t in observed)
    used, computed = (t - s for t, s in zip(totals, self._totals))
    self._totals = totals
    return StepOutcome(state, used, computed, None)


class TfpIterative(_KernelChains):
  """`tfp.mcmc.NoUTurnSampler` (iterative, chains in lockstep), XLA."""

  def __init__(self, problem, settings, init):
    self.kernel = tfp.mcmc.NoUTurnSampler(
        problem.target_log_prob, settings.step_size,
        max_tree_depth=settings.max_tree_depth,
        unrolled_leapfrog_steps=settings.unrolled_leapfrog_steps)
    self._one_step = tf.function(self.kernel.one_step, jit_compile=True)
    self._settings = settings
    self._init = init
    self._carry = None
    self.chains_run = len(init)
    # Not observable: chains run in lockstep, so the batch computes
    # chains x the longest chain's leapfrogs.
    self.computed_is_estimate = True

  @staticmethod
  def _observe(results):
    return results.leapfrogs_taken, results.log_accept_ratio

  @staticmethod
  def _outcome(state, observed):
    leapfrogs, log_accept_ratio = observed
    return StepOutcome(state, int(leapfrogs.sum()),
                       int(leapfrogs.max()) * len(leapfrogs),
                       np.exp(np.minimum(log_accept_ratio, 0.)))


class Limit(_Stepper):
  """`limit_leapfrogs` batched leapfrog steps per call, nothing else; with
  `keep_log_prob`, the log density of every leapfrog is summed and
  returned, so that XLA computes it (otherwise it drops it as unused)."""

  def __init__(self, problem, settings, init, keep_log_prob=False):
    n = settings.limit_leapfrogs
    eps = settings.step_size

    @tf.function(jit_compile=True)
    def leapfrogs(q, grad, seed):
      p = tf.random.stateless_normal(tf.shape(q), seed, dtype=q.dtype)

      def body(k, q, p, grad, total):
        p = p + 0.5 * eps * grad
        q = q + eps * p
        logp, grad = value_and_gradient(problem.target_log_prob, q)
        if keep_log_prob:
          total += logp
        return k + 1, q, p + 0.5 * eps * grad, grad, total

      _, q, _, grad, total = tf.while_loop(
          lambda k, *_: k < n, body,
          (tf.constant(0), q, p, grad, tf.zeros(tf.shape(q)[:1], q.dtype)))
      return q, grad, total

    self._leapfrogs = leapfrogs
    self._settings = settings
    q = tf.constant(init)
    self._carry = q, value_and_gradient(problem.target_log_prob, q)[1]
    self.chains_run = len(init)
    self.computed_is_estimate = False

  def step(self, i):
    q, grad, _ = self._leapfrogs(*self._carry, _seed(self._settings, i))
    self._carry = q, grad
    grads = self.chains_run * self._settings.limit_leapfrogs
    return StepOutcome(self._carry[0].numpy(), grads, grads, None)


def make_stepper(system, problem, settings, init):
  """The `step(i)` object of `system` for chains starting at `init`."""
  if system in OUR_BACKENDS:
    return Ours(problem, settings, init, system)
  makers = {"unbatched": Unbatched, "tfp_reference": TfpReference,
            "tfp_iterative": TfpIterative, "limit": Limit,
            "limit_logp": functools.partial(Limit, keep_log_prob=True)}
  if system not in makers:
    raise ValueError(f"unknown system {system!r}; systems: {list(SYSTEMS)}")
  return makers[system](problem, settings, init)
