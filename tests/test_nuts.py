"""Exactness, drop-in and error tests of the recursive NUTS kernel (`nuts/`).

Exactness tests are deterministic (fixed seeds, float64) and compare to
floating-point tolerance: false-failure rate 0. The random-generator tests are
statistical with fixed seeds; each states its false-failure rate.
"""
import collections
import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import nuts
import tfp_autobatch as tab
from tfp_autobatch import pipeline
from nuts import random as nuts_random
from nuts import reference_numpy
from tfp_autobatch.ir import ir2

tfb = tfp.bijectors
tfd = tfp.distributions

A = np.array([[2., 0.5, 0.], [0.5, 1., 0.2], [0., 0.2, 0.5]])   # precision


def gaussian_log_prob(x):
  return -0.5 * tf.einsum("...i,ij,...j->...", x, tf.constant(A, x.dtype), x)


def numpy_logp_and_grad(q):
  return -0.5 * q @ A @ q, -A @ q


EAGER = "local:eager"


def ks_passes(samples, cdf, alpha):
  """Kolmogorov-Smirnov: False with probability ~alpha under the null."""
  x = np.sort(samples)
  n = len(x)
  f = cdf(x)
  d = max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n))
  return d < np.sqrt(-np.log(alpha / 2) / 2) / np.sqrt(n)


def normal_cdf(x):
  return 0.5 * (1 + tf.math.erf(x / np.sqrt(2.)).numpy())
INIT = np.random.RandomState(1).randn(4, 3)


@pytest.fixture(scope="module")
def fused_kernel():
  """One kernel (one program conversion) shared by the exactness tests."""
  return nuts.NoUTurnSampler(gaussian_log_prob, 0.4, max_tree_depth=5,
                             num_trajectories_per_step=2, backend=EAGER)


@pytest.fixture(scope="module")
def fused_step(fused_kernel):
  state = tf.constant(INIT)
  results = fused_kernel.bootstrap_results(state)
  return fused_kernel.one_step(state, results, seed=[3, 4])


# -- the random generator ----------------------------------------------------

def test_uniforms_are_uniform_and_independent():
  # KS test at level 1e-6 on 100k draws: false-failure rate 1e-6 (and the
  # seed is fixed, so the outcome is deterministic).
  u = nuts_random.uniform(tf.constant([5, 6, 7]),
                          [tf.range(100000), tf.constant(9)]).numpy()
  assert np.all((u > 0) & (u < 1))
  assert ks_passes(u, lambda x: x, 1e-6)
  # Neighbouring counters are uncorrelated: |r| < 5 sigma (rate ~6e-7).
  assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 5 / np.sqrt(len(u))
  # Neighbouring seeds are independent streams.
  v = nuts_random.uniform(tf.constant([5, 6, 8]),
                          [tf.range(100000), tf.constant(9)]).numpy()
  assert abs(np.corrcoef(u, v)[0, 1]) < 5 / np.sqrt(len(u))


def test_normals_are_normal():
  # KS at level 1e-6 and the first four moments within 5 standard errors:
  # false-failure rate < 1e-5.
  z = nuts_random.normal(tf.constant([1, 2, 3]), [7], 100000).numpy()
  assert ks_passes(z, normal_cdf, 1e-6)
  n = len(z)
  assert abs(z.mean()) < 5 / np.sqrt(n)
  assert abs(z.var() - 1) < 5 * np.sqrt(2 / n)
  assert abs((z ** 3).mean()) < 5 * np.sqrt(15 / n)
  assert abs((z ** 4).mean() - 3) < 5 * np.sqrt(96 / n)


def test_float32_normals_are_the_float64_draws_in_float32_math():
  """A float32 draw is the float64 draw to float32 precision, computed
  without float64 transcendental ops (slow on CPUs, slower on
  accelerators)."""
  seed, words = tf.constant([4, 5, 6]), [tf.constant(7)]
  z64 = nuts_random.normal(seed, words, 10000).numpy()
  z32 = nuts_random.normal(seed, words, 10000, tf.float32).numpy()
  assert z32.dtype == np.float32
  np.testing.assert_allclose(z32, z64, rtol=1e-4, atol=1e-5)
  graph = tf.function(lambda: nuts_random.normal(
      seed, words, 3, tf.float32)).get_concrete_function().graph
  math_ops = [op for op in graph.get_operations()
              if op.type in ("Log", "Cos", "Sqrt")]
  assert len(math_ops) == 3
  assert all(op.get_attr("T") == tf.float32 for op in math_ops)


def test_a_chain_key_draws_what_its_seed_words_draw():
  """The kernel hashes each chain's seed words once per step: the draws
  must be the same bits as from the words (so the NumPy reference, which
  hashes the words, still matches), under XLA too."""
  seeds = tf.constant([[5, 6, 7], [-1, 2**31 - 1, -2**31], [0, 0, 3]],
                      tf.int32)
  words = [tf.constant(4), tf.range(1000), tf.constant(-9)]
  keys = nuts_random.chain_key(seeds)
  assert keys.shape == [3] and keys.dtype == tf.int32
  for jit_compile in (False, True):
    draw = tf.function(lambda s: nuts_random.uniform(s, words),
                       jit_compile=jit_compile)
    for c in range(3):
      np.testing.assert_array_equal(draw(keys[c]), draw(seeds[c]))
  np.testing.assert_array_equal(
      nuts_random.normal(keys[0], [7], 5), nuts_random.normal(seeds[0], [7], 5))


def test_constant_words_are_hashed_in_python_to_the_same_bits():
  """A key's Python-int words (NUTS's draw kinds) are mixed in Python: the
  same draws as the words as tensors, with none of their integer ops in
  the graph."""
  seeds = tf.constant([[5, 6, 7], [-1, 2**31 - 1, -2**31]], tf.int32)
  constant_words = [4, -3, 2**32 - 1]
  tensor_words = [tf.constant(w, tf.int64) for w in constant_words]
  for seed in (seeds[1], nuts_random.chain_key(seeds)[1]):
    np.testing.assert_array_equal(
        nuts_random.uniform(seed, constant_words + [tf.range(5)]),
        nuts_random.uniform(seed, tensor_words + [tf.range(5)]))
  # Every word a Python int: the hash is all Python's (the reference's
  # uniform is its hash, plus a half, over 2**32, exactly in float64).
  assert nuts_random.hash_words([1, 2, -3]).numpy() == (
      reference_numpy.uniform([1, 2], [-3]) * 2**32 - 0.5)
  def integer_ops(words):
    graph = tf.function(lambda: nuts_random.uniform(
        seeds[0], words)).get_concrete_function().graph
    return sum(op.type in ("BitwiseXor", "RightShift", "Mul")
               for op in graph.get_operations())
  assert integer_ops(constant_words + [tf.constant(1)]) < integer_ops(
      tensor_words + [tf.constant(1)]) - 3 * 5


