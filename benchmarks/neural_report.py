"""The table and plot of `benchmarks.neural`'s results.

    python -m benchmarks.neural_report benchmarks/results/neural.json \
        [--plot=neural.png] [--batch_size=64]
"""
import collections
import json

from absl import app
from absl import flags

PEER = "dynet:agenda"
def _ours(system):
  return not system.startswith(("dynet", "tf_eager"))


def _by_point(result):
  points = collections.defaultdict(dict)
  for r in result["records"]:
    points[(r["workload"], r["mode"], r["threads"], r["batch_size"])][
        r["system"]] = r
  return points


def table(result, batch_size=64):
  """A markdown table at one batch size: every system's examples/s, and
  our fastest backend against DyNet's agenda batching."""
  points = _by_point(result)
  systems = sorted({r["system"] for r in result["records"]},
                   key=lambda s: (not _ours(s), s))
  header = (["workload", "mode", "threads"] + systems
            + ["best ours / dynet:agenda"])
  lines = ["| " + " | ".join(header) + " |",
           "|" + " --- |" * len(header)]
  for (workload, mode, threads, b), records in sorted(points.items()):
    if b != batch_size:
      continue
    cells = [workload, mode, str(threads)]
    for s in systems:
      r = records.get(s)
      cells.append("" if r is None else
                   f"{r['examples_per_sec']:.0f} ({r['first_call_sec']:.1f} s)")
    ours = [r for s, r in records.items() if _ours(s)]
    best = max(ours, key=lambda r: r["examples_per_sec"], default=None)
    peer = records.get(PEER)
    cells.append(f"{best['examples_per_sec'] / peer['examples_per_sec']:.2f}x"
                 f" ({best['system']})" if best and peer else "")
    lines.append("| " + " | ".join(cells) + " |")
  return (f"examples/s at batch {batch_size} (first call's seconds)\n"
          + "\n".join(lines))


def plot(result, path):
  """examples/s against batch size: a panel per workload and mode, a line
  per system (solid at the fewest threads, dashed at more)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  records = result["records"]
  workloads = sorted({r["workload"] for r in records})
  modes = sorted({r["mode"] for r in records})
  thread_counts = sorted({r["threads"] for r in records})
  systems = sorted({r["system"] for r in records})
  colors = dict(zip(systems, plt.cm.tab10.colors))
  fig, axes = plt.subplots(len(modes), len(workloads), squeeze=False,
                           figsize=(4.5 * len(workloads), 3.6 * len(modes)))
  for i, mode in enumerate(modes):
    for j, workload in enumerate(workloads):
      ax = axes[i][j]
      for s in systems:
        for t, style in zip(thread_counts, ("-", "--", ":")):
          rs = sorted((r for r in records if r["system"] == s
                       and r["workload"] == workload and r["mode"] == mode
                       and r["threads"] == t), key=lambda r: r["batch_size"])
          if rs:
            ax.plot([r["batch_size"] for r in rs],
                    [r["examples_per_sec"] for r in rs], style,
                    marker="o", ms=3, color=colors[s],
                    label=f"{s} ({t} thr)")
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      ax.set_title(f"{workload}, {mode}")
      ax.set_xlabel("batch size")
      ax.set_ylabel("examples / s")
      ax.grid(alpha=0.3)
  axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1, 1))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  with open(argv[1]) as f:
    result = json.load(f)
  print(table(result, flags.FLAGS.batch_size))
  if flags.FLAGS.plot:
    plot(result, flags.FLAGS.plot)


if __name__ == "__main__":
  # Defined only when run: `benchmarks.neural` imports this module and has
  # its own --plot.
  flags.DEFINE_string("plot", None, "Where to write the plot (PNG).")
  flags.DEFINE_integer("batch_size", 64, "The table's batch size.")
  app.run(main)
