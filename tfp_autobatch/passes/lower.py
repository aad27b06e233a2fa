"""Lowering IR-1 to IR-2: merge the functions, make calls explicit stack code.

Every function reachable from the entry contributes its blocks, labels and
variables prefixed with its name ("fib/entry", "fib.n"). A block is split
after each `Call y = F(x)`:

    ... ops before the call
    Push(v) for each saved v        (caller-saves, optimisation 1)
    Move(F.params := x)             parallel, so f(b, a) cannot clobber;
                                    a parameter passed on to itself is
                                    left out
    PushJump(F/entry, cont)
  cont:
    Move(y := F.result)
    Pop(v) for each saved v, in reverse
    ... ops after the call

`save="live"` saves exactly the caller's variables live across the call
(per-variable caller-saves, paper section 3.2 item 1); `save="all"` saves
every variable of the caller, the naive discipline it improves on.
"""
from tfp_autobatch import errors
from tfp_autobatch.analysis import liveness
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import ir2


def qualify(function, var):
  return f"{function}.{var}"


def label_of(function, label):
  return f"{function}/{label}"


def reachable_functions(program):
  """Function names reachable from the entry by calls, entry first."""
  order, seen = [], set()
  queue = [program.entry.name]
  while queue:
    name = queue.pop(0)
    if name in seen:
      continue
    seen.add(name)
    order.append(name)
    for b in program.function(name).blocks:
      queue.extend(op.callee for op in b.ops if isinstance(op, ir1.Call))
  return order


def call_graph_reach(program):
  """`{function: functions it may (transitively) call, itself excluded
  unless recursive}`."""
  direct = {f.name: {op.callee for b in f.blocks for op in b.ops
                     if isinstance(op, ir1.Call)} for f in program.functions}
  reach = {}
  for name in direct:
    seen, stack = set(), list(direct[name])
    while stack:
      g = stack.pop()
      if g not in seen:
        seen.add(g)
        stack.extend(direct.get(g, ()))
    reach[name] = frozenset(seen)
  return reach


def lower_to_stack_program(program, save="live"):
  """The IR-2 program of a typed IR-1 program (pure)."""
  if program.types is None:
    raise errors.IRError("lower_to_stack_program needs a typed IR-1 program")
  if save not in ("live", "all"):
    raise ValueError(f"save must be 'live' or 'all', not {save!r}")
  names = reachable_functions(program)
  blocks, call_sites = [], []
  for name in names:
    fn_blocks, sites = _lower_function(program, program.function(name))
    blocks.extend(fn_blocks)
    call_sites.extend(sites)
  types = {qualify(fn, var): t for (fn, var), t in program.types.items()
           if fn in names}
  entry = program.entry
  unsaved = ir2.Program(
      tuple(blocks), tuple(qualify(entry.name, p) for p in entry.params),
      qualify(entry.name, entry.result), types,
      {n: qualify(n, program.function(n).result) for n in names})
  return _insert_caller_saves(unsaved, call_sites, save)


def _lower_function(program, fn):
  """The function's IR-2 blocks (without saves) and its call sites as
  `(caller, call block label, continuation label, callee)`."""
  q = lambda v: qualify(fn.name, v)  # pylint: disable=unnecessary-lambda-assignment
  blocks, sites = [], []
  for b in fn.blocks:
    label = label_of(fn.name, b.label)
    ops, k = [], 0
    for op in b.ops:
      match op:
        case ir1.Primitive(outs, code, ins, batched):
          ops.append(ir1.Primitive(tuple(map(q, outs)), code,
                                   tuple(map(q, ins)), batched))
        case ir1.Call(outs, callee, ins):
          k += 1
          callee_fn = program.function(callee)
          cont = f"{label}.{k}"
          # A recursive call passing a parameter on unchanged (`eps` in
          # `f(x - 1, eps)` inside `f`) moves nothing: the pair is left out,
          # so the call writes no register for it.
          bound = [(qualify(callee, p), q(v))
                   for p, v in zip(callee_fn.params, ins)
                   if qualify(callee, p) != q(v)]
          if bound:
            ops.append(ir2.Move(*map(tuple, zip(*bound))))
          entry = label_of(callee, callee_fn.blocks[0].label)
          blocks.append(ir2.Block(label, tuple(ops),
                                  ir2.PushJump(entry, cont)))
          sites.append((fn.name, label, cont, callee))
          label = cont
          ops = [ir2.Move((q(outs[0]),),
                          (qualify(callee, callee_fn.result),))]
        case _:
          raise errors.IRError(f"unknown IR-1 op {op!r}")
    match b.terminator:
      case ir1.Jump(target):
        term = ir2.Jump(label_of(fn.name, target))
      case ir1.Branch(cond, then_label, else_label):
        term = ir2.Branch(q(cond), label_of(fn.name, then_label),
                          label_of(fn.name, else_label))
      case ir1.Return():
        term = ir2.Return()
      case other:
        raise errors.IRError(f"unknown IR-1 terminator {other!r}")
    blocks.append(ir2.Block(label, tuple(ops), term))
  return blocks, sites


def _insert_caller_saves(program, call_sites, save):
  """Adds Push/Pop around each call site.

  Which variables are live across one call depends on the saves at later
  calls (a Push reads its variable), so "live" iterates to a fixpoint.
  """
  unsaved = {b.label: b for b in program.blocks}
  saved = {cont: () for _, _, cont, _ in call_sites}
  while True:
    with_saves = _with_saves(program, call_sites, saved)
    out = liveness.live_out(with_saves)
    new = {}
    for caller, _, cont, _ in call_sites:
      prefix = caller + "."
      first = unsaved[cont].ops[0]          # Move(y := callee result)
      if save == "all":
        candidates = program.types
      else:
        block = unsaved[cont]
        candidates = liveness.live_before(block.ops, block.terminator,
                                          out[cont])[1]
      new[cont] = tuple(sorted(v for v in candidates if v.startswith(prefix)
                               and v not in first.outs))
    if new == saved:
      return with_saves
    saved = new


def _with_saves(program, call_sites, saved):
  pushes = {call: saved[cont] for _, call, cont, _ in call_sites}
  blocks = []
  for b in program.blocks:
    ops = list(b.ops)
    if b.label in saved:      # after the Move of the callee's result
      ops = ops[:1] + [ir2.Pop(v) for v in reversed(saved[b.label])] + ops[1:]
    if b.label in pushes:     # before the Move of the arguments
      ops = ops[:-1] + [ir2.Push(v) for v in pushes[b.label]] + ops[-1:]
    blocks.append(ir2.Block(b.label, tuple(ops), b.terminator))
  return program.replace(blocks=tuple(blocks))
