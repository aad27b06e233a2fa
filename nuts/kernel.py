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
import numbers
import re

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

import tfp_autobatch as tab
from nuts import programs
from nuts import random as nuts_random
from nuts import tree
from tfp_autobatch.ir import ir2

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
                              # there)
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
    experimental_shard_axis_names: keyword only; sharded chains are not
      supported, so only None is accepted.

  The positional arguments are the ones above, in that order: from the
  fourth on they differ from `tfp.mcmc.NoUTurnSampler`'s (whose fourth is
  `max_energy_diff`), so pass TFP's extra arguments by keyword.

  Kernels with the same `target_log_prob_fn` object (identity), tree
  settings (`max_tree_depth`, `unrolled_leapfrog_steps`,
  `num_trajectories_per_step`, `max_energy_diff`) and state layout run one
  batched program (`nuts/programs.py`): the first step of the first of them
  converts, traces and compiles it, and a kernel built again with the same
  target (a notebook cell run again, a kernel per stage) reuses that. The
  step size, backend, name and `parallel_iterations` may differ. Run
  statistics (`last_run_stats`) and the target's XLA check stay per kernel.
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
               parallel_iterations=10, experimental_shard_axis_names=None):
    if not callable(target_log_prob_fn):
      raise TypeError("NoUTurnSampler needs a callable target_log_prob_fn, "
                      f"got {target_log_prob_fn!r}")
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
    if any(n is not None
           for n in tf.nest.flatten(experimental_shard_axis_names)):
      raise NotImplementedError(
          "nuts.NoUTurnSampler does not support sharded chains "
          "(experimental_shard_axis_names); leave it None")
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
        experimental_shard_axis_names=None)
    # layout -> (nuts_steps, logp_and_grad), shared with the kernels that
    # have this target and tree settings (`nuts/programs.py`); kept here,
    # so that the program lives as long as this kernel.
    self._programs = {}
    self._gradient_labels = {}
    self._compiled_step = None
    # Shared with this kernel's copies (see `copy`).
    self._last_run_stats = [None]
    # (layout, tree settings) -> the batched program that last ran a step
    # on such states, by this kernel or a copy of it with the same settings
    # (a wrapper's copy with another target; shared, as the stats are).
    self._ran_programs = {}
    # State layouts whose target was checked to compile with XLA (pc:xla).
    self._xla_checked = set()

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
  def backend(self):
    return self._parameters["backend"]

  @property
  def name(self):
    return self._parameters["name"]

  @property
  def is_calibrated(self):
    return True

  # -- state layout -----------------------------------------------------------

  def _check_chains_alike(self, parts, is_list, chain_rank):
    """Raises if the target, given one chain, does not return one value:
    it has parameters per chain (ReplicaExchangeMC's per-replica
    temperatures, a parameter with a chain dimension), which the batched
    program, calling it on the chains still running, would hand to the
    wrong chains. Eagerly or when the shapes say so a ValueError, else a
    graph assertion (none under XLA; the batched primitive's row check
    stops XLA from compiling it then)."""
    if not chain_rank:
      return
    # With no chains (a batch of size 0, which sample_chain runs as
    # tfp.mcmc.NoUTurnSampler does) there is no chain to call it on: given
    # the empty batch, the target rightly returns no value.
    num_chains = parts[0].shape[:chain_rank].num_elements()
    if num_chains == 0:
      return
    one = [tf.reshape(p, tf.concat([[-1], tf.shape(p)[chain_rank:]], 0))[:1]
           for p in parts]
    try:
      logp_one = programs.call_target(self.target_log_prob_fn, one,
                                      is_list)
    except (TypeError, ValueError, tf.errors.InvalidArgumentError) as e:
      # E.g. a tf.function whose input_signature fixes the chain count.
      raise ValueError(
          "target_log_prob_fn failed on one chain's state (shapes "
          f"{[x.shape.as_list() for x in one]}): this kernel calls it on "
          "the chains still running, any number of them, so it must take "
          "any number of chains (a tf.function input_signature must leave "
          f"the chain dimension None). It raised: {e}") from e
    message = (
        "target_log_prob_fn must treat the chains alike, each chain's log "
        "density from its own state alone: this kernel calls it on the "
        "chains still running, any number of them, and given one chain it "
        "returned shape {} instead of [1]. A target with parameters per "
        "chain (ReplicaExchangeMC's tempered targets, a parameter with a "
        "chain dimension) needs tfp.mcmc.NoUTurnSampler")
    if logp_one.shape == [1]:
      return
    if logp_one.shape.is_fully_defined() and (num_chains is not None
                                              or logp_one.shape != [0]):
      raise ValueError(message.format(logp_one.shape.as_list()))
    tf.debugging.assert_equal(
        tf.size(logp_one),
        tf.minimum(tf.reduce_prod(tf.shape(parts[0])[:chain_rank]), 1),
        message=message.format("other"))

  def _program(self, layout):
    """The batched NUTS program for a state layout: the one every kernel
    with this target and tree settings runs (`nuts/programs.py`), kept
    here so that it lives as long as this kernel."""
    if layout not in self._programs:
      self._programs[layout] = programs.nuts_program(
          self.target_log_prob_fn, layout, self._tree_settings())
    return self._programs[layout]

  def _gradient_blocks(self, nuts_steps, layout):
    """`{block label: batched gradient calls in the block}` of the blocks
    that call the gradient, labelled as the local runtimes label them
    ("function/label" of IR-1 blocks). Found once per state layout, after
    the program's first call. (The pc runtimes count the rows they compute
    themselves.)"""
    if layout not in self._gradient_labels:
      program = nuts_steps.ir(level=1)
      calls = {f"{f.name}/{b.label}":
               sum(isinstance(op, ir2.Primitive) and op.batched
                   for op in b.ops)
               for f in program.functions for b in f.blocks}
      self._gradient_labels[layout] = {label: n for label, n in calls.items()
                                       if n}
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
    parts, is_list = _as_parts(init_state)
    # Fresh tensors: a distribution's `log_prob` of the very tensor its
    # `sample` returned reads its bijectors' cache instead of the tensor
    # (`init = dist.sample(n)`), and the gradient would be None. (The
    # batched program's gradient calls get fresh tensors anyway: the
    # state parts split from its flat vector.)
    parts = [tf.identity(p) for p in parts]
    logp, grads = programs.value_and_grads(self.target_log_prob_fn,
                                           parts, is_list)
    _check_log_density(logp, parts)
    self._check_chains_alike(parts, is_list, logp.shape.rank)
    _check_finite_start(logp)
    step_size = self.step_size
    _check_step_size(step_size, parts, logp.shape.rank)
    zeros = tf.zeros_like(logp)
    false = tf.zeros(tf.shape(logp), tf.bool)
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
        seed=tf.zeros([2], tf.int32),
        num_grads_computed=tf.constant(0, tf.int32),
        gradient_utilization=tf.constant(1., logp.dtype))

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
    if self.backend == "pc:xla":
      self._check_target_compiles(current_state, previous_kernel_results)
    if self.backend == "pc:xla" and not tf.executing_eagerly():
      # Traced into a caller's graph, the whole step is one XLA computation:
      # otherwise the state's flattening, the chains' seeds and the results
      # around the batched program are a few dozen small ops for the
      # caller's executor, 0.3 ms a step (NUTS on the 100-d Gaussian, 1 and
      # 16 chains, 3.84 -> 3.56 and 5.62 -> 5.33 ms; 2 CPU cores, A/B in
      # one process, 8 alternating rounds).
      if self._compiled_step is None:
        self._compiled_step = tf.function(self._one_step, jit_compile=True,
                                          autograph=False)
      return self._compiled_step(current_state, previous_kernel_results,
                                 seed)
    return self._one_step(current_state, previous_kernel_results, seed)

  def _check_target_compiles(self, current_state, kernel_results):
    """Raises a ValueError if XLA cannot compile the target's log density
    and gradient as pc:xla runs them. pc:xla compiles every step, the
    target with it, even in a plain tf.function or eagerly, where
    tfp.mcmc.NoUTurnSampler compiles nothing. It traces the target for
    each number of chains it calls it on (the gathered buckets, see
    `tfp_autobatch.runtime.batched_primitive_calls`), and once for any
    number when the chain count is unknown where the step is traced. Two
    kinds of target fail there: one with operations XLA lacks
    (tf.numpy_function, string ops), and, with the chain count unknown,
    one whose gradient needs, as a constant, a shape that depends on the
    number of chains (tfb.CorrelationCholesky's). Unchecked, the step
    failed with XLA's error about the VM's blocks, thousands of lines
    long. Checked once per state layout by lowering the target alone,
    traced as the VM traces it, to HLO, which is quick; other failures (a
    target that captures the caller's graph tensors cannot be lowered
    alone) are left to the step itself."""
    parts, is_list = _as_parts(current_state)
    chain_ndims, layout = _layout(parts, is_list, kernel_results)
    # One chain, or any number where the VM will not know how many.
    chains_known = parts[0].shape[:chain_ndims].is_fully_defined()
    key = (layout, parts[0].dtype, chains_known)
    if key in self._xla_checked:
      return
    def specs(rows):
      return [tf.TensorSpec([rows] + p.shape[chain_ndims:].as_list(),
                            p.dtype) for p in parts]
    as_traced = tf.function(
        lambda *xs: programs.value_and_grads(self.target_log_prob_fn,
                                             list(xs), is_list),
        input_signature=specs(1 if chains_known else None), autograph=False)
    target = tf.function(lambda *xs: as_traced(*xs), jit_compile=True,
                         autograph=False)
    try:
      # Traced here (init_scope pauses gradient tapes), lowered outside the
      # caller's graph: given specs, the lowering makes inputs with random
      # ops, which would otherwise run at every step.
      target.get_concrete_function(*specs(1))
      with tf.init_scope():
        target.experimental_get_compiler_ir(*specs(1))(stage="hlo")
    except Exception as e:  # pylint: disable=broad-except
      message = str(e)
      if "Detected unsupported operations" in message:
        ops = sorted(set(re.findall(r"(\w+) \(No registered '", message)))
        what = ("uses operations that XLA cannot compile "
                f"({', '.join(ops) or 'see the error below'})")
      elif "Reading input as constant from a dynamic tensor" in message:
        what = ("needs, for its log density or gradient, a shape that "
                "depends on the number of chains as a constant, which XLA "
                "cannot have where the number of chains is unknown when "
                "the step is traced (give your tf.function's state a "
                "static chain count)")
      else:
        self._xla_checked.add(key)
        return
      raise ValueError(
          f"target_log_prob_fn {what}. backend='pc:xla', the default, "
          "compiles every NUTS step with XLA, the target with it, even "
          "where your tf.function does not ask for jit_compile "
          "(tfp.mcmc.NoUTurnSampler does not): pass backend='pc:graph', "
          "or write the target with operations XLA has") from e
    self._xla_checked.add(key)

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
    parts, is_list = _as_parts(current_state)
    _, layout = _layout(parts, is_list, kernel_results)
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

  def _one_step(self, current_state, previous_kernel_results, seed):
    parts, is_list = _as_parts(current_state)
    results = previous_kernel_results
    chain_ndims, layout = _layout(parts, is_list, results)
    event_shapes = layout[0]
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
    step = flat(_broadcast_step_size(results.step_size, parts, chain_ndims))
    # Each chain's seed words (step seed, chain index), hashed once here.
    chain_keys = nuts_random.chain_key(tf.stack([
        tf.fill([num_chains], seed[0]), tf.fill([num_chains], seed[1]),
        tf.range(num_chains, dtype=tf.int32)], axis=-1))
    try:
      out = nuts_steps(flat(parts), tf.reshape(results.target_log_prob,
                                               [num_chains]),
                       flat(grads), step, chain_keys, backend=self.backend)
    except tab.TypeInferenceError as e:
      cause = e.__cause__
      if not _raised_in(cause, programs.call_target):
        raise
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

    new_parts, new_grads = unflat(out.q), unflat(out.grad)
    useful = tf.reduce_sum(out.num_leapfrogs)
    # The backend counts the gradients it computed. The pc runtimes count
    # the rows their batched gradient calls computed (a call runs on its
    # block's members gathered; under XLA into a few fixed sizes): eagerly in
    # their RunStats, traced as tensors of the caller's graph. The local
    # runtimes (eager only) call it on the gathered active chains, and
    # chains x calls is an upper bound.
    if stats is None:
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
        seed=seed,
        num_grads_computed=computed,
        gradient_utilization=tf.cast(useful, dtype) / tf.cast(
            tf.maximum(computed, 1), dtype))
    new_state = (tf.nest.pack_sequence_as(current_state, new_parts)
                 if is_list else new_parts[0])
    return new_state, new_results


