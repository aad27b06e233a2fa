"""`NoUTurnSampler`: a drop-in `tfp.mcmc.TransitionKernel` over `nuts/tree.py`.

    kernel = nuts.NoUTurnSampler(target_log_prob_fn, step_size=0.1)
    # instead of tfp.mcmc.NoUTurnSampler(target_log_prob_fn, step_size=0.1)

Chains are the leading dimensions of the state (as many as the rank of
`target_log_prob_fn`'s result); the state is one tensor, or a list, tuple
or namedtuple of them (`one_step` returns the same structure).
The kernel flattens each chain's state parts into one [d] vector, runs the
single-chain NUTS program of `nuts/tree.py` batched over the chains by
`tfp_autobatch`, and reshapes back. The user's `target_log_prob_fn` is called
on batches of chains (the active ones) through a `@tab.batched_primitive`,
with gradients from `tf.GradientTape`.

Limitation: the chains are flattened to one batch dimension and the target is
called on subsets of them, so `target_log_prob_fn` must treat every chain
alike (broadcast over the leading dimensions), as almost every target does;
a target whose parameters differ per chain is not supported (so neither is
`tfp.mcmc.ReplicaExchangeMC`, whose tempered targets have a temperature per
replica): `bootstrap_results` calls the target on one chain and says so,
and the batched program checks every call's rows.
"""
import collections
import contextvars
import functools
import numbers

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

import tfp_autobatch as tab
from nuts import chain_states
from nuts import momentum
from nuts import shared_programs
from nuts import random as nuts_random
from nuts import sharding
from nuts import target_checks
from nuts import trajectory_draws
from nuts import tree

__all__ = ["NoUTurnSampler", "NUTSKernelResults"]

NUTSKernelResults = collections.namedtuple("NUTSKernelResults", [
    "target_log_prob",        # [chains]
    "grads_target_log_prob",  # a list, one tensor per state part (as
                              # tfp.mcmc.NoUTurnSampler's, also for a
                              # single-tensor state)
    "step_size",              # as given / as written by adaptation kernels
    "log_accept_ratio",       # [chains] log mean acceptance statistic
    "leapfrogs_taken",        # [chains] leapfrog steps (all trajectories)
    "is_accepted",            # [chains] the last trajectory moved
    "reach_max_depth",        # [chains] some trajectory hit max_tree_depth
    "has_divergence",         # [chains] some trajectory diverged
    "energy",                 # [chains] logp - |p|^2 / 2 at the sampled
                              # state: minus the Hamiltonian, the sign
                              # of tfp.mcmc.NoUTurnSampler's `energy`
                              # (bootstrap: with a momentum of ones, as
                              # there; the kinetic energy is the
                              # metric's, less its normalising constant)
    "momentum_distribution",  # the metric, as PreconditionedNoUTurnSampler
                              # carries it (`nuts/momentum.py`); adaptation
                              # kernels (DiagonalMassMatrixAdaptation)
                              # replace it, `one_step` reads it
    "seed",                   # [2] int32, the seed this step used
    # Gradient utilisation of the batched call: useful gradients (the sum of
    # leapfrogs_taken) over the gradients the batch computed, counted by the
    # backend (eagerly and inside tf.function alike; also
    # `kernel.last_run_stats` when run eagerly): the rows its batched leaf
    # calls computed on the pc backends (the chains that reach each call
    # under pc:graph and pc:eager, those gathered into a few sizes under
    # pc:xla),
    # chains x batched leaf calls, an upper bound, on the local ones.
    "num_grads_computed",     # [] int32
    "gradient_utilization",   # [] float
    # Every trajectory's draw of the step, in order, as the state's
    # structure with a leading axis of num_trajectories_per_step (the last
    # is the new state): fusion does not thin the chain. How to trace them
    # with `sample_chain` and read them in ArviZ: `nuts/trajectory_draws.py`.
    "trajectory_states",
])


def _check_positive_integer(arg, value):
  """Raises a ValueError unless `value` is a positive Python or NumPy int.
  (A float is refused: `NoUTurnSampler(f, 0.1, 10, 1000.)`, TFP's
  positional `max_energy_diff`, must not become 1000 unrolled steps.)"""
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < 1):
    hint = ""
    if (arg == "unrolled_leapfrog_steps" and isinstance(value, numbers.Real)
        and not isinstance(value, numbers.Integral)):
      hint = (" (if it is the fourth positional argument: that is "
              "max_energy_diff in tfp.mcmc.NoUTurnSampler and "
              "unrolled_leapfrog_steps here; pass max_energy_diff=... by "
              "keyword)")
    raise ValueError(f"{arg} must be a positive integer, got {value!r}"
                     + hint)


