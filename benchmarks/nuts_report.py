"""Tables and plots of the NUTS benchmark's records (`benchmarks/nuts.py`).

`format_table` (gradients/s per system and number of chains),
`format_details` (every measurement), `format_ratios` (pc:xla over each
system) and `plot` (the paper's Fig. 6 and Fig. 7 from the JSON records).
"""
import os

from benchmarks import nuts_systems
from benchmarks import programs_report

BASELINE = "pc:xla"


def label(record):
  """The system's name, with the trajectories per step when fused."""
  k = record.get("num_trajectories_per_step", 1)
  return record["system"] + ("" if k == 1 else f" k={k}")


def _labels(records):
  out = []
  for r in records:
    if label(r) not in out:
      out.append(label(r))
  return out


def _render(header, rows):
  widths = [max(len(h), *(len(row[i]) for row in rows))
            for i, h in enumerate(header)]
  lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)),
           "  ".join("-" * w for w in widths)]
  return lines + ["  ".join(c.rjust(w) for c, w in zip(row, widths))
                  for row in rows]


def format_table(records):
  """Gradients/s (utilisation) per problem and batch size, a column per
  system; * marks rates extrapolated from fewer chains."""
  if not records:
    return "(no measurements)"
  labels = _labels(records)
  by_key = {(r["problem"], r["batch_size"], label(r)): r for r in records}
  rows = []
  for problem in dict.fromkeys(r["problem"] for r in records):
    for batch in sorted({r["batch_size"] for r in records
                         if r["problem"] == problem}):
      row = [problem, str(batch)]
      for name in labels:
        r = by_key.get((problem, batch, name))
        row.append("-" if r is None else "{} ({:.2f}){}".format(
            programs_report.fmt_rate(r["grads_per_sec"]), r["utilization"],
            "*" if r.get("extrapolated") else ""))
      rows.append(row)
  lines = _render(["problem", "chains"] + labels, rows)
  lines.append("cells: model gradients/s used by the chains, summed over "
               "chains (utilisation = used / computed); * = per-chain rate "
               "extrapolated")
  rounds = sorted({r.get("rounds", 1) for r in records} - {1})
  if rounds:
    lines.append("rates: the median of {} timed rounds per cell, "
                 "interleaved across the systems (every round's rate: "
                 "round_grads_per_sec in the JSON)".format(
                     " or ".join(map(str, rounds))))
  return "\n".join(lines)


def format_details(records):
  """One line per record: every measurement."""
  def fmt(value, spec):
    return "-" if value is None else format(value, spec)
  rows = [[r["problem"], label(r), str(r["batch_size"]),
           programs_report.fmt_rate(r["grads_per_sec"]),
           fmt(r["utilization"], ".2f") + ("~" if r.get(
               "computed_is_estimate") else ""),
           fmt(r["sec_per_step"], ".4f"), fmt(r["first_call_sec"], ".1f"),
           fmt(r["accept_rate"], ".2f"), fmt(r["ess_per_sec"], ".3g")]
          for r in records]
  if not rows:
    return "(no measurements)"
  lines = _render(["problem", "system", "chains", "grads/s", "util",
                   "s/step", "first call s", "accept", "ESS/s"], rows)
  if any(r.get("computed_is_estimate") for r in records):
    lines.append("~ = computed gradients estimated (chains in lockstep)")
  return "\n".join(lines)


def format_steps_per_call(records):
  """A line saying which systems ran several steps per compiled call
  (`--steps_per_call`), or "" when every system ran one per call."""
  chained = sorted({(r["steps_per_call"], label(r)) for r in records
                    if r.get("steps_per_call", 1) > 1})
  if not chained:
    return ""
  return "steps per compiled call: " + ", ".join(
      f"{name} {n}" for n, name in chained) + "; the others one per call"


def format_ratios(records, base=BASELINE):
  """`base`'s gradients/s over each other system's, per batch size."""
  by_key = {(r["problem"], r["batch_size"], label(r)): r for r in records}
  others = [name for name in _labels(records) if name != base]
  keys = sorted({(p, b) for (p, b, s) in by_key if s == base})
  if not keys or not others:
    return ""
  rows = []
  for problem, batch in keys:
    ours = by_key[(problem, batch, base)]["grads_per_sec"]
    rows.append([problem, str(batch)] + [
        "-" if (problem, batch, name) not in by_key else "{:.2f}x".format(
            ours / by_key[(problem, batch, name)]["grads_per_sec"])
        for name in others])
  lines = [f"gradients/s of {base} over each system's (> 1: {base} faster)"]
  lines += _render(["problem", "chains"] + [f"/ {n}" for n in others], rows)
  return "\n".join(lines)


# A colour per system (fixed, so that plots compare); fused runs dashed.
_COLOURS = {"pc:xla": "C0", "pc:graph": "C1", "local:eager": "C2",
            "local:eager_xla": "C3", "unbatched": "C4",
            "tfp_reference": "C5", "tfp_iterative": "C6", "stan": "C7",
            "limit": "black", "limit_logp": "grey"}