def _raised_in(error, function):
  """Whether `error` was raised inside a call of `function` (its traceback
  passes through that function's code)."""
  tb = getattr(error, "__traceback__", None)
  while tb is not None:
    if tb.tb_frame.f_code is function.__code__:
      return True
    tb = tb.tb_next
  return False


# -- input handling -------------------------------------------------------------

def _as_parts(state):
  is_list = isinstance(state, (list, tuple))
  parts = [tf.convert_to_tensor(s) for s in (state if is_list else [state])]
  for p in parts:
    if not p.dtype.is_floating:
      raise TypeError(f"NUTS states must be floating point, got {p.dtype.name}")
  return parts, is_list


def _layout(parts, is_list, kernel_results):
  """`(chain_ndims, layout)`: the chain dimensions (the rank of the
  results' `target_log_prob`) and the state layout the NUTS program is
  built for (per-chain part shapes, list or single tensor)."""
  chain_ndims = kernel_results.target_log_prob.shape.rank
  if chain_ndims is None:
    raise ValueError("the rank of target_log_prob must be known")
  dtype = parts[0].dtype
  for p in parts:
    if p.dtype != dtype:
      raise TypeError("all state parts must share one float dtype, got "
                      f"{[q.dtype.name for q in parts]}")
  for i, p in enumerate(parts):
    if p.shape.rank is None or None in p.shape[chain_ndims:].as_list():
      raise ValueError(
          f"state part {i} has shape {p.shape}: its dimensions after the "
          f"{chain_ndims} chain dimension(s) (the per-chain event shape) "
          "must be known when the kernel is traced (the NUTS program is "
          "built for one event shape); give your tf.function's "
          "input_signature those dimensions, e.g. [None, 3]")
  event_shapes = tuple(tuple(int(d) for d in p.shape[chain_ndims:])
                       for p in parts)
  return chain_ndims, (event_shapes, is_list)


