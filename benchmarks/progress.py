"""The benchmarks' progress bars: tqdm on stderr, or none at all."""
import sys

try:
  import tqdm
except ImportError:  # pragma: no cover - tqdm is in the "bench" extra.
  tqdm = None


def progress_bar(total, enabled, desc, unit, leave=True):
  """A tqdm bar of `total` `unit`s on stderr; None when not `enabled` or
  tqdm is missing (callers then skip their updates)."""
  if enabled and tqdm is not None:
    return tqdm.tqdm(total=total, desc=desc, unit=unit, leave=leave,
                     file=sys.stderr, dynamic_ncols=True)
  return None
