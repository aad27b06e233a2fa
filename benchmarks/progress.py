"""The benchmarks' progress bars: tqdm on stderr when it is a terminal, or
none at all (a bar redrawn into a log file or a pipe is noise)."""
import sys

try:
  import tqdm
except ImportError:  # pragma: no cover - tqdm is in the "bench" extra.
  tqdm = None


def progress_bar(total, enabled, desc, unit, leave=True):
  """A tqdm bar of `total` `unit`s on stderr; None when not `enabled`,
  stderr is not a terminal or tqdm is missing (callers then skip their
  updates)."""
  if enabled and tqdm is not None and sys.stderr.isatty():
    return tqdm.tqdm(total=total, desc=desc, unit=unit, leave=leave,
                     file=sys.stderr, dynamic_ncols=True)
  return None
