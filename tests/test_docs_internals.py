"""docs/internals.md shows the IR before and after each pass; this test runs
the pipeline on the page's example programs and checks that every IR line the
page prints is one the passes print, so the page cannot drift from the code.
"""
import pathlib
import re

import numpy as np

import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import ir2
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.passes import branch_at_call
from tfp_autobatch.passes import if_to_select
from tfp_autobatch.passes import infer_types
from tfp_autobatch.passes import inline
from tfp_autobatch.passes import lower
from tfp_autobatch.passes import redundant_copies
from tfp_autobatch.passes import return_early
from tfp_autobatch.passes import stack_optimize
from tfp_autobatch.passes import tail_duplicate

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "internals.md"


# The page's example programs, exactly as it writes them.
@tab.batch
def next_collatz(n):
  if n % 2 == 0:
    n = n // 2
  else:
    n = 3 * n + 1
  return n


@tab.batch
def collatz(n):
  steps = 0
  while n > 1:
    n = next_collatz(n)
    steps += 1
  return steps


@tab.batch
def fib(n):
  if n <= 1:
    return n
  return fib(n - 1) + fib(n - 2)


@tab.batch
def tri(n, scale):
  if n <= 1:
    return n * scale
  return tri(n - 1, scale) + tri(n - 2, scale) + n


@tab.batch
def climb(n):
  if n <= 0:
    return n
  first = climb(n - 1)
  if first > 5:
    return first
  return first + 1


def _printed_by_every_pass(fn, num_args):
  """Every IR line the pipeline prints for `fn` after each of its passes."""
  arg = np.array([3, 7], np.int64)
  arg_types = [types_lib.type_of_value(arg, batched=True)] * num_args
  printed = []
  program = pipeline.convert_program(fn)
  printed.append(ir1.format_program(program))
  for run in (lambda p: infer_types.infer_types(p, arg_types), inline.inline,
              if_to_select.if_to_select, tail_duplicate.tail_duplicate):
    program = run(program)
    printed.append(ir1.format_program(program))
  program = lower.lower_to_stack_program(program)
  printed.append(ir2.format_program(program))
  for run in stack_optimize.PASSES + (
      branch_at_call.branch_at_call_sites, return_early.return_early,
      redundant_copies.drop_redundant_copies):
    program = run(program)
    printed.append(ir2.format_program(program))
  return {line.rstrip() for text in printed for line in text.splitlines()}


def _code_blocks(text):
  """The page's fenced code blocks without a language (IR, grammar, errors)."""
  blocks, block, language = [], None, None
  for line in text.splitlines():
    if line.startswith("```"):
      if block is None:
        block, language = [], line[3:]
      else:
        if not language:
          blocks.append(block)
        block = None
    elif block is not None:
      block.append(line.rstrip())
  return blocks


_IR_START = re.compile(r"(def \w+\(|program\(|  [\w.]+:$|  \d+ \w|"
                       r"  (stacked|registers|temporaries):)")


def _ir_lines_of_page():
  """The lines of the page's code blocks that print IR, less elisions (a
  line `...`, or a `types:` line cut short)."""
  lines = []
  for block in _code_blocks(PAGE.read_text()):
    if block and _IR_START.match(block[0]):
      lines += [line for line in block
                if line.strip() not in ("", "...") and
                not (line.strip().startswith("types:") and "..." in line)]
  return lines


def test_every_ir_line_of_the_internals_page_is_printed_by_the_pipeline():
  printed = set()
  for fn, num_args in ((collatz, 1), (fib, 1), (tri, 2), (climb, 1)):
    printed |= _printed_by_every_pass(fn, num_args)
  lines = _ir_lines_of_page()
  assert len(lines) > 100   # the page's IR blocks were found
  missing = [line for line in lines if line not in printed]
  assert not missing, ("docs/internals.md shows IR the pipeline does not "
                      "print:\n" + "\n".join(missing))