def test_random_is_stateless_vectorises_and_matches_numpy():
  seeds = tf.constant(np.arange(12).reshape(4, 3).astype(np.int32))
  draw = lambda s: nuts_random.normal(s, [tf.constant(3), tf.constant(-5)], 5)
  batched = tf.vectorized_map(draw, seeds, fallback_to_while_loop=False)
  one_by_one = tf.stack([draw(s) for s in seeds])
  np.testing.assert_allclose(batched, one_by_one, rtol=1e-14)  # vector cos
  np.testing.assert_array_equal(draw(seeds[1]), draw(seeds[1]))
  np.testing.assert_allclose(
      batched[2], reference_numpy.normal([6, 7, 8], [3, -5], 5), rtol=1e-12)


# -- exactness ---------------------------------------------------------------

def test_kernel_matches_numpy_reference(fused_step):
  """Each chain of the batched kernel == the NumPy single-chain reference
  given the same random draws (two fused trajectories per step)."""
  state, results = fused_step
  seed = np.asarray(results.seed)
  sampler = reference_numpy.Sampler(numpy_logp_and_grad, max_tree_depth=5)
  for c in range(len(INIT)):
    q, logp, grad, stats = sampler.steps(INIT[c], np.full(3, 0.4),
                                         [seed[0], seed[1], c], 2)
    np.testing.assert_allclose(state[c], q, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(results.target_log_prob[c], logp, rtol=1e-10)
    np.testing.assert_allclose(results.grads_target_log_prob[0][c], grad,
                               rtol=1e-10, atol=1e-12)
    assert results.leapfrogs_taken[c] == sum(s["num_leapfrogs"] for s in stats)
    np.testing.assert_allclose(
        results.log_accept_ratio[c],
        np.log(np.mean([s["accept"] for s in stats])), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(results.energy[c], stats[-1]["energy"],
                               rtol=1e-10)
    assert bool(results.is_accepted[c]) == stats[-1]["is_accepted"]


def test_batched_matches_unbatched_python(fused_kernel, fused_step):
  """The batched program == the same Python run on one chain at a time."""
  state, results = fused_step
  program = fused_kernel.batched_program(tf.constant(INIT), results)
  seed = np.asarray(results.seed)
  for c in range(len(INIT)):
    q = tf.constant(INIT[c])
    logp = gaussian_log_prob(q)
    out = program.run_unbatched(
        q, logp, tf.linalg.matvec(-tf.constant(A), q),
        tf.constant(np.full(3, 0.4)),
        tf.constant([seed[0], seed[1], c], tf.int32))
    np.testing.assert_allclose(state[c], out.q, rtol=1e-10, atol=1e-12)
    assert results.leapfrogs_taken[c] == out.num_leapfrogs


def test_same_seed_same_samples_and_seed_matters(fused_kernel, fused_step):
  state, _ = fused_step
  init = tf.constant(INIT)
  results = fused_kernel.bootstrap_results(init)
  again, _ = fused_kernel.one_step(init, results, seed=[3, 4])
  other, _ = fused_kernel.one_step(init, results, seed=[3, 5])
  np.testing.assert_array_equal(state, again)
  assert not np.allclose(state, other)


@pytest.mark.slow
@pytest.mark.parametrize("backend", [b for b in tab.BACKENDS if b != EAGER])
def test_every_backend_gives_the_same_samples(fused_step, backend):
  state, results = fused_step
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, 0.4, max_tree_depth=5,
                               num_trajectories_per_step=2, backend=backend)
  init = tf.constant(INIT)
  step = lambda: kernel.one_step(init, kernel.bootstrap_results(init),
                                 seed=[3, 4])
  if backend.startswith("pc:") and backend != "pc:eager":
    step = tf.function(step)
  other_state, other_results = step()
  np.testing.assert_allclose(other_state, state, rtol=1e-9, atol=1e-12)
  np.testing.assert_array_equal(other_results.leapfrogs_taken,
                                results.leapfrogs_taken)
  # Gradients computed are the backend's own count of the rows its batched
  # gradient calls computed, traced or not. pc:eager and pc:graph compute
  # exactly the chains that reach a call (build_tree's base case calls the
  # gradient once, then a second time guarded: for a two-leaf subtree
  # whose first leaf was valid for some chain). pc:xla computes all 4 rows
  # of a call with members (no buckets at 4 chains), at least one per
  # member. Before the eager and graph modes gathered, they
  # computed all 4 rows of every call: `most` below.
  computed = int(other_results.num_grads_computed)
  assert computed >= int(np.sum(results.leapfrogs_taken))
  if backend.startswith("pc:"):
    eager_kernel = kernel.copy(backend="pc:eager")
    eager_start = eager_kernel.bootstrap_results(init)
    _, eager_results = eager_kernel.one_step(init, eager_start, seed=[3, 4])
    executions = eager_kernel.last_run_stats.block_executions
    # The program one_step ran, and the statistics of its run.
    program = eager_kernel.batched_program(init, eager_start)
    assert program.last_stats is eager_kernel.last_run_stats
    calls = {b.label: [isinstance(op, ir2.Guarded) for op in b.ops
                       if getattr(ir2.unguarded(op), "batched", False)]
             for b in program.ir(level=2).blocks}
    calls = {label: guarded for label, guarded in calls.items() if guarded}
    assert sorted(map(sorted, calls.values())) == [[False, True]]
    most = 4 * sum(executions.get(label, 0) * len(guarded)
                   for label, guarded in calls.items())
    members = int(eager_results.num_grads_computed)
    assert int(np.sum(results.leapfrogs_taken)) <= members < most
    if backend == "pc:xla":
      assert members <= computed < most
    else:
      assert computed == members


def _after_first_half(program):
  """The label of `build_tree`'s block after its first recursive call: the
  continuation of the `else` block's call (that block's label with
  ".1")."""
  return next(b.label for b in program.blocks
              if re.fullmatch(r"build_tree/else\d+\.1", b.label))


def test_build_tree_saves_and_copies_only_what_its_recursion_changes(fused_kernel):
  """`build_tree` passes its step size, starting energy, seed and
  trajectory numbers on unchanged to both recursive calls: no call moves
  or saves them (a [d] step size pushed and popped around every first
  half cost the 64-chain Gaussian about 5% of a transition)."""
  init = tf.constant(INIT)
  start = fused_kernel.bootstrap_results(init)
  fused_kernel.one_step(init, start, seed=[3, 4])
  program = fused_kernel.batched_program(init, start).ir(level=2)
  assert sorted(program.stacked) == [
      "build_tree.depth", "build_tree.first", "build_tree.start"]
  moved_in_build_tree = {
      out for b in program.blocks if b.label.startswith("build_tree/")
      for op in map(ir2.unguarded, b.ops) if isinstance(op, ir2.Move)
      for out in op.outs}
  assert not moved_in_build_tree & {"build_tree.eps", "build_tree.h0",
                                    "build_tree.seed", "build_tree.traj",
                                    "build_tree.doubling"}
  assert "build_tree.depth" in moved_in_build_tree
  # Returning an invalid first half writes nothing: it is what the
  # recursive call returned, already in the result register
  # (`passes/redundant_copies.py`).
  after_first_half = next(b for b in program.blocks
                          if b.label == _after_first_half(program))
  assert not [op for op in after_first_half.ops
              if "build_tree._result" in ir2.writes(op)]


def test_pc_xla_with_the_number_of_chains_unknown(fused_step):
  """In a caller's tf.function whose number of chains is unknown at trace
  time, pc:xla runs the VM's trace for any batch size (it traces one per
  static size otherwise: `PcVmRuntime.compiled_for`), with the same
  samples."""
  state, results = fused_step
  # A target of its own: with gaussian_log_prob, the kernel would share the
  # program (and its traces) of another test's kernel with these settings.
  kernel = nuts.NoUTurnSampler(lambda x: gaussian_log_prob(x), 0.4,  # pylint: disable=unnecessary-lambda
                               max_tree_depth=5, num_trajectories_per_step=2,
                               backend="pc:xla")
  @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float64)])
  def step(init):
    return kernel.one_step(init, kernel.bootstrap_results(init), seed=[3, 4])
  other_state, other_results = step(tf.constant(INIT))
  np.testing.assert_allclose(other_state, state, rtol=1e-9, atol=1e-12)
  np.testing.assert_array_equal(other_results.leapfrogs_taken,
                                results.leapfrogs_taken)
  (program, _, _, _), _ = next(iter(kernel._programs.values()))  # pylint: disable=protected-access
  runtime = pipeline.runtime(program, program._last_types, "pc:xla")  # pylint: disable=protected-access
  assert list(runtime._compiled) == [(None, False)]  # pylint: disable=protected-access


