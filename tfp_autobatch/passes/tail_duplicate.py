"""Tail duplication: copy small blocks into the blocks that jump to them.

Every executed block is one step of a batched runtime, and members that took
different branches of an `if` run its join block in separate steps. Copying
a small join block (and so a loop header into the ends of the loop body) into
each predecessor that ends in `Jump` to it removes those steps: a `while`
loop whose body is an `if` takes 3 steps per iteration instead of 5. The
copies read and write the same variables, so types and semantics are
unchanged; blocks left without predecessors are dropped. A jump target of
any size whose only predecessor is that jump is merged into it (no code
grows: the two blocks simply become one).
"""
import dataclasses

from tfp_autobatch.ir import ir1

MAX_OPS = 3        # only blocks this small are copied
MAX_GROWTH = 2.0   # and only while the function has at most this many x ops


def tail_duplicate(program):
  """Returns `program` with small jump targets copied into predecessors."""
  return dataclasses.replace(program, functions=tuple(
      _function(fn) for fn in program.functions))


def _copyable(block, entry_label):
  return (block.label != entry_label and len(block.ops) <= MAX_OPS
          and all(isinstance(op, ir1.Primitive) for op in block.ops))


def _predecessors(blocks):
  return ir1.predecessor_counts(blocks.values())


def _size(blocks):
  return sum(len(b.ops) + 1 for b in blocks.values())


def _function(fn):
  blocks = {b.label: b for b in fn.blocks}
  entry = fn.blocks[0].label
  budget = MAX_GROWTH * _size(blocks)
  changed = True
  while changed:
    changed = False
    # Kept up to date as blocks change (recounted at each jump, they made
    # the pass quadratic in blocks, slow on an `if` of 160 arms).
    predecessors, size = _predecessors(blocks), _size(blocks)
    for label, block in list(blocks.items()):
      match block.terminator:
        case ir1.Jump(target) if target != label:
          callee = blocks[target]
          merge = target != entry and predecessors[target] == 1
          if not merge and (not _copyable(callee, entry)
                            or size + len(callee.ops) > budget):
            continue
          blocks[label] = ir1.Block(label, block.ops + callee.ops,
                                    callee.terminator)
          predecessors[target] -= 1
          for successor in ir1.successors(callee.terminator):
            predecessors[successor] += 1
          size += len(callee.ops)
          changed = True
    kept = ir1.reachable([blocks[b.label] for b in fn.blocks
                          if b.label in blocks])
    blocks = {b.label: b for b in kept}
  return dataclasses.replace(fn, blocks=tuple(blocks.values()))
