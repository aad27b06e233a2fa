"""Kernels with the same target, tree settings and state layout share one
batched NUTS program (`nuts/shared_programs.py`); the cache frees it with the
target. Deterministic (fixed seeds): false-failure rate 0."""
import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import nuts
from nuts import shared_programs
from tfp_autobatch import pipeline

tfd = tfp.distributions

INIT = np.random.RandomState(2).randn(3, 2)


def make_target(scale=1.):
  """A 2-d Gaussian log density that captures its data, as a model does."""
  data = tf.constant([0.5, -1.], tf.float64)
  def target(x):
    return -0.5 * tf.reduce_sum(((x - data) / scale) ** 2, -1)
  return target, data


def step(kernel, seed=(1, 2)):
  """One eager step from INIT: (state, results, the program it ran)."""
  init = tf.constant(INIT)
  start = kernel.bootstrap_results(init)
  state, results = kernel.one_step(init, start, seed=list(seed))
  return state, results, kernel.batched_program(init, start)


def programs_of(*kernels):
  init = tf.constant(INIT)
  return [k.batched_program(init, k.bootstrap_results(init)) for k in kernels]


def test_a_second_kernel_with_the_same_target_runs_the_first_ones_program():
  target, _ = make_target()
  first = nuts.NoUTurnSampler(target, 0.5, max_tree_depth=2,
                              backend="pc:graph")
  state, results, program = step(first)
  runtime = pipeline.runtime(program, program._last_types, "pc:graph")  # pylint: disable=protected-access
  assert runtime.trace_count == 1
  stats = first.last_run_stats
  # A new kernel object, as a re-run notebook cell or a driver that builds
  # a kernel per stage makes: it runs the traced VM, tracing nothing.
  second = nuts.NoUTurnSampler(target, 0.5, max_tree_depth=2,
                               backend="pc:graph")
  again, again_results, again_program = step(second)
  assert again_program is program
  assert runtime.trace_count == 1
  np.testing.assert_array_equal(again, state)
  np.testing.assert_array_equal(again_results.leapfrogs_taken,
                                results.leapfrogs_taken)
  # Run statistics stay per kernel: each reports its own step.
  assert first.last_run_stats is stats
  assert second.last_run_stats is not stats
  assert second.last_run_stats.batch_size == len(INIT)
  assert (second.last_run_stats.batched_primitive_rows
          == stats.batched_primitive_rows)


def test_other_settings_targets_or_layouts_get_programs_of_their_own():
  target, _ = make_target()
  other_target, _ = make_target()
  kernel = nuts.NoUTurnSampler(target, 0.5, max_tree_depth=2)
  same, *others = programs_of(
      # The step size, backend, name and parallel_iterations are not the
      # program's: these share it.
      nuts.NoUTurnSampler(target, 0.2, max_tree_depth=2, backend="pc:graph",
                          name="other", parallel_iterations=3),
      nuts.NoUTurnSampler(target, 0.5, max_tree_depth=3),
      nuts.NoUTurnSampler(target, 0.5, max_tree_depth=2,
                          unrolled_leapfrog_steps=2),
      nuts.NoUTurnSampler(target, 0.5, max_tree_depth=2,
                          num_trajectories_per_step=2),
      nuts.NoUTurnSampler(target, 0.5, max_tree_depth=2, max_energy_diff=9.),
      nuts.NoUTurnSampler(other_target, 0.5, max_tree_depth=2))
  (program,) = programs_of(kernel)
  assert same is program
  assert len({id(p) for p in [program] + others}) == 1 + len(others)
  # Another state layout: a list of one part.
  init = [tf.constant(INIT)]
  assert kernel.batched_program(init, kernel.bootstrap_results(init)) is not (
      program)


class _SlotsTarget:
  """A callable that cannot be weakly referenced: never shared."""
  __slots__ = ()

  def __call__(self, x):
    return -0.5 * tf.reduce_sum(x * x, -1)