# -- drop-in compatibility ----------------------------------------------------

def test_results_have_the_fields_of_tfp_nuts(fused_step):
  _, results = fused_step
  tfp_kernel = tfp.mcmc.NoUTurnSampler(gaussian_log_prob, 0.4)
  tfp_results = tfp_kernel.bootstrap_results(tf.constant(INIT))
  assert set(tfp_results._fields) <= set(results._fields)
  # Each shared field has the structure, dtype and shape of TFP's (the
  # gradients are a list even for a single-tensor state: code written for
  # TFP reads `grads_target_log_prob[0]`).
  for field in tfp_results._fields:
    ours, theirs = getattr(results, field), getattr(tfp_results, field)
    tf.nest.assert_same_structure(ours, theirs)
    for a, b in zip(tf.nest.flatten(ours), tf.nest.flatten(theirs)):
      assert (a.dtype, a.shape) == (b.dtype, b.shape), field
  assert results.leapfrogs_taken.shape == (4,)
  assert 0 < float(results.gradient_utilization) <= 1


def test_parameters_copy_and_calibration(fused_kernel):
  assert fused_kernel.is_calibrated
  params = fused_kernel.parameters
  assert set(params) == {"target_log_prob_fn", "step_size", "max_tree_depth",
                         "unrolled_leapfrog_steps",
                         "num_trajectories_per_step", "backend", "name",
                         "max_energy_diff", "parallel_iterations",
                         "experimental_shard_axis_names",
                         "experimental_chain_axis_names",
                         "momentum_distribution"}
  copy = fused_kernel.copy(max_tree_depth=3)
  assert copy.max_tree_depth == 3
  assert copy.num_trajectories_per_step == 2
  assert copy.backend == EAGER


def test_local_backend_says_so_when_traced(fused_kernel):
  init = tf.constant(INIT)
  results = fused_kernel.bootstrap_results(init)
  with pytest.raises(tab.AutobatchError, match="eagerly"):
    tf.function(lambda: fused_kernel.one_step(init, results, seed=[1, 2]))()


def test_a_target_xla_cannot_compile_on_pc_xla_is_a_clear_error():
  # pc:xla (the default) compiles each step, the target with it, even in a
  # plain tf.function, where tfp.mcmc.NoUTurnSampler runs such a target.
  # The step failed with XLA's error about the VM's blocks; it now names
  # the operation and says to use pc:graph, eagerly and traced.
  def target(x):
    copy = tf.numpy_function(lambda a: a, [x], x.dtype, stateful=False)
    return gaussian_log_prob(x) + 0. * tf.reduce_sum(copy)
  kernel = nuts.NoUTurnSampler(target, 0.4, max_tree_depth=3)
  init = tf.constant(INIT)
  results = kernel.bootstrap_results(init)
  for step in (kernel.one_step, tf.function(kernel.one_step)):
    with pytest.raises(ValueError, match=r"XLA cannot compile "
                       r"\(PyFuncStateless\).*backend='pc:graph'"):
      step(init, results, seed=[1, 2])
  # Also for a target that takes only all the chains (its input_signature
  # fixes their number), which the check traces on all of them: on one
  # chain it failed, and the check gave up and left XLA's error.
  all_chains = nuts.NoUTurnSampler(
      tf.function(target, input_signature=[tf.TensorSpec([4, 3],
                                                         tf.float64)]),
      0.4, max_tree_depth=3)
  with pytest.raises(ValueError, match=r"XLA cannot compile "
                     r"\(PyFuncStateless\)"):
    all_chains.one_step(init, all_chains.bootstrap_results(init),
                        seed=[1, 2])
  # A gradient that needs the number of chains as a constant shape
  # (tfb.CorrelationCholesky's). pc:xla traces the target for each number
  # of chains it calls it on, so the step runs (it failed with XLA's
  # "Reading input as constant from a dynamic tensor" when the target was
  # traced once for any number); with the chain count unknown where the
  # step is traced, XLA cannot have the shape, and that is the clear error.
  # A scaled LKJ model of 2x2 correlations.
  correlation = tfb.CorrelationCholesky()
  lkj = tfd.CholeskyLKJ(2, np.float64(2.))
  kernel = nuts.NoUTurnSampler(
      lambda x: lkj.log_prob(correlation.forward(x))
      + correlation.forward_log_det_jacobian(x, 1), 0.3, max_tree_depth=3)
  init = tf.fill([3, 1], np.float64(0.1))
  results = kernel.bootstrap_results(init)
  state, after = kernel.one_step(init, results, seed=[1, 2])
  assert state.shape == (3, 1) and np.isfinite(after.target_log_prob).all()
  @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float64)])
  def unknown_chains(x):
    return kernel.one_step(x, kernel.bootstrap_results(x), seed=[1, 2])[0]
  with pytest.raises(ValueError, match=r"shape that depends on the number "
                     r"of chains.*backend='pc:graph'"):
    unknown_chains(init)


