"""ArviZ output: `to_inference_data` and a one-call `summary`.

Draws come as `[draw, chain..., event...]` (`windowed_adaptive_nuts`,
`tfp.mcmc.sample_chain`); ArviZ wants `[chain, draw, event...]`, with the
sample statistics under its names. Several chain dimensions (an `n_chains`
shape) become one ArviZ chain dimension. ArviZ is optional and imported
when these are called. Both its APIs work: 1.x (`arviz` >= 1, or
`arviz-base` with `arviz-stats`), whose data is an `xarray.DataTree`, and
0.x, whose data is an `arviz.InferenceData`; the groups, names and
`summary` columns are the same in both.
"""
import collections
import typing

import numpy as np

__all__ = ["to_inference_data", "summary", "SAMPLE_STATS_NAMES"]

# Our trace keys (`windowed_adaptive_nuts`' default trace) -> ArviZ's names.
SAMPLE_STATS_NAMES = {
    "diverging": "diverging",
    "tree_depth": "tree_depth",
    "energy": "energy",
    "step_size": "step_size",
    "n_steps": "n_steps",
    "accept_ratio": "acceptance_rate",
    "target_log_prob": "lp",
    "is_accepted": "is_accepted",
    # A trace that uses ArviZ's names already.
    "acceptance_rate": "acceptance_rate",
    "lp": "lp",
}


class _ArviZ(typing.NamedTuple):
  """The two calls we need, in whichever ArviZ API is installed."""
  from_groups: typing.Callable   # {group: {name: array}} -> data
  summary: typing.Callable       # arviz.summary
  data_type: type                # what from_groups returns


def _arviz():
  """The installed ArviZ's API: `arviz`'s own (1.x or 0.x), or without
  `arviz`, 1.x's through `arviz-base` and `arviz-stats`."""
  try:
    import arviz  # pylint: disable=g-import-not-at-top  (optional)
  except ImportError:
    arviz = None
  if arviz is not None and int(arviz.__version__.split(".")[0]) < 1:
    return _ArviZ(lambda groups: arviz.from_dict(**groups, save_warmup=True),
                  arviz.summary, arviz.InferenceData)
  if arviz is not None:   # 1.x: arviz re-exports arviz-base and -stats
    base = stats = arviz
  else:
    try:
      import arviz_base as base  # pylint: disable=g-import-not-at-top
      import arviz_stats as stats  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError("nuts.to_inference_data and nuts.summary need "
                        "ArviZ: pip install arviz") from e
  import xarray  # pylint: disable=g-import-not-at-top  (ArviZ's dependency)
  return _ArviZ(lambda groups: base.from_dict(groups, save_warmup=True),
                stats.summary, xarray.DataTree)


def _named_draws(draws, var_names):
  """`{name: array}` from a dict, a namedtuple, a list or one tensor."""
  if isinstance(draws, dict):
    items = dict(draws)
  elif hasattr(draws, "_asdict"):
    items = dict(draws._asdict())
  elif isinstance(draws, (list, tuple)):
    items = {f"x{i}": x for i, x in enumerate(draws)}
  else:
    items = {"x": draws}
  if var_names is not None:
    values = list(items.values())
    if len(var_names) != len(values):
      raise ValueError(f"var_names has {len(var_names)} names for "
                       f"{len(values)} variables")
    items = dict(zip(var_names, values))
  out = {}
  for name, value in items.items():
    if isinstance(value, (dict, list, tuple)):   # nested structures
      for sub, v in _named_draws(value, None).items():
        out[f"{name}.{sub}"] = v
    else:
      out[name] = np.asarray(value)
  return out


def _trace_from_kernel_results(results):
  """Sample statistics from traced NUTS kernel results (possibly inside
  adaptation or transformed-kernel results)."""
  while hasattr(results, "inner_results"):
    results = results.inner_results
  n_steps = np.asarray(results.leapfrogs_taken)
  step = results.step_size
  if isinstance(step, (list, tuple)):
    step = step[0]
  return {
      "diverging": results.has_divergence,
      "n_steps": n_steps,
      "tree_depth": np.ceil(np.log2(n_steps + 1.)).astype(np.int64),
      "energy": -np.asarray(results.energy),
      "accept_ratio": np.exp(np.minimum(np.asarray(
          results.log_accept_ratio), 0.)),
      "target_log_prob": results.target_log_prob,
      "step_size": step,
  }


def _chain_first(x, draws, chains, chain_ndims):
  """`[draw, chain..., event...]` -> `[chain, draw, event...]` (chains
  flattened); a per-draw value (a shared step size) is repeated over
  chains."""
  x = np.asarray(x)
  if x.ndim >= 1 + chain_ndims and x.shape[0] == draws:
    lead = x.shape[1:1 + chain_ndims]
    if int(np.prod(lead)) == chains:
      x = x.reshape((draws, chains) + x.shape[1 + chain_ndims:])
      return np.swapaxes(x, 0, 1)
  if x.shape == (draws,):   # one value per draw
    return np.broadcast_to(x, (chains, draws)).copy()
  raise ValueError(f"cannot align a trace of shape {x.shape} with "
                   f"{draws} draws of {chains} chains")


