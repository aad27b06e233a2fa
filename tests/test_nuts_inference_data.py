"""`nuts.to_inference_data` and `nuts.summary` on traces shaped as
`windowed_adaptive_nuts` and `sample_chain` return them (synthetic values:
these test the layout and names, not a sampler), through each ArviZ API:
the installed `arviz`, `arviz` 1.x (which re-exports arviz-base and
arviz-stats; stood in for by a module that does the same) and arviz-base
with arviz-stats alone."""
import sys
import types

import numpy as np
import pytest

import nuts


def _arviz_1x():
  """A module `arviz` as ArviZ 1.x is: version 1, arviz-base's and
  arviz-stats' names at its top level."""
  parts = [pytest.importorskip(name) for name in ("arviz_base", "arviz_stats")]
  module = types.ModuleType("arviz")
  for part in parts:
    module.__dict__.update({k: v for k, v in vars(part).items()
                            if not k.startswith("_")})
  module.__version__ = "1.0.0"
  return module


@pytest.fixture(params=["installed arviz", "arviz 1.x", "arviz-base alone"])
def data_type(request, monkeypatch):
  """Selects the ArviZ API by what `import arviz` finds; returns the type
  of the data that API makes."""
  if request.param == "installed arviz":
    az = pytest.importorskip("arviz")
    if int(az.__version__.split(".")[0]) < 1:
      return az.InferenceData
  elif request.param == "arviz 1.x":
    monkeypatch.setitem(sys.modules, "arviz", _arviz_1x())
  else:
    pytest.importorskip("arviz_base")
    pytest.importorskip("arviz_stats")
    monkeypatch.setitem(sys.modules, "arviz", None)   # not installed
  return pytest.importorskip("xarray").DataTree


def _windowed_output(draws=30, chains=(2, 3), warmup=10, seed=0):
  rng = np.random.default_rng(seed)
  shape = (draws,) + chains
  samples = {"mu": rng.standard_normal(shape),
             "z": rng.standard_normal(shape + (4,))}
  diverging = np.zeros(shape, bool)
  diverging[-1, 0, 0] = True           # one divergence after warm-up
  diverging[0, 1, 1] = True            # one during warm-up
  trace = {"step_size": np.linspace(1., 0.5, draws).astype(np.float32),
           "tune": np.arange(draws) < warmup,
           "target_log_prob": rng.standard_normal(shape),
           "diverging": diverging,
           "accept_ratio": rng.uniform(size=shape),
           "variance_scaling": [np.ones(shape + (1,))],
           "n_steps": np.full(shape, 7, np.int32),
           "is_accepted": np.ones(shape, bool),
           "energy": rng.standard_normal(shape),
           "tree_depth": np.full(shape, 3, np.int32)}
  return samples, trace


def test_chains_are_arviz_chains_and_stats_use_arviz_names(data_type):
  samples, trace = _windowed_output()
  idata = nuts.to_inference_data(samples, trace)
  assert isinstance(idata, data_type)
  # A [2, 3] chain shape is six ArviZ chains; warm-up goes to its groups.
  assert idata.posterior["mu"].shape == (6, 20)
  assert idata.posterior["z"].shape == (6, 20, 4)
  assert idata.warmup_posterior["mu"].shape == (6, 10)
  np.testing.assert_array_equal(idata.posterior["z"].values[4, 3],
                                samples["z"][13, 1, 1])
  stats = idata.sample_stats
  for name in ("diverging", "tree_depth", "energy", "step_size", "n_steps",
               "acceptance_rate", "lp"):
    assert stats[name].shape == (6, 20), name
  assert int(stats["diverging"].sum()) == 1
  warmup_stats = idata.warmup_sample_stats
  assert warmup_stats["acceptance_rate"].shape == (6, 10)
  assert int(warmup_stats["diverging"].sum()) == 1
  assert float(stats["step_size"][5, 0]) == pytest.approx(
      trace["step_size"][10])


def test_summary_has_rhat_ess_and_divergences(data_type):
  samples, trace = _windowed_output(draws=200, warmup=0)
  result = nuts.summary(samples, trace)
  for column in ("r_hat", "ess_bulk", "ess_tail", "mean", "sd"):
    assert column in result.table.columns
  assert list(result.table.index[:2]) == ["mu", "z[0]"]
  assert result.divergences == 2   # no warm-up here: both count
  assert (result.num_chains, result.num_draws) == (6, 200)
  assert "2 divergent transitions" in str(result)
  # Independent draws: R-hat near 1, bulk ESS near the draws' count.
  assert result.table["r_hat"].max() < 1.02
  assert result.table["ess_bulk"].min() > 600
  # The same from the converted data.
  idata = nuts.to_inference_data(samples, trace)
  assert isinstance(idata, data_type)
  again = nuts.summary(idata)
  assert again.divergences == 2
  np.testing.assert_array_equal(again.table["r_hat"], result.table["r_hat"])


def test_from_sample_chain_kernel_results(data_type):
  # sample_chain(..., trace_fn=lambda _, r: r) with our kernel: the
  # statistics come out of NUTSKernelResults (here inside an adaptation
  # kernel's results), with ArviZ's signs and names.
  rng = np.random.default_rng(1)
  draws, chains = 25, 4
  shape = (draws, chains)
  fields = dict(
      target_log_prob=rng.standard_normal(shape),
      grads_target_log_prob=[rng.standard_normal(shape + (2,))],
      step_size=[np.full([draws], 0.3)],
      log_accept_ratio=np.log(rng.uniform(size=shape)),
      leapfrogs_taken=np.full(shape, 15, np.int32),
      is_accepted=np.ones(shape, bool), reach_max_depth=np.zeros(shape, bool),
      has_divergence=np.zeros(shape, bool), energy=np.full(shape, -2.),
      seed=np.zeros([draws, 2], np.int32),
      num_grads_computed=np.zeros([draws], np.int32),
      gradient_utilization=np.ones([draws]))
  # Fields this conversion does not read (the momentum distribution) are
  # left None.
  inner = nuts.NUTSKernelResults(**{
      f: fields.get(f) for f in nuts.NUTSKernelResults._fields})

  class Outer:   # an adaptation kernel's results
    inner_results = inner
  idata = nuts.to_inference_data([rng.standard_normal(shape + (2,))],
                                 Outer(), var_names=["theta"])
  assert isinstance(idata, data_type)
  assert idata.posterior["theta"].shape == (4, 25, 2)
  stats = idata.sample_stats
  assert np.all(stats["tree_depth"].values == 4)   # 15 steps: depth 4
  assert np.all(stats["energy"].values == 2.)      # the Hamiltonian
  assert np.all(stats["step_size"].values == pytest.approx(0.3))


@pytest.mark.usefixtures("data_type")
def test_bad_layout_is_explained():
  samples, trace = _windowed_output()
  trace["energy"] = trace["energy"][:, :1]
  with pytest.raises(ValueError, match="cannot align"):
    nuts.to_inference_data(samples, trace)


def test_without_arviz_the_error_says_what_to_install(monkeypatch):
  for name in ("arviz", "arviz_base", "arviz_stats"):
    monkeypatch.setitem(sys.modules, name, None)   # none installed
  samples, trace = _windowed_output()
  with pytest.raises(ImportError, match="pip install arviz"):
    nuts.to_inference_data(samples, trace)