def test_traced_pc_xla_step_is_one_xla_computation():
  """In a caller's plain tf.function, pc:xla's one_step is one XLA-compiled
  call: the flattening and the results around the batched program are not
  left to the caller's executor (they cost about 0.3 ms a step there)."""
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, 0.4, max_tree_depth=2)
  init = tf.constant(INIT)
  results = kernel.bootstrap_results(init)
  graph = tf.function(kernel.one_step).get_concrete_function(
      init, results, seed=tf.constant([1, 2])).graph
  ops = graph.get_operations()
  calls = [op for op in ops
           if op.type in ("PartitionedCall", "StatefulPartitionedCall")]
  assert len(calls) == 1
  assert calls[0].get_attr("_XlaMustCompile")
  # Constants (and a Fill of a static shape, which grappler folds) of the
  # results' momentum distribution, rebuilt from its tensors where the
  # caller's function receives it.
  assert {op.type for op in ops} <= {"Placeholder", "Identity", "NoOp",
                                     "Const", "Fill", calls[0].type}


def test_pc_xla_transition_copies_no_register_bank():
  """pc:xla writes the VM's register banks in place. A block alone in its
  dispatch (`dispatch.Dispatch`) used to be inlined into its loop, where XLA
  fused its reads of a bank into the loop's write of it and then copied
  the bank every step: NUTS steps on the 100-d Gaussian took twice as long
  when the hot blocks were alone in their dispatches."""
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, 0.4, max_tree_depth=3,
                               num_trajectories_per_step=2)
  state = tf.constant(INIT)
  results = kernel.bootstrap_results(state)
  kernel.one_step(state, results, seed=[1, 2])
  program = kernel.batched_program(state, results)
  runtime = pipeline.runtime(program, program._last_types, "pc:xla")  # pylint: disable=protected-access
  layout = runtime.layout_for(len(INIT))
  assert any(len(d.blocks) == 1 for d in layout.dispatches)
  # Blocks are grouped by what they write to registers and to stacks
  # apart: the block after a first half pushes a whole Subtree but writes
  # three [d] registers, so it pads no register write to the 16 rows of a
  # trajectory's doubling (`trajectory/body2.1`).
  labels = [b.label for b in program.ir(level=2).blocks]
  after_first_half = layout.dispatch_of[labels.index(
      _after_first_half(program.ir(level=2)))]
  doubling = layout.dispatch_of[labels.index("trajectory/body2.1")]
  vector = ("float64", (3,))
  assert after_first_half.bank_capacity[vector] == 3
  assert doubling.bank_capacity[vector] == 16
  # The dispatches' loops run from the program's last dispatch to its first
  # (by their lowest block): replaying NUTS's block sequence, the order
  # that saves the most loop conditions of the simple ones.
  lowest = [min(d.blocks) for d in layout.dispatches]
  assert lowest == sorted(lowest, reverse=True) and len(lowest) > 2
  compiled = runtime._compiled[(len(INIT), False)]  # pylint: disable=protected-access
  args = [tf.zeros(spec.shape, spec.dtype) for spec in
          compiled.get_concrete_function().structured_input_signature[0]]
  hlo = compiled.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
  for (dtype, shape), registers in layout.banks.sizes.items():
    dims = ",".join(str(d) for d in (registers, len(INIT)) + shape)
    assert not re.findall(rf"= f\d+\[{dims}\]\S* copy\(", hlo), dtype


# -- errors -------------------------------------------------------------------

def test_non_callable_target_is_rejected():
  with pytest.raises(TypeError, match="callable"):
    nuts.NoUTurnSampler(3.0, 0.1)


def test_step_size_of_wrong_shape_is_rejected():
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, np.ones([2, 5]),
                               backend=EAGER)
  with pytest.raises(ValueError, match="does not broadcast"):
    kernel.bootstrap_results(tf.constant(INIT))
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, [0.1, 0.2], backend=EAGER)
  with pytest.raises(ValueError, match="2 step sizes for a state of 1"):
    kernel.bootstrap_results(tf.constant(INIT))


def test_a_log_density_nuts_cannot_use_is_a_clear_error():
  # keepdims: one value per chain, but shaped [chains, 1]; it failed in a
  # reshape inside one_step.
  kernel = nuts.NoUTurnSampler(
      lambda x: gaussian_log_prob(x)[..., tf.newaxis], 0.1, backend=EAGER)
  with pytest.raises(ValueError, match=r"shape \(4, 1\).*one value per chain"):
    kernel.bootstrap_results(tf.constant(INIT))
  # A float64 density of a float32 state: the error blamed the step size.
  kernel = nuts.NoUTurnSampler(
      lambda x: tf.cast(gaussian_log_prob(x), tf.float64), 0.1,
      backend=EAGER)
  with pytest.raises(TypeError, match="returns float64 for a float32 state"):
    kernel.bootstrap_results(tf.constant(INIT, tf.float32))
  # A state part the density ignores: its gradient was taken as zero and
  # that part drifted without bound (tfp.mcmc raises too).
  kernel = nuts.NoUTurnSampler(lambda x, y: gaussian_log_prob(x), 0.1,
                               backend=EAGER)
  with pytest.raises(ValueError, match="`None` gradient.*state part 1"):
    kernel.bootstrap_results([tf.constant(INIT), tf.constant(INIT)])


SCALES = np.array([0.5, 1., 2., 3.])


def scaled_per_chain(x):
  """A Gaussian whose scale is a parameter per chain (of 4)."""
  return tf.reduce_sum(-0.5 * (x / SCALES[:, None]) ** 2, -1)


@pytest.mark.parametrize("backend", ["local:eager", "pc:eager", "pc:graph",
                                     "pc:xla"])
@pytest.mark.parametrize("metric", ["diagonal", "dense"])
def test_a_target_with_parameters_per_chain_gives_each_chain_its_own(
    backend, metric):
  # The batched program calls the gradient on the chains that reach a
  # leaf together; such a target was refused (before that, silently
  # handed the wrong chains' log densities: sd 1.47 where 3 was due). Each
  # chain's log density and gradient after steps are its own.
  momentum_distribution = None
  if metric == "dense":
    momentum_distribution = tfp.distributions.MultivariateNormalTriL(
        scale_tril=tf.linalg.cholesky(tf.constant(
            [[1., .3, 0.], [.3, 1., 0.], [0., 0., 2.]], tf.float64)))
  kernel = nuts.NoUTurnSampler(scaled_per_chain, 0.3, max_tree_depth=4,
                               momentum_distribution=momentum_distribution,
                               backend=backend)
  state, results = tf.constant(INIT), kernel.bootstrap_results(INIT)
  for seed in range(3):
    state, results = kernel.one_step(state, results, seed=[seed, 1])
  assert results.leapfrogs_taken.numpy().min() > 0
  np.testing.assert_allclose(results.target_log_prob,
                             scaled_per_chain(state), rtol=1e-10)
  np.testing.assert_allclose(results.grads_target_log_prob[0],
                             -state / SCALES[:, None] ** 2, rtol=1e-10)
  # Every chain's gradient, at every call.
  assert results.num_grads_computed.numpy() % 4 == 0