def _check_log_density(logp, parts):
  """Raises a clear error for a log density NUTS cannot use: not one value
  per chain (its shape not a prefix of every part's), or of another dtype
  than the state (the energies are computed in the state's)."""
  if logp.dtype != parts[0].dtype:
    raise TypeError(
        f"target_log_prob_fn returns {logp.dtype.name} for a "
        f"{parts[0].dtype.name} state; NUTS computes its energies in the "
        "state's dtype: cast the log density to it, or start from a "
        f"{logp.dtype.name} state")
  for i, p in enumerate(parts):
    if (logp.shape.rank is not None and p.shape.rank is not None and
        (p.shape.rank < logp.shape.rank or
         not p.shape[:logp.shape.rank].is_compatible_with(logp.shape))):
      raise ValueError(
          f"target_log_prob_fn returns shape {logp.shape} for state part "
          f"{i} of shape {p.shape}: it must return one value per chain, "
          "the state's leading (chain) dimensions, summing over each "
          "part's event dimensions (e.g. tf.reduce_sum(..., -1) without "
          "keepdims)")


def _check_finite_start(logp):
  """Raises if the initial log-probability is NaN or -inf at any chain,
  naming the chains: eagerly a ValueError; traced, a graph assertion
  (InvalidArgumentError when it runs), which XLA drops under
  `jit_compile=True`, where nothing can raise."""
  if not tf.executing_eagerly():
    if logp.shape.rank == 0:   # one chain, no chain dimension
      logp = logp[tf.newaxis]
    finite = tf.math.is_finite(logp)
    tf.debugging.Assert(
        tf.reduce_all(finite),
        ["target_log_prob_fn is not finite at the initial state of the "
         "chains with these indices; start them inside the support:",
         tf.where(~finite), "values:", tf.boolean_mask(logp, ~finite)],
        summarize=10, name="check_finite_start")
    return
  bad = ~np.isfinite(np.asarray(logp))
  if bad.any():
    chains = [tuple(int(i) for i in idx) if len(idx) != 1 else int(idx[0])
              for idx in np.argwhere(bad)]
    values = np.asarray(logp)[bad]
    raise ValueError(
        "target_log_prob_fn is not finite at the initial state of chain(s) "
        f"{chains[:10]}{' ...' if len(chains) > 10 else ''} (values "
        f"{values[:10].tolist()}); start those chains inside the support")


