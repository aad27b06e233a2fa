"""Room on Python's stack for the runtimes that recurse in Python.

The local runtime and the reference interpreter run a batched function's
recursion as Python recursion, a few Python frames per level, so a
`max_stack_depth` of a few hundred would hit Python's default recursion
limit (1,000 frames) as a bare `RecursionError` before the program's own
bound. `room_for(levels, frames_per_level)` raises the limit for the
duration of a run so that the program's bound is what stops it.

The limit is one per process, so runs in several threads share it: it is
raised to what the most demanding of them needs and put back only when
the last one ends.
"""
import contextlib
import sys
import threading

# Frames above this many stay an error: Python's frames are cheap, but the
# interpreter's C stack is not unlimited, and a bound this deep is better
# served by the pc backends, whose stacks are tensors.
MAX_FRAMES = 50_000

_lock = threading.Lock()
_runs = 0             # runs inside `room_for` now, in every thread
_limit_before = None  # the limit before the first of them began


def _frames_in_use():
  depth, frame = 0, sys._getframe()   # pylint: disable=protected-access
  while frame is not None:
    depth, frame = depth + 1, frame.f_back
  return depth


@contextlib.contextmanager
def room_for(levels, frames_per_level):
  """Lets `levels` more levels of `frames_per_level` Python frames each
  run inside the block (Python's recursion limit raised, then restored)."""
  global _runs, _limit_before   # pylint: disable=global-statement
  wanted = _frames_in_use() + levels * frames_per_level + 100
  with _lock:
    if _runs == 0:
      _limit_before = sys.getrecursionlimit()
    _runs += 1
    sys.setrecursionlimit(max(sys.getrecursionlimit(),
                              min(wanted, MAX_FRAMES)))
  try:
    yield
  except RecursionError as e:
    if wanted <= MAX_FRAMES:
      raise
    raise RecursionError(
        "the local backends and the reference interpreter run recursion as "
        f"Python recursion, and {levels} levels (max_stack_depth) may need "
        f"more than the {MAX_FRAMES:,} Python frames they use at most; run "
        "such deep recursion on a pc backend, whose stacks are tensors"
    ) from e
  finally:
    with _lock:
      _runs -= 1
      if _runs == 0:
        sys.setrecursionlimit(_limit_before)