def test_a_target_that_cannot_be_weakly_referenced_is_not_shared():
  target = _SlotsTarget()
  with pytest.raises(TypeError):
    weakref.ref(target)
  a, b = programs_of(nuts.NoUTurnSampler(target, 0.5, max_tree_depth=2),
                     nuts.NoUTurnSampler(target, 0.5, max_tree_depth=2))
  assert a is not b


def test_the_program_is_freed_with_its_kernels_and_target():
  target, data = make_target()
  kernel = nuts.NoUTurnSampler(target, 0.5, max_tree_depth=2,
                               backend="pc:graph")
  program = step(kernel)[2]
  # The program holds its traced VM, which captures the target's data.
  program_ref = weakref.ref(program)
  target_ref, data_ref = weakref.ref(target), weakref.ref(data)
  logp_and_grad = next(iter(kernel._programs.values()))[1]  # pylint: disable=protected-access
  del program, data
  # With the kernel dropped and the target kept, the cache keeps the
  # program for the next kernel (a notebook cell run again).
  del kernel
  gc.collect()
  assert program_ref() is not None
  (again,) = programs_of(nuts.NoUTurnSampler(target, 0.5, max_tree_depth=2))
  assert again is program_ref()
  del again
  # Dropping the target too frees it, and the data the target captured.
  del target
  gc.collect()
  assert target_ref() is None
  assert data_ref() is None
  assert program_ref() is None
  assert not any(s.target_ref() is None for s in shared_programs._SHARED.values())  # pylint: disable=protected-access
  # A program's gradient kept apart from its kernels and target says so.
  with pytest.raises(RuntimeError, match="target_log_prob_fn of this NUTS "
                     "program was freed"):
    logp_and_grad(tf.zeros([1, 2], tf.float64))


class _Model:
  """A model whose log density is a plain method: `model.log_prob` is a
  new bound-method object at each look-up."""

  def __init__(self):
    self.data = tf.constant([0.5, -1.], tf.float64)

  def log_prob(self, x):
    return -0.5 * tf.reduce_sum((x - self.data) ** 2, -1)

  def other_log_prob(self, x):
    return -0.5 * tf.reduce_sum(x ** 2, -1)


def test_a_method_looked_up_again_on_its_object_shares_the_program():
  model, other_model = _Model(), _Model()
  first = nuts.NoUTurnSampler(model.log_prob, 0.5, max_tree_depth=2,
                              backend="pc:graph")
  state, _, program = step(first)
  second = nuts.NoUTurnSampler(model.log_prob, 0.5, max_tree_depth=2,
                               backend="pc:graph")
  assert model.log_prob is not model.log_prob
  again, _, again_program = step(second)
  assert again_program is program
  np.testing.assert_array_equal(again, state)
  # Another object, or another method of the same object, is another
  # target.
  others = programs_of(
      nuts.NoUTurnSampler(other_model.log_prob, 0.5, max_tree_depth=2,
                          backend="pc:graph"),
      nuts.NoUTurnSampler(model.other_log_prob, 0.5, max_tree_depth=2,
                          backend="pc:graph"))
  assert len({id(p) for p in [program] + others}) == 3
  # The cache holds the object weakly: dropping the kernels and the model
  # frees the model, its data and the program.
  model_ref, data_ref = weakref.ref(model), weakref.ref(model.data)
  program_ref = weakref.ref(program)
  del first, second, program, again_program, model
  gc.collect()
  assert model_ref() is None and data_ref() is None
  assert program_ref() is None


def test_kernels_built_at_each_trace_share_the_compiled_step():
  # A caller's tf.function that builds its kernel when traced builds a new
  # one at each trace; on pc:xla their steps, compiled by XLA, are one
  # tf.function, traced and compiled once for both.
  target, data = make_target()
  init = tf.constant(INIT)
  kernels = []

  def run(state, seed):
    kernel = nuts.NoUTurnSampler(target, 0.5, max_tree_depth=2)
    kernels.append(kernel)
    return kernel.one_step(state, kernel.bootstrap_results(state),
                           seed=seed)[0]

  first = tf.function(run)(init, tf.constant([1, 2]))
  again = tf.function(run)(init, tf.constant([1, 2]))
  np.testing.assert_array_equal(again, first)
  a, b = kernels
  assert a._compiled_step is b._compiled_step   # pylint: disable=protected-access
  assert a._compiled_step.experimental_get_tracing_count() == 1  # pylint: disable=protected-access
  # Each kernel still knows the program it ran, and has no eager stats.
  assert a.batched_program(init, a.bootstrap_results(init)) is (
      b.batched_program(init, b.bootstrap_results(init)))
  assert b.last_run_stats is None
  # Freed with the kernels and the target, as the program is.
  step_ref = weakref.ref(a._compiled_step)   # pylint: disable=protected-access
  target_ref, data_ref = weakref.ref(target), weakref.ref(data)
  del kernels[:], a, b, target, data
  gc.collect()
  assert target_ref() is None and data_ref() is None
  assert step_ref() is None


