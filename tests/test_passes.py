"""IR-1 passes other than type inference."""
import numpy as np
import tensorflow as tf

import programs
from tfp_autobatch import pipeline
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.passes import tail_duplicate

INT = [types_lib.TensorType(tf.int32, ())]
collatz = programs.PROGRAMS_BY_NAME["collatz_steps"].fn   # a while around an if


def test_tail_duplication_copies_join_and_loop_header_into_predecessors():
  program = pipeline.typed_program(collatz, INT)
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
