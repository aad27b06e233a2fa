"""The stack optimisations of paper section 3.2, one pure function each.

Reads and writes of a stacked variable must gather and scatter at each
member's stack pointer; these passes make as few variables stacked as
possible, and make the stacked ones cheap:

  1. per-variable caller-saves stacks: done by `lower.lower_to_stack_program`
     (`save="live"`; `save="all"` is the naive discipline);
  2. `find_temporaries`: a variable not live into any block (a VM step)
     lives only inside a block execution, never in the VM state;
  3. `drop_unclobbered_saves`: a variable saved around a call that nothing
     the call runs assigns (no recursion back into its function, or a
     parameter that recursive calls only pass on) keeps its value in place:
     no stack, just a top updated by mask;
  4. `cache_stack_tops`: keep each stack's top beside the stack, so reads
     and writes of the current value need no gather/scatter;
  5. `fuse_pop_push`: `Pop v ... Push v` in one block, with no write of `v`
     between, becomes `Update v` (restore the current value, leave the saved
     copy on the stack). The paper says "no read between": there every
     assignment pushes; here assignments write the current value and the
     stack only holds saved copies, so reads between are fine and writes are
     what must not intervene.

A non-recursive program ends with no variable stacks at all: only the
program counter has one.
"""
from tfp_autobatch.analysis import liveness
from tfp_autobatch.ir import ir2


function_of = ir2.function_of


def call_reach(program):
  """`{function: functions a call of it may run}`, itself included."""
  direct = {}
  for b in program.blocks:
    direct.setdefault(function_of(b.label), set())
    if isinstance(b.terminator, ir2.CALLS):
      direct[function_of(b.label)].add(ir2.callee_of(b.terminator))
  reach = {}
  for f in direct:
    seen, stack = {f}, [f]
    while stack:
      for g in direct.get(stack.pop(), ()):
        if g not in seen:
          seen.add(g)
          stack.append(g)
    reach[f] = frozenset(seen)
  return reach


def assigned_by_function(program):
  """`{function: variables its blocks assign}`: written by a Move or a
  Primitive (guarded or not), not counting the stack's own Pops and
  Updates."""
  assigned = {}
  for b in program.blocks:
    vs = assigned.setdefault(function_of(b.label), set())
    for op in b.ops:
      if not isinstance(ir2.unguarded(op), (ir2.Pop, ir2.Update)):
        vs.update(ir2.writes(op))
  return assigned


def drop_unclobbered_saves(program):
  """Optimisation 3: no Push/Pop of a variable around a call that cannot
  write it: no function the call may run assigns it. That holds when the
  variable's own function is not reachable from the callee (no recursion
  back into it), and also for a parameter a recursive function only ever
  passes on unchanged (the call moves nothing into it, see `lower`): the
  callee's own saves and restores of it then only ever hold the one value
  it had at the call."""
  reach = call_reach(program)
  assigned = assigned_by_function(program)
  drop = {}      # block label -> variables whose Push/Pop there goes
  for b in program.blocks:
    t = b.terminator
    if isinstance(t, ir2.CALLS):
      clobbered = set().union(*(assigned.get(f, ()) for f in
                                reach[ir2.callee_of(t)]))
      safe = {op.var for op in b.ops if isinstance(op, ir2.Push)
              and op.var not in clobbered}
      drop.setdefault(b.label, set()).update(("push", v) for v in safe)
      drop.setdefault(t.return_label, set()).update(("pop", v) for v in safe)
  blocks = []
  for b in program.blocks:
    gone = drop.get(b.label, set())
    ops = tuple(op for op in b.ops
                if not (isinstance(op, ir2.Push) and ("push", op.var) in gone)
                and not (isinstance(op, ir2.Pop) and ("pop", op.var) in gone))
    blocks.append(ir2.Block(b.label, ops, b.terminator))
  return program.replace(blocks=tuple(blocks))


def fuse_pop_push(program):
  """Optimisation 5: `Pop v; (no write of v); Push v` -> `Update v`."""
  blocks = []
  for b in program.blocks:
    ops = list(b.ops)
    i = 0
    while i < len(ops):
      op = ops[i]
      if isinstance(op, ir2.Pop):
        for j in range(i + 1, len(ops)):
          later = ops[j]
          if isinstance(later, ir2.Push) and later.var == op.var:
            ops[i] = ir2.Update(op.var)
            del ops[j]
            break
          if op.var in ir2.writes(later):
            break
      i += 1
    blocks.append(ir2.Block(b.label, tuple(ops), b.terminator))
  return program.replace(blocks=tuple(blocks))


def find_temporaries(program):
  """Optimisation 2: variables live into no block are temporaries."""
  live = liveness.live_in(program)
  kept = set(program.stacked) | {program.result}
  for vs in live.values():
    kept |= vs
  return program.replace(temporaries=frozenset(set(program.types) - kept))


def cache_stack_tops(program):
  """Optimisation 4: store each stack's top separately from the stack."""
  return program.replace(cached_top=True)


PASSES = (drop_unclobbered_saves, fuse_pop_push, find_temporaries,
          cache_stack_tops)


def optimize(program, check=None):
  """All optimisations in order; `check(program, pass_name)` after each."""
  for p in PASSES:
    program = p(program)
    if check is not None:
      check(program, p.__name__)
  return program
