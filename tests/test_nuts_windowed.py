"""`nuts.windowed_adaptive_nuts`, called as TFP's documentation and tests
call `tfp.experimental.mcmc.windowed_adaptive_nuts`, and its pieces: Stan's
window schedule, the flat unconstrained parts of a pinned model, the step
size heuristic, the progress bar and Ctrl-C. Runs are few and short (every
call converts and compiles the NUTS program for its model); the statistical
checks from rough starts are nightly (`test_nuts_warmup_statistics.py`)."""
import inspect

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import nuts
from nuts import progress
from nuts import unconstrained
from nuts import warmup_schedule

tfd = tfp.distributions
Root = tfd.JointDistributionCoroutine.Root

TREATMENT_EFFECTS = [28., 8, -3, 7, -1, 1, 18, 12]
TREATMENT_STDDEVS = [15., 10, 16, 11, 9, 11, 10, 18]
PINS = {"treatment_effects": tf.constant(TREATMENT_EFFECTS)}


def _likelihood(avg_effect, avg_stddev, school_effects_std):
  return tfd.Independent(tfd.Normal(
      avg_effect[..., None] + avg_stddev[..., None] * school_effects_std,
      tf.constant(TREATMENT_STDDEVS)), 1, name="treatment_effects")


def eight_schools_named():
  return tfd.JointDistributionNamed(dict(
      avg_effect=tfd.Normal(0., 5.),
      avg_stddev=tfd.HalfNormal(5.),
      school_effects_std=tfd.Sample(tfd.Normal(0., 1.), 8),
      treatment_effects=lambda school_effects_std, avg_stddev, avg_effect:
      _likelihood(avg_effect, avg_stddev, school_effects_std)))


def eight_schools_coroutine():
  @tfd.JointDistributionCoroutine
  def model():
    avg_effect = yield Root(tfd.Normal(0., 5., name="avg_effect"))
    avg_stddev = yield Root(tfd.HalfNormal(5., name="avg_stddev"))
    z = yield Root(tfd.Sample(tfd.Normal(0., 1.), 8,
                              name="school_effects_std"))
    yield _likelihood(avg_effect, avg_stddev, z)
  return model


def eight_schools_nested():
  return tfd.JointDistributionNamed(dict(
      effect_and_stddev=tfd.JointDistributionSequential(
          [tfd.Normal(0., 5.), tfd.HalfNormal(5.)]),
      school_effects_std=tfd.Sample(tfd.Normal(0., 1.), 8),
      treatment_effects=lambda school_effects_std, effect_and_stddev:
      _likelihood(effect_and_stddev[0], effect_and_stddev[1],
                  school_effects_std)))


# -- the schedule ---------------------------------------------------------------

@pytest.mark.parametrize("steps, expected", [
    (500, [(75, False), (25, True), (50, True), (100, True), (200, True),
           (50, False)]),
    (525, [(75, False), (25, True), (50, True), (100, True), (225, True),
           (50, False)]),
    # The buffers do not fit: 15%, 75%, 10%.
    (100, [(15, False), (75, True), (10, False)]),
    (19, [(19, False)]),
    (0, []),
])
def test_stan_windows(steps, expected):
  windows = warmup_schedule.adaptation_windows(steps)
  assert [tuple(w) for w in windows] == expected
  assert sum(w.length for w in windows) == steps


def test_negative_adaptation_steps_raise():
  with pytest.raises(ValueError, match="num_adaptation_steps"):
    warmup_schedule.adaptation_windows(-1)


def test_regularized_variance_averages_within_chain_variances():
  # Two chains far apart: their own variances (1 and 4), not the spread
  # between them, shrunk by n / (n + 5) towards 1e-3 of the part's scale.
  rng = np.random.default_rng(0)
  a = rng.standard_normal(4000)
  a = (a - a.mean()) / a.std()
  draws = np.stack([a, 100. + 2. * a], 1)[..., None]
  n = 4000.
  for scale in (1., 1e-6):   # the same, relatively, at any scale
    v = warmup_schedule.regularized_variance(
        tf.constant(draws * scale), 1).numpy()
    assert v == pytest.approx([2.5 * scale ** 2 * (n + 1e-3 * 5.)
                               / (n + 5.)], rel=1e-9)