def _style(record):
  fused = record.get("num_trajectories_per_step", 1) > 1
  return {"color": _COLOURS.get(record["system"], "C8"),
          "linestyle": ("-." if record["system"] in nuts_systems.LIMITS else
                        ":" if record["system"] in ("stan", "unbatched") else
                        "--" if fused else "-"),
          "marker": "s" if fused else "o"}


def plot(records, path):
  """The paper's Fig. 6 (gradients/s against chains, log-log) and Fig. 7
  (utilisation against chains), a row per problem."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  problems = list(dict.fromkeys(r["problem"] for r in records))
  if not problems:
    return
  fig, axes = plt.subplots(len(problems), 2, figsize=(12, 4.5 * len(problems)),
                           squeeze=False)
  for (ax_rate, ax_util), problem in zip(axes, problems):
    mine = [r for r in records if r["problem"] == problem]
    for name in _labels(mine):
      rs = sorted((r for r in mine if label(r) == name),
                  key=lambda r: r["batch_size"])
      sizes = [r["batch_size"] for r in rs]
      style = _style(rs[0])
      ax_rate.plot(sizes, [r["grads_per_sec"] for r in rs], label=name,
                   **style)
      if rs[0]["system"] not in nuts_systems.LIMITS + ("stan", "unbatched"):
        ax_util.plot(sizes, [r["utilization"] for r in rs], label=name,
                     **style)
    ax_rate.set_xscale("log", base=2)
    ax_rate.set_yscale("log")
    ax_rate.set_ylabel("model gradients / second (used, all chains)")
    ax_rate.set_title(f"{problem}: throughput (cf. Fig. 6)")
    ax_util.set_xscale("log", base=2)
    ax_util.set_ylim(0, 1.05)
    ax_util.set_ylabel("gradient utilisation (used / computed)")
    ax_util.set_title(f"{problem}: utilisation (cf. Fig. 7)")
    for ax in (ax_rate, ax_util):
      ax.set_xlabel("number of chains")
      ax.grid(True, which="both", alpha=0.3)
      if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)


# Performance goals for the logistic regression: (system, least ratio of
# pc:xla's gradients/s to the system's, from this many chains on).
TARGETS = (("tfp_reference", 1.5, 1), ("tfp_iterative", 1.0, 1),
           ("limit", 0.6, 64), ("stan", 1.0, 16))


def format_targets(records, targets=TARGETS, base=BASELINE,
                   problem="logistic_regression"):
  """Lines saying, per setting of `base` (unfused, and fused when measured)
  and per target, the measured ratios against the system's best setting
  at each number of chains, and whether the target is met (targets whose
  systems were not measured are left out)."""
  best = {}
  for r in records:
    if r["problem"] == problem:
      key = (r["system"], r["batch_size"])
      best[key] = max(best.get(key, 0.0), r["grads_per_sec"])
  ours = {(label(r), r["batch_size"]): r["grads_per_sec"] for r in records
          if r["problem"] == problem and r["system"] == base}
  lines = []
  for name in _labels([r for r in records if r["system"] == base]):
    for system, least, from_chains in targets:
      pairs = sorted((b, ours[(name, b)] / rate)
                     for (s, b), rate in best.items()
                     if s == system and b >= from_chains
                     and (name, b) in ours)
      if pairs:
        met = all(ratio >= least for _, ratio in pairs)
        lines.append("  {} >= {:g}x {} from {} chains: {} ({})".format(
            name, least, system, from_chains, "met" if met else "NOT met",
            ", ".join(f"{b} chains {_ratio_text(ratio, least)}x"
                      for b, ratio in pairs)))
  return lines


def _ratio_text(ratio, least):
  """`ratio` to two decimals, or to three where two would round it onto
  the other side of the target `least` (0.5987 of 0.6 printed 0.60, next
  to "NOT met")."""
  text = f"{ratio:.2f}"
  if (float(text) >= least) != (ratio >= least):
    text = f"{ratio:.3f}"
  return text


def report(records, skipped, machine=None):
  """Prints the tables, ratios and skips."""
  if machine is not None:
    print("Machine: {} ({} usable cores), TF {}, TFP {}, {}".format(
        machine["cpu_model"], machine["usable_cores"], machine["tensorflow"],
        machine["tensorflow_probability"], machine["date"]))
  mode = format_steps_per_call(records)
  if mode:
    print(mode)
  print(format_table(records))
  print()
  print(format_details(records))
  ratios = format_ratios(records)
  if ratios:
    print()
    print(ratios)
  if skipped:
    print("\nSkipped:")
    for s in skipped:
      print("  {} on {}{}: {}".format(
          s["system"], s["problem"], "" if s["batch_size"] is None else
          " from batch size {}".format(s["batch_size"]), s["reason"]))
