"""Liveness of IR-2 variables: which values may still be read.

A backward worklist fixpoint over the merged control-flow graph. A
call (`PushJump(callee, cont)`, or `PushBranch`, which enters one of two
callee blocks) flows both into the callee (its parameters are read
there) and to `cont` (the caller's variables are read after the call; the
caller-saves code makes that sound), except the callee's result, which the
callee always writes. `Return` has no successors: what a continuation reads
of the callee (its result) is live in the continuation.
"""
from tfp_autobatch.ir import ir2


def live_before(ops, terminator, live_out):
  """Variables live before each op of a block: a list, one set per op, plus
  the set live before the terminator as the last element."""
  live = set(live_out)
  if isinstance(terminator, ir2.ReturnOr):
    live.add(terminator.cond)
    terminator = terminator.otherwise
  if isinstance(terminator, (ir2.Branch, ir2.PushBranch)):
    live.add(terminator.cond)
  result = [frozenset(live)]
  for op in reversed(ops):
    live -= set(ir2.writes(op))
    live |= set(ir2.reads(op))
    result.append(frozenset(live))
  result.reverse()
  return result


def live_in(program):
  """`{label: variables live at the block's entry}` (a fixpoint)."""
  blocks = {b.label: b for b in program.blocks}
  preds = {label: set() for label in blocks}
  for b in program.blocks:
    for s in ir2.successors(b.terminator):
      preds[s].add(b.label)
  result = {label: frozenset() for label in blocks}
  work = list(blocks)
  while work:
    label = work.pop()
    b = blocks[label]
    out = _out(program, b, result)
    new = live_before(b.ops, b.terminator, out)[0]
    if new != result[label]:
      result[label] = new
      work.extend(preds[label])
  return result


def _out(program, block, live):
  t = ir2.call_of(block.terminator) or block.terminator
  if isinstance(t, ir2.CALLS):
    result = program.results[ir2.callee_of(t)]
    entered = frozenset().union(*(live[s] for s in ir2.entered(t)))
    return entered | (live[t.return_label] - {result})
  return frozenset().union(*(live[s] for s in ir2.successors(t)))


def live_out(program, live=None):
  live = live_in(program) if live is None else live
  return {b.label: _out(program, b, live) for b in program.blocks}