def test_reasonable_step_size_scales_with_the_metric():
  # A Gaussian of sd 0.01: one leapfrog step is accepted at 0.8 for a step
  # of about the sd under the unit metric, and about 1 under the metric
  # that matches the posterior's variance.
  sd = 0.01

  def target(x):
    return -0.5 * tf.reduce_sum((x / sd) ** 2, -1)
  x = [tf.constant(np.random.default_rng(1).standard_normal([64, 3]) * sd)]
  unit = warmup_schedule.reasonable_step_size(
      target, x, [tf.ones([3], tf.float64)], tf.constant(1., tf.float64),
      seed=(1, 2))
  matched = warmup_schedule.reasonable_step_size(
      target, x, [tf.fill([3], tf.constant(sd ** -2, tf.float64))],
      tf.constant(1e-4, tf.float64), seed=(1, 2))
  assert 0.25 * sd < float(unit) < 4. * sd
  assert 0.25 < float(matched) < 4.


# -- the pinned model as flat unconstrained parts --------------------------------

@pytest.mark.parametrize("model_fn", [eight_schools_named,
                                      eight_schools_coroutine,
                                      eight_schools_nested])
def test_unconstrained_parts_round_trip(model_fn):
  model = unconstrained.UnconstrainedModel(
      unconstrained.pin(model_fn(), PINS))
  assert model.sizes == [1, 1, 8] or sorted(model.sizes) == [1, 1, 8]
  parts = model.initial_state([2, 3], seed=(1, 2))
  assert [p.shape.as_list() for p in parts] == [[2, 3, k]
                                                for k in model.sizes]
  for p in parts:   # Stan's start: uniform(-2, 2), unconstrained
    assert np.all(np.abs(p.numpy()) <= 2.)
  state = model.to_constrained(parts)
  back = model.to_unconstrained(state)
  for p, q in zip(parts, back):
    np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=1e-6)
  # The log density on the unconstrained scale is the model's plus the
  # log Jacobian of the constraining map (here: exp for avg_stddev).
  pinned = model.pinned
  bijector = pinned.experimental_default_event_space_bijector()
  unconstrained_structure = bijector.inverse(state)
  expected = (pinned.unnormalized_log_prob(state)
              + bijector.forward_log_det_jacobian(unconstrained_structure))
  np.testing.assert_allclose(model.target_log_prob(*parts).numpy(),
                             expected.numpy(), rtol=1e-5)


def test_model_pinned_already_needs_no_pins():
  model = tfd.JointDistributionSequential([
      tfd.Normal(0., 1., name="x"), lambda x: tfd.Normal(x, 1., name="y")])
  pinned = unconstrained.pin(model.experimental_pin(y=4.2), {})
  assert unconstrained.UnconstrainedModel(pinned).sizes == [1]


def test_a_model_with_nothing_observed_needs_no_pins():
  # TFP's step-size tests sample such a model with no pins at all.
  model = tfd.JointDistributionNamed({
      "a": tfd.Normal(0., 1.),
      "b": tfd.MultivariateNormalDiag(loc=tf.zeros(3),
                                      scale_diag=[1., 2., 3.])})
  assert unconstrained.pin(model, {}) is model
  assert unconstrained.UnconstrainedModel(model).sizes == [1, 3]


# -- errors, before any sampling --------------------------------------------------

def test_errors_speak_the_users_language():
  with pytest.raises(ValueError, match="chain_axis_names.*strategy.scope"):
    nuts.windowed_adaptive_nuts(5, eight_schools_named(),
                                chain_axis_names="chains", **PINS)
  with pytest.raises(TypeError, match="JointDistribution"):
    nuts.windowed_adaptive_nuts(5, lambda x: x)
  with pytest.raises(ValueError, match="n_draws"):
    nuts.windowed_adaptive_nuts(-1, eight_schools_named(), **PINS)
  with pytest.raises(ValueError, match="init_step_size has 2 parts"):
    nuts.windowed_adaptive_nuts(5, eight_schools_named(),
                                init_step_size=[1., 2.], n_chains=2,
                                num_adaptation_steps=0, **PINS)
  with pytest.raises(ValueError, match="inner_kernel"):
    nuts.windowed_adaptive_nuts(
        5, eight_schools_named(), n_chains=2,
        dual_averaging_kwargs={"inner_kernel": None}, **PINS)


