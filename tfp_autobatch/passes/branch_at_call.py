"""Callers run their callee's entry test: `PushJump` -> `PushBranch`.

Every block a member passes through costs the batched program a VM step.
A function that begins with a test (`if depth == 0: ...`, a recursion's
base case) spends a whole step of every call just on that test: the entry
block computes a condition and branches. When the entry block is nothing
but plain single-example code ending in a `Jump` or `Branch`, the caller
can run that code itself, right after it has set the callee's parameters,
and go straight to the block the test picks:

    caller:  ...; F.n = move(x)              caller:  ...; F.n = move(x)
             pushjump F/entry, return to c   ==>      F.c = primitive(F.n) {...}
    F/entry: F.c = primitive(F.n) {...}               pushbranch F.c ? F/then
             branch F.c ? F/then : F/else                 : F/else, return to c

The members run exactly the code they ran before, in the same order, one
step sooner: the callee's code reads its parameters, which the caller has
just written, and no other member can observe the difference (each runs
its own rows). An entry block that touches a stack, calls the model
(`@batched_primitive`: it must stay where the schedule can gather members
for it) or ends in another call or a return is left alone. Entry blocks no
longer reachable afterwards are dropped. NUTS's `build_tree` takes one VM
step fewer per call (both recursive calls and the trajectory's).
"""
from tfp_autobatch import errors
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import ir2


def _foldable(block):
  """The entry block's ops can run in the caller's step."""
  return (all(map(ir2.is_plain, block.ops))
          and isinstance(block.terminator, (ir2.Jump, ir2.Branch)))


def _folded_call(caller, entry, call):
  """The caller's block ending in `entry`'s test instead of a jump to it."""
  match entry.terminator:
    case ir2.Jump(target):
      terminator = ir2.PushJump(target, call.return_label)
    case ir2.Branch(cond, then_label, else_label):
      terminator = ir2.PushBranch(cond, then_label, else_label,
                                  call.return_label)
    case _:
      raise errors.IRError(f"{entry.label}: cannot run {entry.terminator!r} "
                           "at a call site")
  return ir2.Block(caller.label, caller.ops + entry.ops, terminator)


def branch_at_call_sites(program):
  """Runs each foldable callee entry block in its callers' steps."""
  by_label = {b.label: b for b in program.blocks}
  blocks = []
  for b in program.blocks:
    t = b.terminator
    if isinstance(t, ir2.PushJump) and _foldable(by_label[t.target]):
      b = _folded_call(b, by_label[t.target], t)
    blocks.append(b)
  return program.replace(blocks=tuple(ir1.reachable(blocks, ir2.successors)))
