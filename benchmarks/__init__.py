"""Command-line benchmarks (absl flags), run from the repository root.

`quiet` is imported first so that TensorFlow starts without its start-up
lines, whichever benchmark is run."""
from benchmarks import quiet  # pylint: disable=unused-import
