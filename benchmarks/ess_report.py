"""Measurements, table and plot of the ESS benchmark (`benchmarks/ess.py`).

Per run (`metrics`), on the draws mapped to the quantities with ground
truth (`Model.to_truth`): ArviZ's rank-normalised bulk and tail ESS of
every coordinate, over the sampling seconds; `min_ess_per_s` is the
smallest of all of them (bulk and tail, every coordinate),
`median_ess_per_s` the median bulk ESS/s over coordinates; the largest
rank-normalised split R-hat; the divergences and leapfrogs per draw (per
trajectory, for fused steps); and `max_error_mcse`, the largest
|mean - ground truth| over coordinates in units of its Monte Carlo
standard error (ArviZ's MCSE of the mean, combined with the ground
truth's own standard error): a correct sampler gives values
that a max of that many |N(0, 1)| gives (about 3 for 100 coordinates).
Per cell (model, chains, system), `aggregate` takes every number's median
over the rounds.
"""
import arviz
import numpy as np

ROUND_FIELDS = ("first_call_s", "compile_s", "warmup_s", "sampling_s",
                "min_ess_bulk", "median_ess_bulk", "min_ess_tail",
                "min_ess_per_s", "median_ess_per_s", "max_rhat",
                "divergences", "leapfrogs_per_draw", "max_error_mcse",
                "step_size")


def metrics(run, truth_draws, truth_mean, truth_mcse):
  """The measurements of one run (`ess_harness.RunResult`), its draws
  mapped to the truth's quantities ([chains, draws, m]); the truth's own
  standard errors `truth_mcse` join the run's in the error's unit."""
  data = arviz.convert_to_dataset(np.asarray(truth_draws, np.float64))
  bulk = arviz.ess(data, method="bulk")["x"].values
  tail = arviz.ess(data, method="tail")["x"].values
  sampling_s = run.sampling_s
  out = {
      "first_call_s": run.first_call_s,
      "compile_s": run.first_call_s - run.repeat_s,
      "warmup_s": run.warmup_s, "sampling_s": sampling_s,
      "min_ess_bulk": float(np.min(bulk)),
      "median_ess_bulk": float(np.median(bulk)),
      "min_ess_tail": float(np.min(tail)),
      "min_ess_per_s": float(min(np.min(bulk), np.min(tail)) / sampling_s),
      "median_ess_per_s": float(np.median(bulk) / sampling_s),
      "max_rhat": float(np.max(arviz.rhat(data)["x"].values)),
      "divergences": int(np.sum(run.divergences)),
      # A fused step's leapfrogs are its k trajectories'; each gave a draw.
      "leapfrogs_per_draw": float(np.sum(run.leapfrogs)) / (
          run.draws.shape[0] * run.draws.shape[1]),
      "max_error_mcse": None, "step_size": run.step_size,
  }
  if truth_mean is not None:
    mcse = np.hypot(arviz.mcse(data, method="mean")["x"].values,
                    truth_mcse)
    error = np.abs(np.mean(truth_draws, (0, 1)) - truth_mean)
    with np.errstate(divide="ignore", invalid="ignore"):
      out["max_error_mcse"] = float(np.max(error / mcse))
  return out


def aggregate(rounds):
  """The median over rounds of every number (None where none was given)."""
  out = {}
  for field in ROUND_FIELDS:
    values = [r[field] for r in rounds if r.get(field) is not None]
    out[field] = float(np.median(values)) if values else None
  return out


def _fmt(value, spec):
  return "-" if value is None else format(value, spec)


def _times(ratio):
  return "-" if ratio is None else f"{ratio:.2f}x"


def format_table(records):
  """Markdown table of the records (one per model, chains and system), with
  ours against TFP's on min-ESS/s and first call."""
  tfp_cells = {(r["model"], r["num_chains"]): r for r in records
               if r["system"] == "tfp"}
  lines = ["| model | chains | system | first call s | warm-up s | "
           "sampling s | min ESS/s | median ESS/s | vs TFP min ESS/s | "
           "vs TFP first call | R-hat | div. | leapfrogs/draw | "
           "max err/MCSE |",
           "|" + " --- |" * 14]
  for r in records:
    m = r["median"]
    peer = tfp_cells.get((r["model"], r["num_chains"]))
    ratio = first = None
    if peer is not None and r["system"] != "tfp":
      p = peer["median"]
      if p["min_ess_per_s"]:
        ratio = m["min_ess_per_s"] / p["min_ess_per_s"]
      if p["first_call_s"]:
        first = m["first_call_s"] / p["first_call_s"]
    lines.append(
        f"| {r['model']} | {r['num_chains']} | {r['label']} | "
        f"{_fmt(m['first_call_s'], '.1f')} | {_fmt(m['warmup_s'], '.2f')} | "
        f"{_fmt(m['sampling_s'], '.2f')} | {_fmt(m['min_ess_per_s'], '.1f')} "
        f"| {_fmt(m['median_ess_per_s'], '.1f')} | {_times(ratio)} | "
        f"{_times(first)} | {_fmt(m['max_rhat'], '.3f')} | "
        f"{_fmt(m['divergences'], '.0f')} | "
        f"{_fmt(m['leapfrogs_per_draw'], '.1f')} | "
        f"{_fmt(m['max_error_mcse'], '.1f')} |")
  return "\n".join(lines)


def plot(records, path):
  """Min-ESS/s and first-call seconds against chains, a column per model,
  a line per system."""
  import matplotlib   # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot   # pylint: disable=g-import-not-at-top
  models = sorted({r["model"] for r in records})
  labels = list(dict.fromkeys(r["label"] for r in records))
  fig, axes = pyplot.subplots(2, len(models), squeeze=False,
                              figsize=(4 * len(models), 7))
  for col, model in enumerate(models):
    for row, (field, title) in enumerate(
        (("min_ess_per_s", "min ESS/s (sampling)"),
         ("first_call_s", "first call s"))):
      ax = axes[row][col]
      for label in labels:
        cells = sorted((r["num_chains"], r["median"][field]) for r in records
                       if r["model"] == model and r["label"] == label
                       and r["median"][field])
        if cells:
          ax.plot(*zip(*cells), marker="o", label=label)
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      ax.set_xlabel("chains")
      ax.set_title(f"{model}: {title}", fontsize=9)
      ax.grid(True, alpha=0.3)
  axes[0][0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  pyplot.close(fig)
