"""What the programs benchmark (`benchmarks/programs.py`) writes and prints:
the JSON results (`write_json`), a table of examples/sec (`format_table`),
our systems' speed over TFP's reference (`format_ratios`) and a plot of
examples/sec against batch size (`plot`).
"""
import json
import os

# Ratios printed when both systems were measured.
RATIO_PAIRS = (("pc:xla", "tfp_reference:xla"),
               ("pc:graph", "tfp_reference:graph"))


def write_json(path, machine, config, records, skipped):
  """Writes the results (atomically) to `path`."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  payload = {"machine": machine, "config": config, "records": records,
             "skipped": skipped}
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(payload, f, indent=1, sort_keys=False)
    f.write("\n")
  os.replace(tmp, path)


def fmt_rate(value):
  if value is None:
    return "-"
  if value >= 100:
    return "{:,.0f}".format(value)
  return "{:.3g}".format(value)


def format_table(records, systems=None):
  """A readable table: examples/sec (first-call seconds) per system."""
  if not records:
    return "(no measurements)"
  if systems is None:
    systems = []
    for r in records:
      if r["system"] not in systems:
        systems.append(r["system"])
  by_key = {(r["program"], r["batch_size"], r["system"]): r for r in records}
  programs = []
  for r in records:
    if r["program"] not in programs:
      programs.append(r["program"])
  header = ["program", "batch"] + list(systems)
  rows = []
  for program in programs:
    sizes = sorted({r["batch_size"] for r in records
                    if r["program"] == program})
    for size in sizes:
      row = [program, str(size)]
      for system in systems:
        r = by_key.get((program, size, system))
        if r is None:
          row.append("-")
        else:
          cell = "{} ({:.2f}s)".format(fmt_rate(r["examples_per_sec"]),
                                       r["first_call_sec"])
          if r.get("extrapolated"):
            cell += "*"
          if not r.get("correct", True):
            cell += " WRONG"
          row.append(cell)
      rows.append(row)
  widths = [max(len(h), *(len(row[i]) for row in rows))
            for i, h in enumerate(header)]
  lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)),
           "  ".join("-" * w for w in widths)]
  lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
  legend = "cells: examples/sec after warm-up (first-call seconds)"
  if any(r.get("extrapolated") for r in records):
    legend += "; * = python_loop rate extrapolated from its capped examples"
  lines.append(legend)
  return "\n".join(lines)


def format_ratios(records, pairs=RATIO_PAIRS):
  """Ratios of examples/sec, e.g. pc:xla / tfp_reference:xla."""
  by_key = {(r["program"], r["batch_size"], r["system"]): r for r in records}
  lines = []
  for ours, theirs in pairs:
    keys = sorted({(p, b) for (p, b, s) in by_key if s == ours} &
                  {(p, b) for (p, b, s) in by_key if s == theirs})
    if not keys:
      continue
    lines.append("examples/sec ratio {} / {}:".format(ours, theirs))
    for program, size in keys:
      a = by_key[(program, size, ours)]["examples_per_sec"]
      b = by_key[(program, size, theirs)]["examples_per_sec"]
      lines.append("  {:<8} batch {:>5}: {:8.2f}x".format(program, size,
                                                           a / b))
  return "\n".join(lines)


def plot(records, path):
  """Examples/sec against batch size, one panel per program."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  programs = []
  for r in records:
    if r["program"] not in programs:
      programs.append(r["program"])
  if not programs:
    return
  fig, axes = plt.subplots(1, len(programs), figsize=(6 * len(programs), 4.5),
                           squeeze=False)
  for ax, program in zip(axes[0], programs):
    systems = []
    for r in records:
      if r["program"] == program and r["system"] not in systems:
        systems.append(r["system"])
    for system in systems:
      rs = sorted((r for r in records
                   if r["program"] == program and r["system"] == system),
                  key=lambda r: r["batch_size"])
      style = "--" if system == "python_loop" else (
          ":" if system.startswith("tfp_reference") else "-")
      ax.plot([r["batch_size"] for r in rs],
              [r["examples_per_sec"] for r in rs], style, marker="o",
              label=system)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("examples / second")
    ax.set_title(program)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