def _step_parts(step_size, num_parts):
  if isinstance(step_size, (list, tuple)):
    if len(step_size) == 1:   # one for every part, as tfp.mcmc's kernels
      return list(step_size) * num_parts
    if len(step_size) != num_parts:
      raise ValueError(f"got {len(step_size)} step sizes for a state of "
                       f"{num_parts} parts")
    return list(step_size)
  return [step_size] * num_parts


def _broadcast_step_size(step_size, parts, chain_ndims):
  """Step size per state part, broadcast to the part's full shape."""
  out = []
  for i, (s, p) in enumerate(zip(_step_parts(step_size, len(parts)), parts)):
    if isinstance(s, tf.Tensor) and s.dtype.is_floating and s.dtype != p.dtype:
      raise TypeError(f"step size for state part {i} has dtype "
                      f"{s.dtype.name}, the state {p.dtype.name}")
    s = tf.convert_to_tensor(s, p.dtype)
    if not _broadcastable(s.shape, p.shape):
      per_chain = (["chains"] * chain_ndims
                   + [1] * (p.shape.rank - chain_ndims))
      raise ValueError(
          f"step size of shape {s.shape} does not broadcast to state part "
          f"{i} of shape {p.shape}; use a scalar, one per part, or a shape "
          "that broadcasts to the part from the right, as tfp.mcmc's "
          f"kernels take it (per chain: [{', '.join(map(str, per_chain))}])")
    out.append(tf.broadcast_to(s, tf.shape(p)))
  return out


def _broadcastable(small, big):
  if small.rank is None or big.rank is None:
    return True
  if small.rank > big.rank:
    return False
  for a, b in zip(reversed(small.as_list()), reversed(big.as_list())):
    if a not in (1, None) and b is not None and a != b:
      return False
  return True


def _check_step_size(step_size, parts, chain_ndims):
  for s in tf.nest.flatten(step_size):
    dtype = getattr(s, "dtype", None)
    if dtype is not None and not tf.as_dtype(dtype).is_floating:
      raise TypeError(f"step size must be floating point, got {dtype}")
    value = tf.get_static_value(s)   # None when known only at run time
    if value is not None and not np.all(np.asarray(value) > 0):
      raise ValueError(f"step sizes must be positive, got {value!r}")
  _broadcast_step_size(step_size, parts, chain_ndims)