class NoUTurnSampler(tfp.mcmc.TransitionKernel):
  """The No-U-Turn Sampler, recursive and batched over chains.

  Multinomial trajectory sampling with biased progressive sampling at the top
  level and the generalized U-turn criterion, as in Stan and
  `tfp.mcmc.NoUTurnSampler`, with Stan's seam checks, which TFP's kernel
  does not make (see `nuts/tree.py`).

  Args:
    target_log_prob_fn: batch-aware log density, called as
      `target_log_prob_fn(*state_parts)` (or on the single state tensor).
    step_size: a scalar, one per state part (a list; a list of one is
      used for every part), or a tensor that broadcasts to the state parts
      from the right, as `tfp.mcmc`'s kernels take it (per chain: shape
      [chains, 1] for a vector part). Adaptation kernels overwrite it in
      the kernel results; `one_step` reads it from there.
    max_tree_depth: at most 2**max_tree_depth - 1 leapfrog steps (times
      `unrolled_leapfrog_steps`) per trajectory.
    unrolled_leapfrog_steps: leapfrog steps in each tree leaf.
    num_trajectories_per_step: NUTS trajectories per `one_step`, run inside
      one batched program (trajectory fusion): a chain that finishes a short
      trajectory starts its next one instead of waiting for the others.
    backend: a `tfp_autobatch` backend. "pc:graph"/"pc:xla" work inside
      `tf.function`; "pc:eager" and the "local:*" backends only eagerly.
    name: a name for the kernel.
    max_energy_diff: keyword only, as `tfp.mcmc.NoUTurnSampler`'s: a
      leapfrog step whose energy exceeds the trajectory's starting energy
      by more than this (or is not finite) is a divergence, which ends the
      trajectory and sets `has_divergence`.
    parallel_iterations: keyword only; accepted so that code written for
      `tfp.mcmc.NoUTurnSampler` runs unchanged. It has no effect here (it
      sets the parallelism of TFP's `tf.while_loop`s, never the samples).
    experimental_shard_axis_names: keyword only, as `tfp.mcmc`'s kernels
      take it: which state parts are split across replicas, one entry per
      part. Sharded state parts are not supported (see `nuts/sharding.py`),
      so every entry must be None; a model whose data alone are sharded
      needs no names.
    experimental_chain_axis_names: keyword only: the replica axis (one
      name, any string) that the chains are split over, when the kernel
      runs inside a `tf.distribute` strategy's `run` with C chains on each
      replica. Chain i of replica r then draws what chain r*C+i of one
      unsharded run draws with the same seed (see `nuts/sharding.py`).
    momentum_distribution: keyword only, as
      `tfp.experimental.mcmc.PreconditionedNoUTurnSampler`'s (where it is
      the third positional argument): the distribution of the momentum, a
      zero-mean Gaussian over the state's structure whose covariance is
      the mass matrix M (the velocity is M^-1 p), e.g.
      `tfd.MultivariateNormalDiag(scale_diag=1 / posterior_sd)` for one
      vector part, or a `tfd.JointDistributionSequential`/`Named` of such
      per state part; diagonal or dense, with a batch shape of the chains
      or none. None (the default) is the identity. The kernel results
      carry it (`momentum_distribution`), where
      `tfp.experimental.mcmc.DiagonalMassMatrixAdaptation` adapts it.
      A distribution known by its classes to be diagonal costs nothing
      (it becomes a step size per coordinate); any other is dense and
      costs d*d numbers per chain in the program's states (see
      `nuts/momentum.py`). A momentum distribution that is not a
      zero-mean Gaussian is refused in `bootstrap_results`.

  The positional arguments are the ones above, in that order: from the
  fourth on they differ from `tfp.mcmc.NoUTurnSampler`'s (whose fourth is
  `max_energy_diff`), so pass TFP's extra arguments by keyword.

  Kernels with the same `target_log_prob_fn` object (identity), tree
  settings (`max_tree_depth`, `unrolled_leapfrog_steps`,
  `num_trajectories_per_step`, `max_energy_diff`) and state layout run one
  batched program (`nuts/shared_programs.py`): the first step of the first of
  them converts, traces and compiles it, and a kernel built again with the
  same target (a notebook cell run again, a kernel per stage) reuses that. The
  step size, backend, name and `parallel_iterations` may differ. On
  `pc:xla` they also share the step compiled with XLA for a caller's
  graph, so a caller's `tf.function` that builds its kernel at each trace
  compiles it once. Run statistics (`last_run_stats`) stay per kernel.
  The program is freed when the kernels and the target are: the cache holds
  the target weakly. A target that cannot be weakly referenced is not
  shared, and neither is a new function object of the same code (a lambda
  made anew, the target that `tfp.mcmc.TransformedTransitionKernel` wraps
  each time it is built); a method bound to an object (`model.log_prob`,
  a new object at each look-up) is the same target for the same function
  and object.
  """

  def __init__(self, target_log_prob_fn, step_size, max_tree_depth=10,
               unrolled_leapfrog_steps=1, num_trajectories_per_step=1,
               backend="pc:xla", name=None, *,
               max_energy_diff=tree.DEFAULT_MAX_ENERGY_DIFF,
               parallel_iterations=10, experimental_shard_axis_names=None,
               experimental_chain_axis_names=None,
               momentum_distribution=None):
    if not callable(target_log_prob_fn):
      raise TypeError("NoUTurnSampler needs a callable target_log_prob_fn, "
                      f"got {target_log_prob_fn!r}")
    if isinstance(max_tree_depth, tfp.distributions.Distribution):
      raise TypeError(
          "the third positional argument is max_tree_depth, as in "
          "tfp.mcmc.NoUTurnSampler; pass momentum_distribution=... by "
          "keyword (it is the third in PreconditionedNoUTurnSampler)")
    if not (momentum_distribution is None or isinstance(
        momentum_distribution, tfp.distributions.Distribution)):
      raise TypeError("momentum_distribution must be a "
                      "tfp.distributions.Distribution or None, got "
                      f"{momentum_distribution!r}")
    for arg, value in (("max_tree_depth", max_tree_depth),
                       ("unrolled_leapfrog_steps", unrolled_leapfrog_steps),
                       ("num_trajectories_per_step",
                        num_trajectories_per_step),
                       ("parallel_iterations", parallel_iterations)):
      _check_positive_integer(arg, value)
    threshold = max_energy_diff
    if tf.is_tensor(threshold):   # a constant, as TFP takes it
      threshold = tf.get_static_value(threshold)
      threshold = (None if threshold is None or np.ndim(threshold)
                   else float(threshold))
    if (isinstance(threshold, bool)
        or not isinstance(threshold, numbers.Real) or not threshold > 0):
      raise ValueError("max_energy_diff must be a positive number (a "
                       "Python number or a constant scalar tensor), got "
                       f"{max_energy_diff!r}")
    sharding.check_state_shard_axis_names(experimental_shard_axis_names)
    chain_axis_names = sharding.canonical_axis_names(
        experimental_chain_axis_names, "experimental_chain_axis_names")
    if backend not in tab.BACKENDS:
      raise tab.UnknownBackendError(
          f"unknown backend {backend!r}; choose one of "
          f"{', '.join(tab.BACKENDS)}")
    self._parameters = dict(
        target_log_prob_fn=target_log_prob_fn, step_size=step_size,
        max_tree_depth=int(max_tree_depth),
        unrolled_leapfrog_steps=int(unrolled_leapfrog_steps),
        num_trajectories_per_step=int(num_trajectories_per_step),
        backend=backend, name=name, max_energy_diff=float(threshold),
        parallel_iterations=int(parallel_iterations),
        experimental_shard_axis_names=experimental_shard_axis_names,
        experimental_chain_axis_names=chain_axis_names or None,
        momentum_distribution=momentum_distribution)
    # layout -> (nuts_steps, logp_and_grad), shared with the kernels that
    # have this target and tree settings (`nuts/shared_programs.py`); kept here,
    # so that the program lives as long as this kernel.
    self._programs = {}
    self._gradient_labels = {}
    # The step compiled with XLA for a caller's graph, and what
    # `target_checks.check_target_compiles` checked: both shared by the
    # kernels of this target (`_shared_step`).
    self._compiled_step = None
    # Momentum distribution's type spec -> the shared compiled step for it
    # (`_shared_step`).
    self._compiled_steps = {}
    # Shared with this kernel's copies (see `copy`).
    self._last_run_stats = [None]
    # (layout, tree settings) -> the batched program that last ran a step
    # on such states, by this kernel or a copy of it with the same settings
    # (a wrapper's copy with another target; shared, as the stats are).
    self._ran_programs = {}
    # State layouts whose target was checked to compile with XLA (pc:xla).
    self._xla_checked = None

  # -- properties -------------------------------------------------------------

  @property
  def last_run_stats(self):
    """The `tab.RunStats` of the batched program's last eager `one_step`
    (None after a traced one), taken by this kernel or by a copy of it:
    wrappers such as `tfp.mcmc.TransformedTransitionKernel` run a copy
    (`copy`) with their own target."""
    return self._last_run_stats[0]

  def copy(self, **override_parameter_kwargs):
    """A kernel with some parameters replaced (as `tfp.mcmc` kernels'
    `copy`), sharing `last_run_stats` with this one."""
    copied = super().copy(**override_parameter_kwargs)
    copied._last_run_stats = self._last_run_stats   # pylint: disable=protected-access
    copied._ran_programs = self._ran_programs   # pylint: disable=protected-access
    return copied

  def experimental_with_shard_axes(self, shard_axis_names):
    """A copy with these shard axis names, as `tfp.mcmc.NoUTurnSampler`'s
    (`TransformedTransitionKernel` passes them on): sharded state parts are
    not supported, so names other than None raise NotImplementedError. (The
    base class's returned the kernel unchanged: the names were dropped
    silently.)"""
    return self.copy(experimental_shard_axis_names=shard_axis_names)

  @property
  def parameters(self):
    return self._parameters

  @property
  def target_log_prob_fn(self):
    return self._parameters["target_log_prob_fn"]

  @property
  def step_size(self):
    return self._parameters["step_size"]

  @property
  def max_tree_depth(self):
    return self._parameters["max_tree_depth"]

  @property
  def unrolled_leapfrog_steps(self):
    return self._parameters["unrolled_leapfrog_steps"]

  @property
  def num_trajectories_per_step(self):
    return self._parameters["num_trajectories_per_step"]

  @property
  def max_energy_diff(self):
    return self._parameters["max_energy_diff"]

  @property
  def parallel_iterations(self):
    return self._parameters["parallel_iterations"]

  @property
  def experimental_shard_axis_names(self):
    return self._parameters["experimental_shard_axis_names"]

  @property
  def momentum_distribution(self):
    return self._parameters["momentum_distribution"]

  @property
  def experimental_chain_axis_names(self):
    return self._parameters["experimental_chain_axis_names"]

  @property
  def backend(self):
    return self._parameters["backend"]

  @property
  def name(self):
    return self._parameters["name"]

  @property
  def is_calibrated(self):
    return True

  # -- the program ------------------------------------------------------------

  def _program(self, layout):
    """The batched NUTS program for a state layout: the one every kernel
    with this target and tree settings runs (`nuts/shared_programs.py`), kept
    here so that it lives as long as this kernel."""
    if layout not in self._programs:
      self._programs[layout] = shared_programs.nuts_program(
          self.target_log_prob_fn, layout, self._tree_settings())
    return self._programs[layout]

  def _chain_parameters(self, parts, structure, chain_ndims, check=False,
                        known=None):
    """Whether the target has parameters per chain
    (`target_checks.chain_parameters`), asked once per state structure
    and static shapes for all the kernels of this target (each asking
    traces the target once more). `check` asks again all the same, as
    `bootstrap_results` does: where the answer is known only when the
    graph runs, the asking adds that graph's assertion. `known`: the
    answer, where a call of the target gave it
    (`target_checks.start_values`): then nothing is asked."""
    def ask():
      return target_checks.chain_parameters(
          self.target_log_prob_fn, parts, structure, chain_ndims)
    answer = known
    if answer is None and check:
      answer = ask()
    shapes = tuple(None if p.shape.rank is None else tuple(p.shape.as_list())
                   for p in parts)
    return shared_programs.shared_value(
        self.target_log_prob_fn,
        ("chain parameters", structure, shapes, chain_ndims),
        lambda call: ask() if answer is None else answer)

  def _layout(self, state, kernel_results):
    """`(parts, structure, chain_ndims, layout)` of a state and the kernel
    results it is stepped with: the layout keys the batched program, with
    the metric kind of the results' momentum distribution and whether the
    target has parameters per chain."""
    parts, structure = chain_states.as_parts(state)
    chain_ndims = chain_states.check_chain_rank(kernel_results.target_log_prob)
    chain_ndims, layout = chain_states.layout(
        parts, structure, kernel_results,
        momentum.kind(kernel_results.momentum_distribution),
        self._chain_parameters(parts, structure, chain_ndims))
    return parts, structure, chain_ndims, layout

  def _gradient_blocks(self, nuts_steps, layout):
    """`{block label: batched gradient calls in the block}` of the blocks
    that call the gradient, labelled as the local runtimes label them
    ("function/label" of IR-1 blocks). Found once per state layout, after
    the program's first call. (The pc runtimes count the rows they compute
    themselves.)"""
    if layout not in self._gradient_labels:
      self._gradient_labels[layout] = nuts_steps.batched_primitive_calls()
    return self._gradient_labels[layout]

  # -- the kernel -------------------------------------------------------------

  # Autograph must not rewrite these: the batched program is converted by
  # tfp_autobatch itself (see the report on autograph + @tab.batch).
  @tf.autograph.experimental.do_not_convert
  def bootstrap_results(self, init_state):
    """The kernel results of a chain state before any step: its log
    density and gradients, the step size, and zeroed statistics.

    Args:
      init_state: the chains' state, a tensor or a list, tuple or
        namedtuple of tensors whose leading dimensions are the chains.

    Returns:
      A `NUTSKernelResults`.

    Raises:
      ValueError: a chain's log density is NaN or -inf (naming the
        chains; a graph assertion when traced, none under XLA), a step
        size is not positive or does not broadcast, or the log density
        has the wrong shape or dtype.
    """
    parts, structure = chain_states.as_parts(
        chain_states.with_static_shapes(init_state))
    # Fresh tensors: a distribution's `log_prob` of the very tensor its
    # `sample` returned reads its bijectors' cache instead of the tensor
    # (`init = dist.sample(n)`), and the gradient would be None. (The
    # batched program's gradient calls get fresh tensors anyway: the
    # state parts split from its flat vector.) A tf.function target with
    # an input_signature gives these tensors its shapes when called on
    # them, which the chain-parameter check below then reads.
    parts = [tf.identity(p) for p in parts]
    logp, grads, chain_parameters = target_checks.start_values(
        self.target_log_prob_fn, parts, structure)
    chain_states.check_log_density(logp, parts)
    chain_states.check_chain_rank(logp)
    self._chain_parameters(parts, structure, logp.shape.rank, check=True,
                           known=chain_parameters)
    logp = chain_states.check_finite_start(logp)
    step_size = self.step_size
    chain_states.check_step_size(step_size, parts, logp.shape.rank)
    zeros = tf.zeros_like(logp)
    false = tf.zeros(tf.shape(logp), tf.bool)
    if self.momentum_distribution is None:
      metric = momentum.default_distribution(parts, tf.shape(logp),
                                             logp.shape.rank)
    else:
      metric = momentum.as_carried(self.momentum_distribution,
                                   tf.shape(logp))
      momentum.check_gaussian(metric, parts, logp.shape.rank)
    return NUTSKernelResults(
        target_log_prob=logp,
        grads_target_log_prob=list(grads),
        step_size=tf.nest.map_structure(
            lambda s: tf.convert_to_tensor(s, parts[0].dtype), step_size),
        log_accept_ratio=zeros,
        leapfrogs_taken=tf.zeros(tf.shape(logp), tf.int32),
        is_accepted=false, reach_max_depth=false, has_divergence=false,
        energy=logp - 0.5 * tf.cast(tf.add_n(
            [tf.reduce_prod(tf.shape(p)[logp.shape.rank:]) for p in parts]),
            logp.dtype),
        momentum_distribution=metric,
        seed=tf.zeros([2], tf.int32),
        num_grads_computed=tf.constant(0, tf.int32),
        gradient_utilization=tf.constant(1., logp.dtype),
        trajectory_states=structure.pack(trajectory_draws.initial(
            parts, self.num_trajectories_per_step)))

  @tf.autograph.experimental.do_not_convert
  def one_step(self, current_state, previous_kernel_results, seed=None):
    """Advances every chain by `num_trajectories_per_step` NUTS
    trajectories, in one call of the batched program.

    Args:
      current_state: the chains' state, as for `bootstrap_results`.
      previous_kernel_results: the last step's (or `bootstrap_results`')
        `NUTSKernelResults`; its `step_size` is the one used, so that
        adaptation kernels can set it.
      seed: a stateless seed (anything `tfp.random.sanitize_seed` takes);
        the same seed gives the same samples.

    Returns:
      `(next_state, kernel_results)`, the state in `current_state`'s
      structure.
    """
    seed = tfp.random.sanitize_seed(seed)
    current_state = chain_states.with_static_shapes(
        current_state, previous_kernel_results.grads_target_log_prob)
    if self._step_backend() == "pc:xla":
      if self._xla_checked is None:
        self._xla_checked = shared_programs.shared_value(
            self.target_log_prob_fn, ("xla checked",), lambda call: set())
      target_checks.check_target_compiles(
          self.target_log_prob_fn,
          *self._layout(current_state, previous_kernel_results),
          self._xla_checked)
    # Read here, outside the shared compiled step, whose traces every
    # replica reuses.
    first_chain = sharding.chain_offset(
        self.experimental_chain_axis_names,
        tf.size(previous_kernel_results.target_log_prob))
    # Eagerly too, unless a tape may record the step: its state, seeds and
    # results around the batched program are then one call, not dozens of
    # eager ops, several times faster for a small model. A recorded call
    # of the XLA-compiled step would fail as TensorFlow built its gradient.
    # Nor under `tf.config.run_functions_eagerly(True)`, where it would
    # run op by op, its run counts eager values, not the tensors it
    # returns.
    if self._step_backend() == "pc:xla" and not (
        tf.executing_eagerly()
        and (tab.tape_may_record() or tf.config.functions_run_eagerly())):
      return self._shared_step(current_state, previous_kernel_results, seed,
                               first_chain)
    return self._one_step(current_state, previous_kernel_results, seed,
                          first_chain)

  def _step_backend(self):
    """The backend a step runs the batched program on: `backend`, except
    that `pc:xla` runs as `pc:graph` in a `tf.compat.v1` graph. There
    TensorFlow's graph executor lowers `sample_chain`'s nested while loops
    to TF1 frames and feeds an XLA-compiled function called inside them
    (the shared step, or the VM's own compiled call) tensors or control
    edges from the outer loop's frame, an error ("inputs from different
    frames"); `pc:graph`'s VM is plain ops of the caller's graph."""
    if (self.backend == "pc:xla"
        and not tf.compat.v1.executing_eagerly_outside_functions()):
      return "pc:graph"
    return self.backend

  def _shared_step(self, current_state, previous_kernel_results, seed,
                   first_chain):
    """`_one_step` traced into a caller's graph as one XLA computation.

    Otherwise the state's flattening, the chains' seeds and the results
    around the batched program are a few dozen small ops for the caller's
    executor, a few percent of a step on a small model
    (`python -m benchmarks.nuts_vm_steps`). The `tf.function` is one for
    all the kernels of this target and tree settings
    (`shared_programs.shared_value`), as their program is: a kernel built
    again, at each trace of the caller's function, reuses its traces and XLA's compilations. It traces the step
    of the kernel that calls it (`_STEPPING`), which builds what any of
    them would."""
    distribution = previous_kernel_results.momentum_distribution
    spec = _composite_spec(distribution)
    if spec not in self._compiled_steps:
      self._compiled_steps[spec] = shared_programs.shared_value(
          self.target_log_prob_fn,
          ("compiled step", spec) + self._tree_settings(),
          lambda call: tf.function(functools.partial(_step_of_caller, spec),
                                   jit_compile=True, autograph=False))
    self._compiled_step = self._compiled_steps[spec]
    if spec is not None:
      # The distribution enters as its tensors, rebuilt once inside, and
      # leaves as the caller's own object: passed whole, a TFP distribution
      # is rebuilt from its parts (all its constructors run) at each of
      # tf.function's placeholder, variable-conversion and output-packing
      # stages, a dozen times per trace of the step.
      previous_kernel_results = previous_kernel_results._replace(
          momentum_distribution=tf.nest.flatten(distribution,
                                                expand_composites=True))
    token = _STEPPING.set(self)
    try:
      new_state, new_results, stats_tensors = self._compiled_step(
          current_state, previous_kernel_results, seed, first_chain)
    finally:
      _STEPPING.reset(token)
    if spec is not None:
      new_results = new_results._replace(momentum_distribution=distribution)
      previous_kernel_results = previous_kernel_results._replace(
          momentum_distribution=distribution)
    # What `_one_step` records, also where another kernel's call traced it:
    # eagerly the run statistics, read from the step's counts.
    _, _, _, layout = self._layout(current_state, previous_kernel_results)
    (nuts_steps, _, _, _), _ = self._program(layout)
    stats = None
    if tf.executing_eagerly():
      stats = tab.RunStats.of_tensors(
          stats_tensors, int(tf.size(new_results.target_log_prob)))
      nuts_steps.last_stats = stats
    self._last_run_stats[0] = stats
    self._ran_programs[self._ran_key(layout)] = nuts_steps
    return new_state, new_results

  def batched_program(self, current_state, kernel_results):
    """The `@tab.batch` function that `one_step` runs on states like
    `current_state`: after a step, `.ir(level=2)` prints the NUTS program
    the VM runs (its blocks in the order the VM dispatches them), and
    after an eager `one_step`, `.last_stats` holds that call's run
    statistics (the last eager call of any kernel sharing the program,
    see the class docstring; `last_run_stats` is this kernel's). If a
    copy of this kernel ran the step (as
    `tfp.mcmc.TransformedTransitionKernel` runs one), it is the copy's
    program."""
    _, _, _, layout = self._layout(current_state, kernel_results)
    ran = self._ran_programs.get(self._ran_key(layout))
    if ran is not None:
      return ran
    (nuts_steps, _, _, _), _ = self._program(layout)
    return nuts_steps

  def _tree_settings(self):
    """The settings `tree.make_program` builds the NUTS program with, in
    its argument order."""
    return (self.max_tree_depth, self.unrolled_leapfrog_steps,
            self.num_trajectories_per_step, self.max_energy_diff)

  def _ran_key(self, layout):
    """What tells the program a copy ran apart: the state layout and the
    settings the program was built with."""
    return (layout,) + self._tree_settings()

  def _one_step(self, current_state, previous_kernel_results, seed,
                first_chain=0):
    results = previous_kernel_results
    parts, structure, chain_ndims, layout = self._layout(current_state,
                                                         results)
    event_shapes, _, metric, chain_parameters = layout
    dtype = parts[0].dtype
    chain_shape = tf.shape(results.target_log_prob)
    num_chains = tf.reduce_prod(chain_shape)
    (nuts_steps, _, _, _), _ = self._program(layout)

    sizes = [int(np.prod(s)) for s in event_shapes]

    def flat(xs):
      return tf.concat([tf.reshape(x, [num_chains, k])
                        for x, k in zip(xs, sizes)], -1)

    grads = results.grads_target_log_prob
    grads = list(grads) if isinstance(grads, (list, tuple)) else [grads]
    steps = chain_states.broadcast_step_size(results.step_size, parts,
                                             chain_ndims)
    distribution = results.momentum_distribution
    if metric is momentum.DIAGONAL:
      # The metric as a step size per coordinate (exact: sqrt(1) is 1).
      steps = [s * tf.sqrt(a) for s, a in zip(
          steps, momentum.diagonal_precision(distribution, parts))]
      q_in, grad_in, step = flat(parts), flat(grads), flat(steps)
    else:   # q = L y; the program carries L's entries after y (step 0)
      lower = momentum.dense_factor(distribution, parts, chain_ndims)
      entries = tf.reshape(lower, [num_chains, -1])
      q_in = tf.concat([tf.linalg.triangular_solve(
          lower, flat(parts)[..., tf.newaxis], lower=True)[..., 0],
                        entries], -1)
      grad_in = tf.concat([tf.linalg.matvec(lower, flat(grads),
                                            adjoint_a=True),
                           tf.zeros_like(entries)], -1)
      step = tf.concat([flat(steps), tf.zeros_like(entries)], -1)
    if chain_parameters is not None:
      # Each chain's index rides in one more coordinate, with step 0 (so
      # no momentum, and it never moves), which the program's gradient
      # reads to call the target on every chain in order
      # (`shared_programs`).
      q_in = tf.concat([q_in, shared_programs.chain_index_column(
          num_chains, dtype)], -1)
      grad_in, step = [tf.pad(x, [[0, 0], [0, 1]]) for x in (grad_in, step)]
    # Each chain's seed words (step seed, global chain index), hashed
    # once here.
    chain_keys = nuts_random.chain_key(tf.stack([
        tf.fill([num_chains], seed[0]), tf.fill([num_chains], seed[1]),
        tf.range(num_chains, dtype=tf.int32) + first_chain], axis=-1))
    try:
      out = nuts_steps(q_in, tf.reshape(results.target_log_prob,
                                        [num_chains]),
                       grad_in, step, chain_keys,
                       backend=self._step_backend())
    except tab.XlaUnsupportedError as e:
      error = target_checks.unsupported_operations_error(e)
      if error is None:
        raise
      raise error from e
    except tab.TypeInferenceError as e:
      cause = e.failure
      if not _raised_in(cause, shared_programs.call_target):
        raise
      collective = sharding.explain_collective_error(cause)
      if collective is not None:
        raise collective from cause
      # tfp_autobatch's error names our gradient call in nuts/tree.py (and,
      # for an `if`, advises a @tab.batch body); the code at fault is the
      # user's target.
      if isinstance(cause, tf.errors.OperatorNotAllowedInGraphError):
        what = ("uses a tensor as a Python bool (an `if`, `while`, "
                "`and`/`or` or `bool()` of a tensor)")
        fix = ("Use tf.where or tf.cond there, or decorate the target with "
               "@tf.function, whose AutoGraph converts such Python")
      else:
        what = "fails when traced for a batch of chains"
        fix = ("Eager-only code (`.numpy()`, NumPy functions of tensors) "
               "needs TensorFlow ops there")
      raise TypeError(
          f"target_log_prob_fn {what}: this kernel calls it in a graph, "
          "also when run eagerly, where tfp.mcmc.NoUTurnSampler calls it "
          f"eagerly. {fix}. {type(cause).__name__}: {cause}") from cause
    self._last_run_stats[0] = stats = (nuts_steps.last_stats
                                       if tf.executing_eagerly() else None)
    self._ran_programs[self._ran_key(layout)] = nuts_steps

    def unflat(x):
      return [tf.reshape(v, tf.concat([chain_shape, s], 0))
              for v, s in zip(tf.split(x, sizes, axis=-1), event_shapes)]

    def per_chain(x):
      return tf.reshape(x, chain_shape)

    out_q, out_grad = out.q, out.grad
    # [chains, k, d]; in a v1 graph its static shape can come out without
    # the trajectory dimension, which the dense metric's slicing needs.
    trajectory_q = tf.reshape(out.trajectory_q,
                              [num_chains, self.num_trajectories_per_step, -1])
    dim = sum(sizes)
    if chain_parameters is not None:   # without the chains' indices
      out_q, out_grad = out_q[:, :-1], out_grad[:, :-1]
      trajectory_q = trajectory_q[:, :, :-1]
    if metric is not momentum.DIAGONAL:
      out_q = tf.linalg.matvec(lower, out_q[:, :dim])
      trajectory_q = tf.linalg.matvec(lower[:, tf.newaxis],
                                      trajectory_q[:, :, :dim])
      out_grad = tf.linalg.triangular_solve(
          lower, out_grad[:, :dim, tf.newaxis], lower=True, adjoint=True)[
              ..., 0]
    new_parts, new_grads = unflat(out_q), unflat(out_grad)
    useful = tf.reduce_sum(out.num_leapfrogs)
    # The backend counts the gradients it computed. The pc runtimes count
    # the rows their batched gradient calls computed (a call runs on its
    # block's members gathered; under XLA into a few fixed sizes): eagerly in
    # their RunStats, traced as tensors of the caller's graph. The local
    # runtimes (eager only) call it on the gathered active chains, and
    # chains x calls is an upper bound. A target with parameters per chain
    # computes every chain at each call.
    if chain_parameters is not None and stats is None:
      members = nuts_steps.last_stats_tensors["batched_primitive_members"]
      computed = tf.cast(num_chains, tf.int32) * tf.reduce_sum(members[1:])
    elif chain_parameters is not None and (
        stats.batched_primitive_rows is not None):
      computed = tf.cast(num_chains * stats.batched_primitive_calls,
                         tf.int32)
    elif stats is None:
      computed = tf.cast(
          nuts_steps.last_stats_tensors["batched_primitive_rows"], tf.int32)
    elif stats.batched_primitive_rows is not None:
      computed = tf.constant(stats.batched_primitive_rows, tf.int32)
    else:
      counts = stats.block_executions
      computed = tf.cast(num_chains, tf.int32) * tf.add_n(
          [tf.constant(0)] + [calls * tf.cast(counts[label], tf.int32)
                              for label, calls in self._gradient_blocks(
                                  nuts_steps, layout).items()
                              if label in counts])
    new_results = NUTSKernelResults(
        target_log_prob=per_chain(out.logp),
        grads_target_log_prob=list(new_grads),
        step_size=results.step_size,
        log_accept_ratio=per_chain(out.log_accept_ratio),
        leapfrogs_taken=per_chain(out.num_leapfrogs),
        is_accepted=per_chain(out.is_accepted),
        reach_max_depth=per_chain(out.reach_max_depth),
        has_divergence=per_chain(out.divergent),
        energy=per_chain(out.energy),
        momentum_distribution=distribution,
        seed=seed,
        num_grads_computed=computed,
        gradient_utilization=tf.cast(useful, dtype) / tf.cast(
            tf.maximum(computed, 1), dtype),
        trajectory_states=structure.pack(trajectory_draws.from_flat(
            trajectory_q, self.num_trajectories_per_step, sizes, chain_shape,
            event_shapes)))
    return structure.pack(new_parts), new_results