def test_an_eager_pc_xla_step_runs_the_compiled_step_with_its_statistics():
  # Eagerly, pc:xla steps through the step compiled with XLA (one call,
  # not dozens of eager ops around the batched program) and reads its run
  # statistics from the step's counts; under a tape it steps op by op
  # (a recorded call of the compiled step would fail). Both give the same
  # samples and statistics.
  target, _ = make_target()
  init = tf.constant(INIT)
  kernel = nuts.NoUTurnSampler(target, 0.5, max_tree_depth=3)
  start = kernel.bootstrap_results(init)
  state, results = kernel.one_step(init, start, seed=[1, 2])
  kernel.one_step(init, start, seed=[3, 4])
  assert kernel._compiled_step.experimental_get_tracing_count() == 1  # pylint: disable=protected-access
  state, results = kernel.one_step(init, start, seed=[1, 2])
  compiled_stats = kernel.last_run_stats
  assert kernel.batched_program(init, start).last_stats is compiled_stats
  with tf.GradientTape():
    taped_state, taped_results = kernel.one_step(init, start, seed=[1, 2])
  assert kernel._compiled_step.experimental_get_tracing_count() == 1  # pylint: disable=protected-access
  np.testing.assert_allclose(taped_state, state, rtol=1e-12)
  np.testing.assert_array_equal(taped_results.num_grads_computed,
                                results.num_grads_computed)
  assert kernel.last_run_stats == compiled_stats
  assert compiled_stats.steps > 0 and compiled_stats.batch_size == len(INIT)


def test_the_compiled_step_takes_the_momentum_distribution_as_its_tensors():
  # pc:xla's compiled step takes the results' momentum distribution as its
  # tensors and returns the caller's own object, instead of a TFP
  # distribution rebuilt (every constructor run again) at each stage of
  # tf.function's argument and result handling. A metric of another
  # structure gets its own compiled step; the samples are those of the
  # step run op by op (under a tape).
  target, _ = make_target()
  init = tf.constant(INIT)
  kernel = nuts.NoUTurnSampler(target, 0.5, max_tree_depth=3)
  start = kernel.bootstrap_results(init)
  _, results = kernel.one_step(init, start, seed=[1, 2])
  assert results.momentum_distribution is start.momentum_distribution
  metric = tfd.MultivariateNormalDiag(
      scale_diag=tf.constant([2., 0.5], tf.float64))
  scaled = nuts.NoUTurnSampler(target, 0.5, max_tree_depth=3,
                               momentum_distribution=metric)
  scaled_start = scaled.bootstrap_results(init)
  state, results = scaled.one_step(init, scaled_start, seed=[1, 2])
  assert results.momentum_distribution is scaled_start.momentum_distribution
  assert scaled._compiled_step is not kernel._compiled_step  # pylint: disable=protected-access
  with tf.GradientTape():
    taped, _ = scaled.one_step(init, scaled_start, seed=[1, 2])
  np.testing.assert_allclose(state, taped, rtol=1e-12)
  traced, traced_results = tf.function(scaled.one_step)(
      init, scaled_start, seed=tf.constant([1, 2]))
  np.testing.assert_allclose(traced, state, rtol=1e-12)
  np.testing.assert_allclose(
      traced_results.momentum_distribution.log_prob([init]),
      scaled_start.momentum_distribution.log_prob([init]), rtol=1e-12)