# -- runs ---------------------------------------------------------------------------

@pytest.mark.slow
def test_tfp_call_with_every_return_value():
  # As TFP's tests call it: pins by keyword, a chain shape, the warm-up
  # kept, the final kernel results returned.
  draws, trace, final = nuts.windowed_adaptive_nuts(
      4, eight_schools_named(), n_chains=[2, 3], num_adaptation_steps=30,
      max_tree_depth=4, discard_tuning=False,
      return_final_kernel_results=True, seed=(1, 2), **PINS)
  assert set(draws) == {"avg_effect", "avg_stddev", "school_effects_std"}
  assert draws["avg_effect"].shape == [34, 2, 3]
  assert draws["school_effects_std"].shape == [34, 2, 3, 8]
  assert np.all(draws["avg_stddev"].numpy() > 0.)
  for key in ("step_size", "tune", "target_log_prob", "diverging",
              "accept_ratio", "variance_scaling", "n_steps", "is_accepted",
              "energy", "tree_depth"):
    assert key in trace, key
  assert trace["step_size"].shape == [34]
  assert trace["diverging"].shape == [34, 2, 3]
  assert [v.shape.as_list() for v in trace["variance_scaling"]] == [
      [34, 2, 3, k] for k in (1, 1, 8)] or len(trace["variance_scaling"]) == 3
  np.testing.assert_array_equal(trace["tune"].numpy(), [True] * 30 + [False] * 4)
  # The step size is fixed after warm-up; the metric was adapted.
  assert len(set(trace["step_size"].numpy()[30:].tolist())) == 1
  inner = final
  while hasattr(inner, "inner_results"):
    inner = inner.inner_results
  assert isinstance(inner, nuts.NUTSKernelResults)
  assert np.all(np.isfinite(trace["target_log_prob"].numpy()))

  # discard_tuning (the default) keeps n_draws; trace_fn=None: draws only.
  only_draws = nuts.windowed_adaptive_nuts(
      3, eight_schools_named(), n_chains=2, num_adaptation_steps=20,
      max_tree_depth=3, trace_fn=None, seed=(3, 4), **PINS)
  assert only_draws["school_effects_std"].shape == [3, 2, 8]


@pytest.mark.slow
def test_returns_tfps_named_tuples():
  # TFP returns StatesAndTrace, and CheckpointableStatesAndTrace (with
  # `trace=()` when there is no trace_fn) for the final kernel results;
  # code reads `.all_states` and `.final_kernel_results`. A
  # `num_adaptation_steps` in dual_averaging_kwargs is ignored with a
  # warning, as TFP does.
  model = tfd.JointDistributionSequential([
      tfd.Normal(0., 1., name="x"), lambda x: tfd.Normal(x, 1., name="y")])
  with pytest.warns(UserWarning, match="num_adaptation_steps"):
    out = nuts.windowed_adaptive_nuts(   # a NumPy int as n_chains too
        3, model, n_chains=np.int64(2), num_adaptation_steps=2,
        max_tree_depth=2,
        trace_fn=None, return_final_kernel_results=True,
        dual_averaging_kwargs={"num_adaptation_steps": 100}, seed=(1, 1),
        y=1.)
  assert isinstance(out, tfp.mcmc.CheckpointableStatesAndTrace)
  assert out.trace == ()
  assert out.all_states[0].shape == [3, 2]
  assert _innermost(out.final_kernel_results).step_size is not None
  out = nuts.windowed_adaptive_nuts(
      3, model, n_chains=2, num_adaptation_steps=2, max_tree_depth=2,
      trace_fn=lambda *args: (), seed=(1, 1), y=1.)
  assert isinstance(out, tfp.mcmc.StatesAndTrace)
  assert out.all_states[0].shape == [3, 2]
  # A model with nothing observed, no pins: TFP's step-size test with a
  # step size per free variable (a dict like the model's).
  model = tfd.JointDistributionNamed({
      "a": tfd.Normal(0., 1.),
      "b": tfd.MultivariateNormalDiag(loc=tf.zeros(3),
                                      scale_diag=[1., 2., 3.])})
  _, step_size = nuts.windowed_adaptive_nuts(
      1, model, n_chains=3, num_adaptation_steps=3, max_tree_depth=2,
      init_step_size={"a": 1., "b": 2.}, discard_tuning=False,
      trace_fn=lambda *args: _innermost(args[-1]).step_size, seed=(2, 2))
  np.testing.assert_allclose([float(s[0]) for s in step_size], [1., 2.])