# The kernel whose `_shared_step` runs now: its compiled step, shared by
# kernels, traces that kernel's `_one_step`.
_STEPPING = contextvars.ContextVar("nuts_stepping_kernel")


def _step_of_caller(momentum_spec, current_state, previous_kernel_results,
                    seed, first_chain):
  """The calling kernel's step, and its batched program's run counts.
  With `momentum_spec` (see `_composite_spec`) the results' momentum
  distribution comes as its flat tensors and is rebuilt here, and the new
  results leave it out (None): `_shared_step` puts the caller's back."""
  kernel = _STEPPING.get()
  if momentum_spec is not None:
    previous_kernel_results = previous_kernel_results._replace(
        momentum_distribution=tf.nest.pack_sequence_as(
            momentum_spec, previous_kernel_results.momentum_distribution,
            expand_composites=True))
  new_state, new_results = kernel._one_step(   # pylint: disable=protected-access
      current_state, previous_kernel_results, seed, first_chain)
  _, _, _, layout = kernel._layout(current_state, previous_kernel_results)   # pylint: disable=protected-access
  (nuts_steps, _, _, _), _ = kernel._program(layout)   # pylint: disable=protected-access
  if momentum_spec is not None:
    new_results = new_results._replace(momentum_distribution=None)
  return new_state, new_results, nuts_steps.last_stats_tensors


def _composite_spec(distribution):
  """The `tf.TypeSpec` of a momentum distribution that is a composite
  tensor (TFP's distributions are), by which `_shared_step` passes it as
  its tensors; None for one that is not, which is passed as it is."""
  try:
    return tf.type_spec_from_value(distribution)
  except TypeError:
    return None


def _raised_in(error, function):
  """Whether `error` was raised inside a call of `function` (its traceback
  passes through that function's code)."""
  tb = getattr(error, "__traceback__", None)
  while tb is not None:
    if tb.tb_frame.f_code is function.__code__:
      return True
    tb = tb.tb_next
  return False
