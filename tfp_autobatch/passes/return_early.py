"""Early returns run in the step that tests for them: `Branch` -> `ReturnOr`.

A function that returns early (`if not first.ok: return first`) spends a
VM step on the test alone: the block ending in the branch, then one step
in whichever block each member went to. When one side of the branch is a
small return block R (plain single-example code, then `Return`) and the
other a block C that does not call the model, the testing block can run
both, each for its own members, and end in both ways at once:

    B: ...; c = ...                  B: ...; c = ...
       branch c ? R : C                 if c: <R's ops>
    R: _result = move(first)   ==>      if not c: <C's ops>
       return                           return if c, else <C's terminator>
    C: <ops>; <terminator>

Every block computes all rows of the batch anyway (the VM selects the
rows of the members it runs), so the merged block costs what B and C cost
together plus R's few ops, and each member saves the step it spent in R
or C. R and C stay in the program while other blocks still reach them.
Nothing is merged when R or C writes `c` (the guards read it after them),
pops a stack, or is B itself, or when R calls a `@batched_primitive`, or
C does and B does not (the schedule keeps blocks that call the model
waiting so that it runs for as many members as can reach it; a block
that already calls it may run a second call, guarded, for the members
that did not return). (A recursion's own entry test, `if depth == 0`, is
left alone for the first reason: the callers that run it, see
`branch_at_call`, write its condition again.)

NUTS's `build_tree` takes one VM step fewer per internal tree node: the
test of the first half's validity runs in the step that returns from it;
and its two-leaf case (leaf, test, leaf) is one step.
"""
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import ir2


def _small_return(block):
  return (isinstance(block.terminator, ir2.Return)
          and all(map(ir2.is_plain, block.ops)))


def _mergeable(block, into):
  """A block whose ops can run under a guard in block `into` (the VM runs
  plain code and pushes for some members; pops happen only after calls,
  not here). A call of the model may move only into a block that calls
  it already: the schedule keeps such blocks waiting for members."""
  return (not isinstance(block.terminator, ir2.ReturnOr)
          and all(ir2.is_plain(op) or isinstance(op, ir2.Push)
                  or (ir2.calls_batched_primitive(into)
                      and isinstance(op, ir2.Primitive))
                  for op in block.ops))


def _merged(block, cond, returning, other, when):
  """`block` running `returning` for members whose `cond` is `when` and
  `other` for the rest."""
  ops = (block.ops
         + tuple(ir2.Guarded(cond, when, op) for op in returning.ops)
         + tuple(ir2.Guarded(cond, not when, op) for op in other.ops))
  if isinstance(other.terminator, ir2.Return):
    terminator = ir2.Return()
  else:
    terminator = ir2.ReturnOr(cond, when, other.terminator)
  return ir2.Block(block.label, ops, terminator)


def return_early(program):
  """Merges each small early-return branch into the block that tests it."""
  by_label = {b.label: b for b in program.blocks}
  blocks = []
  for b in program.blocks:
    t = b.terminator
    if isinstance(t, ir2.Branch) and b.label not in (t.then_label,
                                                     t.else_label):
      then_block, else_block = by_label[t.then_label], by_label[t.else_label]
      for returning, other, when in ((then_block, else_block, True),
                                     (else_block, then_block, False)):
        if (returning is not other and _small_return(returning)
            and _mergeable(other, b)
            and t.cond not in {v for op in returning.ops + other.ops
                               for v in ir2.writes(op)}):
          b = _merged(b, t.cond, returning, other, when)
          break
    blocks.append(b)
  return program.replace(blocks=tuple(ir1.reachable(blocks, ir2.successors)))