@pytest.mark.slow
def test_in_tf_function_with_given_step_sizes_and_start():
  # TFP's test_sequential_step_size and test_explicit_init_samples: a step
  # size per free variable is the one the first step uses; a given start.
  model = tfd.JointDistributionSequential(
      [tfd.HalfNormal(scale=1., name=f"dist_{i}") for i in range(4)])
  init_step_size = [1., 2., 3.]

  @tf.function(autograph=False)
  def run():
    return nuts.windowed_adaptive_nuts(
        1, model, num_adaptation_steps=25, n_chains=3,
        init_step_size=init_step_size, discard_tuning=False,
        current_state=[tf.ones([3]), tf.ones([3]), tf.ones([3])],
        trace_fn=lambda *args: tf.nest.flatten(
            _innermost(args[-1]).step_size),
        dist_3=tf.constant(1.), seed=(5, 6))
  draws, step_sizes = run()
  assert [d.shape.as_list() for d in draws] == [[26, 3]] * 3
  np.testing.assert_allclose([float(s[0]) for s in step_sizes],
                             init_step_size)


def _innermost(results):
  while hasattr(results, "inner_results"):
    results = results.inner_results
  return results


@pytest.mark.slow
def test_progress_bar_and_ctrl_c_keep_the_draws(monkeypatch, capsys):
  # A Ctrl-C arrives (KeyboardInterrupt) after the second sampling chunk:
  # the run stops there and returns those draws, with a warning.
  advance = progress.PhaseProgress.advance
  calls = []

  def advance_then_interrupt(self, steps, **postfix):
    advance(self, steps, **postfix)
    calls.append(self._phase)   # pylint: disable=protected-access
    if calls.count("sampling") == 2:
      raise KeyboardInterrupt
  monkeypatch.setattr(progress.PhaseProgress, "advance",
                      advance_then_interrupt)
  with pytest.warns(nuts.SamplingInterrupted, match="during sampling"):
    draws, trace = nuts.windowed_adaptive_nuts(
        100, eight_schools_coroutine(), n_chains=2, num_adaptation_steps=20,
        max_tree_depth=3, chunk_size=5, progress_bar=True, seed=(7, 8),
        **PINS)
  assert draws.school_effects_std.shape == [10, 2, 8]
  assert trace["diverging"].shape == [10, 2]
  bars = capsys.readouterr().err
  assert "warm-up" in bars and "sampling" in bars
  # 20 warm-up steps: windows of 3, 15 and 2 (15%, 75%, 10%), in chunks
  # of at most 5.
  assert calls.count("warm-up") == 5


def test_no_bar_off_a_terminal(monkeypatch):
  monkeypatch.setattr("sys.stdout.isatty", lambda: False, raising=False)
  assert not progress.show_progress(None)
  assert progress.show_progress(True)
  assert progress.chunk_lengths(60, 25) == [25, 25, 10]


def test_signature_is_tfps_plus_ours():
  ours = inspect.signature(nuts.windowed_adaptive_nuts).parameters
  theirs = inspect.signature(
      tfp.experimental.mcmc.windowed_adaptive_nuts).parameters
  for name, p in theirs.items():
    assert name in ours, name
    assert ours[name].kind == p.kind, name
    if name != "trace_fn" and p.default is not inspect.Parameter.empty:
      assert ours[name].default == p.default, name
  assert [n for n in ours if n not in theirs] == ["backend", "progress_bar",
                                                  "chunk_size"]
