"""Tests of tail duplication (`passes/tail_duplicate.py`)."""
import numpy as np
import tensorflow as tf

import example_programs as programs
import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.passes import tail_duplicate

INT = [types_lib.TensorType(tf.int32, ())]
collatz = programs.PROGRAMS_BY_NAME["collatz_steps"].fn   # a while around an if


def test_tail_duplication_copies_join_and_loop_header_into_predecessors():
  # On the converted program: the pipeline makes collatz's `if` a select
  # first (`if_to_select`), which leaves no join to copy.
  program = tail_duplicate.tail_duplicate(pipeline.convert_program(collatz))
  labels = [b.label for b in program.entry.blocks]
  # The `if` join (`endif`) and the loop header (`while`) are gone: each
  # branch of the `if` now ends by testing the loop condition itself.
  assert not [l for l in labels if l.startswith(("endif", "while"))], labels
  branches = [b for b in program.entry.blocks
              if isinstance(b.terminator, ir1.Branch)]
  assert len(branches) == 4    # entry, body, then, else
  x = np.array([1, 7, 27, 97], np.int32)
  for backend in ("local:eager", "pc:xla"):
    np.testing.assert_array_equal(collatz(x, backend=backend),
                                  [0, 16, 111, 118])


def test_tail_duplication_removes_blocks_within_its_growth_bound():
  before = pipeline.convert_program(collatz)
  after = tail_duplicate.tail_duplicate(before)
  assert len(after.entry.blocks) < len(before.entry.blocks)
  grown = sum(len(b.ops) for b in after.entry.blocks)
  assert grown <= tail_duplicate.MAX_GROWTH * sum(
      len(b.ops) + 1 for b in before.entry.blocks)


@tab.batch
def _six_arms(n):
  if n == 0:
    y = n + 1
  elif n == 1:
    y = n * 3
  elif n == 2:
    y = n - 7
  elif n == 3:
    y = n * n
  elif n == 4:
    y = n + 9
  else:
    y = n
  return y + 1


def test_tail_duplication_counts_predecessors_once_a_round(monkeypatch):
  # Recounted at every jump they made the pass quadratic in blocks (1 s
  # for an `if` of 160 arms); now counted once a round and kept up to
  # date, with the same result.
  before = pipeline.convert_program(_six_arms)
  counts = []
  count = tail_duplicate._predecessors
  monkeypatch.setattr(tail_duplicate, "_predecessors",
                      lambda blocks: counts.append(1) or count(blocks))
  after = tail_duplicate.tail_duplicate(before)
  assert len(after.entry.blocks) < len(before.entry.blocks)
  assert len(counts) == 4, len(counts)   # rounds (20 before: a jump each)
  n = np.arange(-1, 7, dtype=np.int32)
  np.testing.assert_array_equal(_six_arms(n, backend="pc:graph"),
                                [_six_arms.run_unbatched(i) for i in n])


@tab.batch
def clamp(x):
  if x > 3:
    x = 3
  return x * 2


CLAMP_BEFORE = """\
def clamp(x) -> _result:
  entry:
    _cond0 = primitive(x) { _cond0 = __tab_ops__.truthy(x > 3) }
    branch _cond0 ? then1 : endif3
  then1:
    x = primitive() { x = 3 }
    jump endif3
  endif3:
    _result = primitive(x) { _result = x * 2 }
    return"""

CLAMP_AFTER = """\
def clamp(x) -> _result:
  entry:
    _cond0 = primitive(x) { _cond0 = __tab_ops__.truthy(x > 3) }
    branch _cond0 ? then1 : endif3
  then1:
    x = primitive() { x = 3 }
    _result = primitive(x) { _result = x * 2 }
    return
  endif3:
    _result = primitive(x) { _result = x * 2 }
    return"""


def test_golden_tail_duplicate():
  # The join `endif3` is copied into the `then` arm, which no longer jumps.
  before = pipeline.convert_program(clamp)
  assert str(before) == CLAMP_BEFORE
  assert str(tail_duplicate.tail_duplicate(before)) == CLAMP_AFTER