def test_parameters_per_chain_with_two_chain_dimensions():
  scales = SCALES.reshape(2, 2, 1)
  target = lambda x: tf.reduce_sum(-0.5 * (x / scales) ** 2, -1)  # pylint: disable=unnecessary-lambda-assignment
  kernel = nuts.NoUTurnSampler(target, 0.3, max_tree_depth=4,
                               backend="pc:graph")
  state = tf.constant(INIT.reshape(2, 2, 3))
  results = kernel.bootstrap_results(state)
  for seed in range(3):
    state, results = kernel.one_step(state, results, seed=[seed, 1])
  np.testing.assert_allclose(results.target_log_prob, target(state),
                             rtol=1e-10)


@pytest.mark.slow
def test_a_target_with_parameters_per_chain_samples_each_chains_scale():
  kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
      nuts.NoUTurnSampler(scaled_per_chain, 0.5), 200)
  draws = tf.function(lambda: tfp.mcmc.sample_chain(
      800, tf.zeros([4, 3], tf.float64), kernel=kernel, num_burnin_steps=200,
      trace_fn=None, seed=[1, 2]), jit_compile=True)()
  # 2400 draws a chain: a sd within 12% of its own scale, where another
  # chain's scale is off by 33% or more.
  np.testing.assert_allclose(np.std(draws, axis=(0, 2)), SCALES, rtol=0.12)


def test_a_target_that_takes_only_all_the_chains():
  # A tf.function whose input_signature fixes the chain count, which
  # tfp.mcmc.NoUTurnSampler runs: refused (it fails on one chain); now
  # called on all the chains at once.
  fixed = tf.function(gaussian_log_prob,
                      input_signature=[tf.TensorSpec([4, 3], tf.float64)])
  kernel = nuts.NoUTurnSampler(fixed, 0.3, max_tree_depth=3,
                               backend="pc:graph")
  state, results = tf.constant(INIT), kernel.bootstrap_results(INIT)
  known_state, results = kernel.one_step(state, results, seed=[1, 2])
  np.testing.assert_allclose(results.target_log_prob,
                             gaussian_log_prob(known_state), rtol=1e-10)
  # Traced with the chain count unknown, it runs as TFP's kernel does:
  # calling such a tf.function gives its argument the signature's shape,
  # and one_step gives the state that of its gradient.
  unknown_count = tf.function(
      lambda x: kernel.one_step(x, kernel.bootstrap_results(x), seed=[1, 2]),
      input_signature=[tf.TensorSpec([None, 3], tf.float64)])
  unknown_state, _ = unknown_count(INIT)
  np.testing.assert_allclose(unknown_state, known_state, rtol=1e-10)
  # A target that fixes the count and reveals it to no caller, traced
  # with the chain count unknown: a clear error.
  def only_four(x):
    return gaussian_log_prob(tf.ensure_shape(x, [4, 3]))
  kernel = nuts.NoUTurnSampler(only_four, 0.3, backend="pc:graph")
  with pytest.raises(ValueError, match=r"fixed number of chains.*shape "
                     r"\[4\].*number of chains is unknown"):
    tf.function(kernel.bootstrap_results, input_signature=[
        tf.TensorSpec([None, 3], tf.float64)])(INIT)


def test_parameters_per_chain_with_a_chain_count_unknown_when_traced():
  kernel = nuts.NoUTurnSampler(scaled_per_chain, 0.3, backend="pc:graph")
  unknown_count = tf.function(
      kernel.bootstrap_results,
      input_signature=[tf.TensorSpec([None, 3], tf.float64)])
  with pytest.raises(ValueError, match=r"parameters per chain.*shape "
                     r"\[4\].*number of chains is unknown"):
    unknown_count(INIT)
  # Shapes known only when the graph runs: an assertion.
  unknown = tf.Variable(SCALES, shape=tf.TensorShape([None]))
  per_chain = lambda x: tf.reduce_sum(-0.5 * (x / unknown[:, None]) ** 2, -1)  # pylint: disable=unnecessary-lambda-assignment
  kernel = nuts.NoUTurnSampler(per_chain, 0.1, backend="pc:graph")
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="more than one value given one chain"):
    tf.function(lambda: kernel.bootstrap_results(tf.constant(INIT)))()


def test_bootstrap_traces_the_target_once_with_the_chain_count_known():
  # bootstrap_results tells a target with parameters per chain from the
  # call that gives the start's log density and gradient, made on the
  # chains and a copy of the first (one value more: no parameter per
  # chain), not from a second trace on one chain.
  shapes = []
  def counted(x):
    shapes.append(x.shape.as_list())
    return gaussian_log_prob(x)
  kernel = nuts.NoUTurnSampler(counted, 0.3, backend="pc:graph")
  results = tf.function(kernel.bootstrap_results)(tf.constant(INIT))
  assert shapes == [[5, 3]]
  np.testing.assert_allclose(results.target_log_prob,
                             [numpy_logp_and_grad(q)[0] for q in INIT],
                             rtol=1e-12)
  np.testing.assert_allclose(results.grads_target_log_prob[0],
                             [numpy_logp_and_grad(q)[1] for q in INIT],
                             rtol=1e-12)
  # A parameter per chain does not broadcast to one chain more: the
  # chains alone, then one chain, tell it.
  shapes.clear()
  per_chain = nuts.NoUTurnSampler(
      lambda x: counted(x) / SCALES, 0.3, backend="pc:graph")
  results = tf.function(per_chain.bootstrap_results)(tf.constant(INIT))
  assert shapes == [[5, 3], [4, 3], [1, 3]]
  np.testing.assert_allclose(
      results.target_log_prob,
      [numpy_logp_and_grad(q)[0] / s for q, s in zip(INIT, SCALES)],
      rtol=1e-12)


def test_no_chains_sample_as_with_tfp_nuts():
  # A batch of zero chains (an empty [0, 3] state) samples nothing, as
  # with tfp.mcmc.NoUTurnSampler; the check that the target treats the
  # chains alike called it on the empty batch and raised that it returned
  # shape [0] instead of [1] (eagerly, and as an assertion when the
  # number of chains is known only when the graph runs).
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, 0.4, max_tree_depth=3,
                               backend=EAGER)
  none = tf.zeros([0, 3], tf.float64)
  draws, leapfrogs = tfp.mcmc.sample_chain(
      2, none, kernel=kernel, trace_fn=lambda _, r: r.leapfrogs_taken,
      seed=(1, 2))
  assert draws.shape == (2, 0, 3) and leapfrogs.shape == (2, 0)
  bootstrap = tf.function(kernel.bootstrap_results, input_signature=[
      tf.TensorSpec([None, 3], tf.float64)])
  assert bootstrap(none).target_log_prob.shape == (0,)
  assert bootstrap(tf.constant(INIT)).target_log_prob.shape == (4,)