def to_inference_data(draws, trace=None, *, chain_ndims=None,
                      var_names=None, warmup=None):
  """ArviZ's data (`xarray.DataTree` in 1.x, `InferenceData` in 0.x) from
  our draws and trace.

  Args:
    draws: the draws `windowed_adaptive_nuts` or `tfp.mcmc.sample_chain`
      returns: a dict, namedtuple, list or tensor, each `[draw, chain...,
      ...]`.
    trace: the trace: `windowed_adaptive_nuts`' default (a dict), or our
      kernel's results as `sample_chain` traced them (also inside
      adaptation kernels). Its statistics go to `sample_stats` under
      ArviZ's names (`diverging`, `tree_depth`, `energy`, `step_size`,
      `n_steps`, `acceptance_rate`, `lp`); other keys are dropped.
    chain_ndims: how many dimensions after the draws are chains; by
      default the rank of the trace's per-chain statistics (else 1).
    var_names: names for the variables of a list (default x0, x1, ...).
    warmup: a `[draws]` bool mask of warm-up draws (default: the trace's
      `tune` when it has one); those go to ArviZ's warm-up groups.
  """
  az = _arviz()
  stats = {}
  if trace is not None:
    if not isinstance(trace, dict):
      trace = _trace_from_kernel_results(trace)
    stats = {SAMPLE_STATS_NAMES[k]: np.asarray(v) for k, v in trace.items()
             if k in SAMPLE_STATS_NAMES}
    if warmup is None and "tune" in trace:
      warmup = np.asarray(trace["tune"])
  posterior = _named_draws(draws, var_names)
  first = next(iter(posterior.values()))
  num_draws = first.shape[0]
  if chain_ndims is None:
    per_chain = [v for k, v in stats.items() if k != "step_size"]
    chain_ndims = per_chain[0].ndim - 1 if per_chain else 1
  chains = int(np.prod(first.shape[1:1 + chain_ndims]))
  posterior = {k: _chain_first(v, num_draws, chains, chain_ndims)
               for k, v in posterior.items()}
  stats = {k: _chain_first(v, num_draws, chains, chain_ndims)
           for k, v in stats.items()}
  groups = {"posterior": posterior, "sample_stats": stats}
  if warmup is not None and np.any(warmup):
    tune = np.asarray(warmup, bool)
    groups = {prefix + name: {k: v[:, mask] for k, v in group.items()}
              for prefix, mask in (("", ~tune), ("warmup_", tune))
              for name, group in groups.items()}
  return az.from_groups({name: group for name, group in groups.items()
                         if group})


Summary = collections.namedtuple("Summary", ["table", "divergences",
                                             "num_draws", "num_chains"])


def summary(draws_or_idata, trace=None, **kwargs):
  """R-hat, bulk and tail ESS, and the divergences, in one call.

  Args:
    draws_or_idata: `to_inference_data`'s result, or draws as
      `to_inference_data` takes them.
    trace: the trace, when draws are given.
    **kwargs: passed to ArviZ's `summary` (`var_names`, ...; the
      interval is `hdi_prob` in 0.x, `ci_prob` in 1.x).

  Returns:
    `Summary(table, divergences, num_draws, num_chains)`: `table` is
    ArviZ's `summary` DataFrame (mean, sd, a credible interval, MCSE,
    `ess_bulk`, `ess_tail`, `r_hat`), `divergences` the divergent transitions among the
    posterior draws (None without a `diverging` statistic). Printing it
    shows both.
  """
  az = _arviz()
  idata = draws_or_idata
  if not isinstance(idata, az.data_type):
    idata = to_inference_data(draws_or_idata, trace)
  table = az.summary(idata, **kwargs)
  divergences = None
  stats = getattr(idata, "sample_stats", None)
  if stats is not None and "diverging" in stats:
    divergences = int(stats["diverging"].values.sum())
  posterior = idata.posterior
  return _PrintableSummary(table, divergences, posterior.sizes["draw"],
                           posterior.sizes["chain"])


class _PrintableSummary(Summary):
  __slots__ = ()

  def __str__(self):
    lines = [self.table.to_string(),
             f"{self.num_chains} chains x {self.num_draws} draws"]
    if self.divergences is not None:
      lines[-1] += f"; {self.divergences} divergent transitions"
    return "\n".join(lines)

  def _repr_html_(self):
    html = self.table._repr_html_()   # pylint: disable=protected-access
    note = f"{self.num_chains} chains x {self.num_draws} draws"
    if self.divergences is not None:
      note += f"; {self.divergences} divergent transitions"
    return html + f"<p>{note}</p>"
