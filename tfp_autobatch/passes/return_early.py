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
pops a stack, pushes one that B pushes (the VM applies a block's pushes
when it is done, one per stack), or is B itself, or when R calls a
`@batched_primitive`, or
C does and B does not (the schedule keeps blocks that call the model
waiting so that it runs for as many members as can reach it; a block
that already calls it may run a second call, guarded, for the members
that did not return). (A recursion's own entry test, `if depth == 0`, is
left alone for the first reason: the callers that run it, see
`branch_at_call`, write its condition again.)

Merging repeats down a chain of early returns (test, return or go on,
test again, ...): once the block ends in `return if c, else branch c2 ?
R2 : C2`, R2 and C2 move in too, under two new guards computed at the end
of the block's own ops from `c` and `c2` (`c2` is junk on the rows that
returned at `c`, which both guards exclude), and the block returns for
the members of either test. A block merges each other block at most once.

NUTS's `build_tree` takes one VM step fewer per internal tree node: the
test of the first half's validity runs in the step that returns from it;
and its two-leaf case (leaf, test, leaf) is one step.
"""
import dataclasses

import tensorflow as tf

from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import ir2
from tfp_autobatch.ir import types as types_lib


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


def _pushed(ops):
  """The variables `ops` push: a block may push a variable once, after its
  other uses of that stack (the VM applies pushes when the block is done;
  `other` blocks merged in never pop)."""
  return {ir2.unguarded(op).var for op in ops
          if isinstance(ir2.unguarded(op), ir2.Push)}


def _merged(block, returning, returning_guard, other, other_guard):
  """`block` running `returning` for the members of `returning_guard` and
  `other` for those of `other_guard` (guards are `(cond, when)`: the
  members whose `cond` is `when`); the others return."""
  ops = (block.ops
         + tuple(ir2.Guarded(*returning_guard, op) for op in returning.ops)
         + tuple(ir2.Guarded(*other_guard, op) for op in other.ops))
  if isinstance(other.terminator, ir2.Return):
    terminator = ir2.Return()
  else:
    cond, when = other_guard
    terminator = ir2.ReturnOr(cond, not when, other.terminator)
  return ir2.Block(block.label, ops, terminator)


def _chain_guards(returned, returned_when, cond, when):
  """The code of a chained merge's guards `(returns, goes_on)`: of the
  members that did not return at `returned` (`returned_when`), those whose
  `cond` is `when`, and the others."""
  def fn(returned_value, cond_value):
    on = tf.not_equal(tf.cast(returned_value, tf.bool), returned_when)
    hit = tf.equal(tf.cast(cond_value, tf.bool), when)
    return tf.logical_and(on, hit), tf.logical_and(on, tf.logical_not(hit))
  return ir1.Code(
      fn, f"on = {returned} != {returned_when}; returns = on and {cond} == "
      f"{when}; goes_on = on and {cond} != {when}", __file__, 0)


def _merge_once(block, by_label, merged):
  """`(block with one more early return merged in, new guard variables)`,
  or `(None, ())` when there is none to merge. `merged` holds the labels
  merged into `block` so far (and its own), and gets the new ones."""
  t = block.terminator
  returned = None
  if isinstance(t, ir2.ReturnOr) and isinstance(t.otherwise, ir2.Branch):
    returned, returned_when, t = t.cond, t.when, t.otherwise
  if not isinstance(t, ir2.Branch):
    return None, ()
  then_block, else_block = by_label[t.then_label], by_label[t.else_label]
  for ret, other, when in ((then_block, else_block, True),
                           (else_block, then_block, False)):
    if (ret is other or {ret.label, other.label} & merged
        or not _small_return(ret) or not _mergeable(other, block)):
      continue
    written = {v for op in ret.ops + other.ops for v in ir2.writes(op)}
    if (t.cond in written or returned in written
        or _pushed(other.ops) & _pushed(block.ops)):
      continue
    merged.update((ret.label, other.label))
    if returned is None:
      return _merged(block, ret, (t.cond, when), other,
                     (t.cond, not when)), ()
    # Down a chain: `goes_on` (neither test returned) guards `other` and,
    # false, makes the block return; `ret` runs for `returns` alone (not
    # for the members that returned at the test before).
    base = f"{t.cond}.chain{len(merged) // 2}"
    returns, goes_on = f"{base}.returns", f"{base}.goes_on"
    guards = ir2.Primitive(
        (returns, goes_on), _chain_guards(returned, returned_when, t.cond,
                                          when), (returned, t.cond))
    with_guards = dataclasses.replace(block, ops=block.ops + (guards,))
    return (_merged(with_guards, ret, (returns, True), other, (goes_on, True)),
            (returns, goes_on))
  return None, ()


def return_early(program):
  """Merges each small early-return branch into the block that tests it,
  and down chains of them."""
  by_label = {b.label: b for b in program.blocks}
  # Only the blocks still reached are merged, from the first: each
  # merges from the blocks as they were, so that gives what merging every
  # block would, without a block of a chain of n guard clauses merging
  # the rest of the chain itself only to be dropped (n**2 merges, each
  # over a growing block: seconds for 160 clauses).
  done, guards, todo = {}, set(), [program.blocks[0].label]
  while todo:
    label = todo.pop()
    if label in done:
      continue
    b, merged = by_label[label], {label}
    while True:
      new, names = _merge_once(b, by_label, merged)
      if new is None:
        break
      b = new
      guards.update(names)
    done[label] = b
    todo.extend(ir2.successors(b.terminator))
  blocks = tuple(done[b.label] for b in program.blocks if b.label in done)
  # The guards of blocks still reached (a block merged into another may
  # have merged a chain of its own, and be gone).
  guards &= {v for b in blocks for op in b.ops for v in ir2.writes(op)}
  types = dict(program.types)
  types.update({g: types_lib.TensorType(tf.bool, ()) for g in guards})
  return program.replace(blocks=blocks, types=types,
                         temporaries=program.temporaries | guards)