def test_a_target_with_python_control_flow_on_tensors_is_a_clear_error():
  # tfp.mcmc.NoUTurnSampler runs such a target eagerly; ours traces it.
  # The error named our gradient call in nuts/tree.py and advised moving
  # the `if` into a @tab.batch body the user never wrote.
  def target(x):
    if tf.reduce_any(tf.abs(x) > 100.):
      return tf.fill(tf.shape(x)[:-1], tf.constant(-np.inf, x.dtype))
    return gaussian_log_prob(x)
  kernel = nuts.NoUTurnSampler(target, 0.3, max_tree_depth=2, backend=EAGER)
  init = tf.constant(INIT)
  results = kernel.bootstrap_results(init)
  with pytest.raises(TypeError, match=r"target_log_prob_fn uses a tensor "
                     r"as a Python bool.*@tf.function"):
    kernel.one_step(init, results, seed=[1, 2])
  # As it says, a tf.function target (AutoGraph) runs.
  kernel = nuts.NoUTurnSampler(tf.function(target), 0.3, max_tree_depth=2,
                               backend=EAGER)
  state, _ = kernel.one_step(init, results, seed=[1, 2])
  assert state.shape == (4, 3)
  # Other eager-only code is named as the target's too.
  def target(x):
    return gaussian_log_prob(x) + 0. * np.sum(x)
  kernel = nuts.NoUTurnSampler(target, 0.3, max_tree_depth=2, backend=EAGER)
  with pytest.raises(TypeError, match=r"target_log_prob_fn fails when "
                     r"traced.*NumPy functions.*NotImplementedError"):
    kernel.one_step(init, results, seed=[1, 2])


def test_unknown_event_dimensions_when_traced_are_a_clear_error():
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, 0.1, backend="pc:graph")

  @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float64)])
  def step(x):
    return kernel.one_step(x, kernel.bootstrap_results(x), seed=[1, 2])
  with pytest.raises(ValueError, match="event shape.*must be known"):
    step.get_concrete_function()


def test_step_size_of_wrong_dtype_is_rejected():
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, tf.constant(0.1, tf.float32),
                               backend=EAGER)
  with pytest.raises(TypeError, match="float32"):
    kernel.bootstrap_results(tf.constant(INIT))
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, tf.constant(1, tf.int32),
                               backend=EAGER)
  with pytest.raises(TypeError, match="floating point"):
    kernel.bootstrap_results(tf.constant(INIT))


def test_non_finite_initial_log_prob_names_the_chain():
  def target(x):
    return tf.where(x[..., 0] > 0, gaussian_log_prob(x),
                    tf.constant(-np.inf, x.dtype))
  init = np.abs(INIT)
  init[2, 0] = -1.
  kernel = nuts.NoUTurnSampler(target, 0.1, backend=EAGER)
  with pytest.raises(ValueError, match=r"chain\(s\) \[2\]"):
    kernel.bootstrap_results(tf.constant(init))
  with pytest.raises(ValueError, match=r"chain\(s\) \[1\]"):
    kernel.bootstrap_results(tf.constant([[1., 0, 0], [np.nan, 0, 0]]))
  # Traced (as sample_chain runs it), a graph assertion names the chain.
  bootstrap = tf.function(nuts.NoUTurnSampler(target, 0.1).bootstrap_results)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"(?s)not finite.*\[\[2\]\].*-inf"):
    bootstrap(tf.constant(init))
  # And in a tf.compat.v1 graph, where an assertion that no fetched tensor
  # needs never ran.
  with tf.Graph().as_default():
    results = nuts.NoUTurnSampler(target, 0.1).bootstrap_results(
        tf.constant(init))
    with tf.compat.v1.Session() as session:
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"(?s)not finite.*\[\[2\]\].*-inf"):
        session.run(results.target_log_prob)


def test_the_finite_start_check_reads_the_target_through_a_loop():
  """Compiling the assertion, XLA's bridge first tries to evaluate its
  guard and indices as constants on the host, the whole target included
  (most of a logistic regression's bootstrap on 10,000 points). A loop's
  results stop that: nothing in the check reaches the target but through
  one."""
  def target(x):
    return tf.identity(gaussian_log_prob(x), name="the_target")
  bootstrap = tf.function(nuts.NoUTurnSampler(target, 0.1).bootstrap_results,
                          jit_compile=True)
  graph = bootstrap.get_concrete_function(
      tf.TensorSpec([4, 3], tf.float32)).graph
  checks = [op for op in graph.get_operations()
            if "check_finite_start" in op.name]
  assert checks
  seen, todo, loops = set(), list(checks), 0
  while todo:
    op = todo.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    assert "the_target" not in op.name, op.name
    if op.type in ("While", "StatelessWhile"):
      loops += 1
      continue
    todo.extend(t.op for t in op.inputs)
  assert loops


def test_bad_settings_are_rejected():
  with pytest.raises(ValueError, match="max_tree_depth"):
    nuts.NoUTurnSampler(gaussian_log_prob, 0.1, max_tree_depth=0)
  with pytest.raises(ValueError, match="max_tree_depth"):
    nuts.NoUTurnSampler(gaussian_log_prob, 0.1, max_tree_depth=None)
  for step_size in (-0.1, np.array([0.1, 0.0, 0.2, 0.3])):   # per chain
    with pytest.raises(ValueError, match="step sizes must be positive"):
      nuts.NoUTurnSampler(gaussian_log_prob, step_size).bootstrap_results(
          tf.constant(INIT))
  with pytest.raises(tab.UnknownBackendError):
    nuts.NoUTurnSampler(gaussian_log_prob, 0.1, backend="nope")


def test_tfp_keyword_arguments_are_taken():
  """tfp.mcmc.NoUTurnSampler's extra arguments work by keyword, survive a
  wrapper's `copy`, and its positional fourth (max_energy_diff) is not
  silently read as our fourth (unrolled_leapfrog_steps)."""
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, 0.1, max_energy_diff=500.,
                               parallel_iterations=4)
  assert kernel.max_energy_diff == 500. and kernel.parallel_iterations == 4
  assert kernel.experimental_shard_axis_names is None
  copied = kernel.copy(step_size=0.2)
  assert copied.max_energy_diff == 500. and copied.parallel_iterations == 4
  with pytest.raises(ValueError, match="pass max_energy_diff=... by keyword"):
    nuts.NoUTurnSampler(gaussian_log_prob, 0.1, 10, 1000.)
  # An integer out of range is not that mistake: no such hint.
  with pytest.raises(ValueError) as error:
    nuts.NoUTurnSampler(gaussian_log_prob, 0.1, unrolled_leapfrog_steps=0)
  assert "max_energy_diff" not in str(error.value)
  # A constant tensor is a number, as TFP takes it.
  assert nuts.NoUTurnSampler(gaussian_log_prob, 0.1, max_energy_diff=(
      tf.constant(10.))).max_energy_diff == 10.
  for bad in (0., -1., float("nan"), True):
    with pytest.raises(ValueError, match="max_energy_diff"):
      nuts.NoUTurnSampler(gaussian_log_prob, 0.1, max_energy_diff=bad)
  with pytest.raises(ValueError, match="parallel_iterations"):
    nuts.NoUTurnSampler(gaussian_log_prob, 0.1, parallel_iterations=0)
  with pytest.raises(NotImplementedError, match="sharded"):
    nuts.NoUTurnSampler(gaussian_log_prob, 0.1,
                        experimental_shard_axis_names=["chains"])
  # Nor through experimental_with_shard_axes, which returned the kernel
  # unchanged, dropping the names silently (here as a wrapper passes them).
  wrapped = tfp.mcmc.TransformedTransitionKernel(kernel, tfb.Identity())
  with pytest.raises(NotImplementedError, match="sharded"):
    wrapped.experimental_with_shard_axes(["chains"])
  assert kernel.experimental_with_shard_axes([None]).parallel_iterations == 4


def test_max_energy_diff_decides_divergence():
  """A small max_energy_diff makes steps that raise the energy by more
  divergent, ending their trajectories, exactly as in the NumPy reference
  given the same threshold (deterministic: false-failure rate 0)."""
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, 0.6, max_tree_depth=4,
                               backend=EAGER, max_energy_diff=0.05)
  init = tf.constant(INIT)
  state, results = kernel.one_step(init, kernel.bootstrap_results(init),
                                   seed=[5, 6])
  seed = np.asarray(results.seed)
  sampler = reference_numpy.Sampler(numpy_logp_and_grad, max_tree_depth=4,
                                    max_energy_diff=0.05)
  divergent = []
  for c in range(len(INIT)):
    q, _, _, stats = sampler.steps(INIT[c], np.full(3, 0.6),
                                   [seed[0], seed[1], c], 1)
    np.testing.assert_allclose(state[c], q, rtol=1e-10, atol=1e-12)
    assert results.leapfrogs_taken[c] == stats[0]["num_leapfrogs"]
    divergent.append(stats[0]["divergent"])
  np.testing.assert_array_equal(results.has_divergence, divergent)
  # The threshold matters here: some chains diverge, which the default
  # threshold (1000) never lets them do on this target and step size.
  assert any(divergent)
  default = nuts.NoUTurnSampler(gaussian_log_prob, 0.6, max_tree_depth=4,
                                backend=EAGER)
  _, default_results = default.one_step(
      init, default.bootstrap_results(init), seed=[5, 6])
  assert not np.any(default_results.has_divergence)


@pytest.mark.parametrize("unrolled", [1, 2, 3])
def test_acceptance_is_averaged_over_leaves(unrolled):
  """With a tiny step every leapfrog is accepted, so the mean acceptance
  statistic is 1 whatever `unrolled_leapfrog_steps` is (as in TFP's
  kernel, one statistic per leaf). It used to be divided by the leapfrogs,
  1/2 and 1/3 here, which drove dual averaging's step size to zero."""
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, 1e-4, max_tree_depth=3,
                               unrolled_leapfrog_steps=unrolled,
                               backend=EAGER)
  init = tf.constant(INIT)
  _, results = kernel.one_step(init, kernel.bootstrap_results(init),
                               seed=[1, 2])
  np.testing.assert_array_equal(results.leapfrogs_taken, 7 * unrolled)
  np.testing.assert_allclose(np.exp(results.log_accept_ratio), 1., atol=1e-6)


def test_energy_has_tfp_sign():
  """`energy` is the log joint, logp - |p|^2 / 2, as in
  tfp.mcmc.NoUTurnSampler (minus the Hamiltonian; ArviZ's energy plots
  and code written for TFP read it so), and at bootstrap TFP's value."""
  ours = nuts.NoUTurnSampler(gaussian_log_prob, 0.4, backend=EAGER)
  theirs = tfp.mcmc.NoUTurnSampler(gaussian_log_prob, 0.4)
  init = tf.constant(INIT)
  start = ours.bootstrap_results(init)
  np.testing.assert_allclose(start.energy,
                             theirs.bootstrap_results(init).energy)
  _, results = ours.one_step(init, start, seed=[1, 2])
  kinetic = results.target_log_prob - results.energy
  assert np.all(kinetic > 0)
  # The kinetic energy of a standard normal momentum in 3-d: about 1.5.
  assert 0.2 < np.mean(kinetic) < 5


def test_one_chain_without_a_chain_dimension_traced():
  # A [3] state with a scalar log density is one chain; traced, the start
  # check's boolean_mask of a scalar used to fail.
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, 0.4, backend="pc:graph")
  init = tf.constant(INIT[0])
  state, results = tf.function(lambda: kernel.one_step(
      init, kernel.bootstrap_results(init), seed=[1, 2]))()
  assert state.shape == (3,) and results.target_log_prob.shape == ()


def test_several_chain_dimensions(fused_kernel, fused_step):
  """Chains may have any number of leading dimensions: [2, 2] chains give
  the same samples as the 4 chains flattened."""
  state, results = fused_step
  init = tf.constant(INIT.reshape(2, 2, 3))
  start = fused_kernel.bootstrap_results(init)
  state2, results2 = fused_kernel.one_step(init, start, seed=[3, 4])
  # One program per chain's state layout: [2, 2] chains of [3] run the
  # one that 4 chains of [3] run.
  program = fused_kernel.batched_program(init, start)
  assert program.last_stats is fused_kernel.last_run_stats
  assert program is fused_kernel.batched_program(state, results)
  assert state2.shape == (2, 2, 3)
  assert results2.target_log_prob.shape == (2, 2)
  np.testing.assert_allclose(np.reshape(state2, [4, 3]), state, rtol=1e-12)
  np.testing.assert_array_equal(np.reshape(results2.leapfrogs_taken, [4]),
                                results.leapfrogs_taken)


def test_tuple_and_namedtuple_states_come_back_as_such():
  # They came back as lists, and an eager sample_chain then failed
  # comparing structures.
  point = collections.namedtuple("Point", ["x", "y"])
  def target(x, y):
    return gaussian_log_prob(tf.concat([x, y[..., tf.newaxis]], -1))
  kernel = nuts.NoUTurnSampler(target, 0.3, max_tree_depth=3, backend=EAGER)
  parts = (tf.constant(INIT[:, :2]), tf.constant(INIT[:, 2]))
  for init in (parts, point(*parts), list(parts)):
    state, _ = kernel.one_step(init, kernel.bootstrap_results(init),
                               seed=[1, 2])
    assert type(state) is type(init)
  samples = tfp.mcmc.sample_chain(2, point(*parts), kernel=kernel,
                                  trace_fn=None, seed=(1, 2))
  assert isinstance(samples, point) and samples.x.shape == (2, 4, 2)


def test_step_size_forms_broadcast_to_the_state():
  from nuts import chain_states  # pylint: disable=import-outside-toplevel
  parts = [tf.zeros([4, 3], tf.float64), tf.zeros([4], tf.float64)]
  bcast = lambda s: [x.numpy() for x in
                     chain_states.broadcast_step_size(s, parts, 1)]
  scalar = bcast(0.1)
  assert scalar[0].shape == (4, 3) and np.all(scalar[1] == 0.1)
  per_part = bcast([0.1, 0.2])
  assert np.all(per_part[0] == 0.1) and np.all(per_part[1] == 0.2)
  one_for_all = bcast([0.3])                     # as tfp.mcmc's kernels
  assert np.all(one_for_all[0] == 0.3) and np.all(one_for_all[1] == 0.3)
  per_chain = bcast([np.arange(4.)[:, None], np.arange(4.)])  # [chains, 1]
  np.testing.assert_array_equal(per_chain[0][:, 1], np.arange(4.))
  np.testing.assert_array_equal(per_chain[1], np.arange(4.))
  per_coord = bcast([np.array([0.1, 0.2, 0.3]), 0.5])
  np.testing.assert_array_equal(per_coord[0][3], [0.1, 0.2, 0.3])
  # A step size broadcasts from the right, as tfp.mcmc's kernels (and the
  # step-size adaptation kernels) read it: [chains] is per chain only for a
  # part without event dimensions. It used to be taken per chain where it
  # did not broadcast, so [2] meant per chain for 2 chains of [3] but per
  # coordinate for 2 chains of [2].
  with pytest.raises(ValueError, match=r"per chain: \[chains, 1\]"):
    bcast([np.arange(4.), np.arange(4.)])
  square = [tf.zeros([2, 2], tf.float64)]
  per_coord = chain_states.broadcast_step_size(np.array([1., 2.]), square, 1)
  np.testing.assert_array_equal(per_coord[0], [[1., 2.], [1., 2.]])


@pytest.mark.slow
def test_unrolled_leapfrogs_and_list_state_match_reference():
  """A two-part state with per-part step sizes and 2 leapfrogs per leaf ==
  the NumPy reference on the concatenated state."""
  def target(x, y):
    return gaussian_log_prob(tf.concat([x, y[..., tf.newaxis]], -1))
  kernel = nuts.NoUTurnSampler(target, [0.2, 0.3], max_tree_depth=4,
                               unrolled_leapfrog_steps=2, backend=EAGER)
  init = [tf.constant(INIT[:, :2]), tf.constant(INIT[:, 2])]
  start = kernel.bootstrap_results(init)
  (x, y), results = kernel.one_step(init, start, seed=[7, 8])
  assert isinstance(results.grads_target_log_prob, list)
  assert kernel.batched_program(init, start).last_stats is (
      kernel.last_run_stats)
  seed = np.asarray(results.seed)
  sampler = reference_numpy.Sampler(numpy_logp_and_grad, max_tree_depth=4,
                                    unrolled_leapfrog_steps=2)
  for c in range(len(INIT)):
    q, _, _, stats = sampler.steps(INIT[c], np.array([0.2, 0.2, 0.3]),
                                   [seed[0], seed[1], c], 1)
    np.testing.assert_allclose(np.append(x[c], y[c]), q, rtol=1e-10,
                               atol=1e-12)
    assert results.leapfrogs_taken[c] == stats[0]["num_leapfrogs"]


def test_a_copy_with_other_tree_settings_runs_a_program_of_its_own():
  kernel = nuts.NoUTurnSampler(gaussian_log_prob, 0.3, backend="pc:graph")
  init = tf.constant(INIT)
  for settings in (dict(max_energy_diff=5.), dict(max_tree_depth=3)):
    copy = kernel.copy(**settings)
    results = copy.bootstrap_results(init)
    copy.one_step(init, results, seed=[1, 2])
    assert kernel.batched_program(init, results) is not (
        copy.batched_program(init, results))


def test_run_stats_of_a_wrapped_kernel_reach_the_kernel_the_user_made():
  # TransformedTransitionKernel runs a copy of our kernel (with the target
  # it transforms); that copy's eager step is what `last_run_stats` of the
  # kernel the user made reports (it used to stay None).
  ours = nuts.NoUTurnSampler(gaussian_log_prob, 0.2, max_tree_depth=3,
                             backend="pc:eager")
  wrapped = tfp.mcmc.TransformedTransitionKernel(ours, tfb.Identity())
  init = tf.constant(INIT)
  _, results = wrapped.one_step(init, wrapped.bootstrap_results(init),
                                seed=[1, 2])
  stats = ours.last_run_stats
  assert stats is not None and stats.batch_size == len(INIT)
  # Every chain's leapfrog is one row of one gradient call.
  used = int(tf.reduce_sum(results.inner_results.leapfrogs_taken))
  assert sum(k * n for k, n in stats.batched_primitive_members.items()) == (
      used)
  # The program that ran is the one `batched_program` gives (it used to be
  # the kernel's own, never called, whose ir(level=2) raised).
  program = ours.batched_program(init, results.inner_results)
  assert program.last_stats is stats
  assert "build_tree" in str(program.ir(level=2))
  # A copy with a parameter replaced shares it too; a new kernel does not.
  assert ours.copy(max_tree_depth=2).last_run_stats is stats
  assert nuts.NoUTurnSampler(gaussian_log_prob, 0.2).last_run_stats is None


class _SavedSampler(tf.Module):

  def __init__(self):
    super().__init__()
    self.kernel = nuts.NoUTurnSampler(gaussian_log_prob, 0.4,
                                      max_tree_depth=3)

  @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32),
                                tf.TensorSpec([2], tf.int32)])
  def sample(self, init, seed):
    return tfp.mcmc.sample_chain(2, init, kernel=self.kernel, trace_fn=None,
                                 seed=seed)


def test_a_saved_sampler_gives_the_same_samples_without_our_packages(
    tmp_path, fresh_python):
  # A tf.function calling pc:xla (the default) failed to save (the VM
  # call's gradient, which SavedModel traces). Loaded where neither nuts
  # nor tfp_autobatch is imported, the same seed gives the same samples.
  module = _SavedSampler()
  init, seed = tf.constant(INIT, tf.float32), tf.constant([3, 4])
  want = module.sample(init, seed).numpy()
  tf.saved_model.save(module, str(tmp_path))
  script = ("import json, sys, numpy as np, tensorflow as tf\n"
            f"loaded = tf.saved_model.load({str(tmp_path)!r})\n"
            f"init = tf.constant(np.array({INIT.tolist()!r}), tf.float32)\n"
            "out = loaded.sample(init, tf.constant([3, 4]))\n"
            "print(json.dumps({'samples': out.numpy().tolist(), 'ours': "
            "[m for m in ('nuts', 'tfp_autobatch') if m in sys.modules]}))\n")
  got = fresh_python(script)
  assert got["ours"] == []
  np.testing.assert_allclose(got["samples"], want, rtol=1e-5, atol=1e-6)
