"""Inlining: a non-recursive function joins its callers where that saves steps.

Every call costs a batched runtime steps of its own: the caller's block ends
at the call, the callee's blocks run, and the continuation after the return
is one more block (for the program-counter VM also a push and pop of the
return address). Two kinds of non-recursive function are inlined:

* one called from exactly one place: its blocks are shared by no one else,
  so copying them into the caller loses no batching and grows no code. With
  tail duplication afterwards, a small callee usually merges into the
  caller's block.
* a straight-line one (a single block of primitives ending in `return`),
  at every call site, each copy under its own names (`g.`, `g.2.`, ...).
  Its call takes three steps (the caller's block, the callee's, the
  continuation) where its copy takes none: the code runs in the caller's
  block. Members that reach different call sites at once no longer share
  the callee's step, but each site's copy runs in a step that site takes
  anyway, so no site takes more steps than before. (NUTS's `leaf`, called
  at three places in `build_tree`: a two-leaf subtree is one step.) The
  cost is code: each copy is traced and compiled on its own.

For the call `y = g(x1, x2)` in block B of f, B is split at the call:

    B:          ...ops before; g.p1, g.p2 = copy(x1, x2); jump g.entry
    g.<label>:  g's blocks, variables renamed `g.<var>`, `return` -> jump
    g.done:     y = copy(g.<result>); ...ops after; B's terminator

The copies are identity primitives, so the callee may assign its parameters
without touching the caller's variables. Types are carried over from the
callee's (the program is typed: this runs after type inference).
"""
import collections
import dataclasses
import itertools

from tfp_autobatch import errors
from tfp_autobatch.ir import ir1
from tfp_autobatch.passes import lower


def _identity(*values):
  return values


COPY = ir1.Code(_identity, "copy", __file__, 0)


def inline(program):
  """Returns `program` with every single-call-site, non-recursive function
  (other than the entry) inlined into its caller, and dropped."""
  if program.types is None:
    raise errors.IRError("inline needs a typed IR-1 program")
  while True:
    target = _inlinable(program)
    if target is None:
      return program
    program = _inline_function(program, *target)


def _call_sites(program):
  sites = collections.defaultdict(list)
  for fn_name in lower.reachable_functions(program):
    for b in program.function(fn_name).blocks:
      for i, op in enumerate(b.ops):
        if isinstance(op, ir1.Call):
          sites[op.callee].append((fn_name, b.label, i))
  return sites


def _straight_line(fn):
  """One block of primitives ending in `return`: a function whose call
  costs more steps (the call, the return) than its body."""
  return (len(fn.blocks) == 1
          and isinstance(fn.blocks[0].terminator, ir1.Return)
          and all(isinstance(op, ir1.Primitive) for op in fn.blocks[0].ops))


def _inlinable(program):
  """(caller, block label, op index, callee) of a call to inline, or None."""
  reach = lower.call_graph_reach(program)
  for callee, sites in _call_sites(program).items():
    if callee == program.entry.name or callee in reach[callee]:
      continue
    if len(sites) == 1 or _straight_line(program.function(callee)):
      return sites[0] + (callee,)
  return None


def _prefix(caller, callee_name):
  """`callee.` for the first copy of the callee in `caller`, then
  `callee.2.`, `callee.3.`... (every copy adds blocks under its prefix)."""
  labels = [b.label for b in caller.blocks]
  for k in itertools.count(1):
    prefix = f"{callee_name}." if k == 1 else f"{callee_name}.{k}."
    if not any(label.startswith(prefix) for label in labels):
      return prefix


def _inline_function(program, caller_name, label, index, callee_name):
  caller = program.function(caller_name)
  callee = program.function(callee_name)
  prefix = _prefix(caller, callee_name)
  name = lambda v: prefix + v  # pylint: disable=unnecessary-lambda-assignment
  done = name("done")
  block = caller.block(label)
  call = block.ops[index]
  head = ir1.Block(
      label,
      block.ops[:index] + (ir1.Primitive(
          tuple(map(name, callee.params)), COPY, call.ins),),
      ir1.Jump(name(callee.blocks[0].label)))
  tail = ir1.Block(
      done,
      (ir1.Primitive(call.outs, COPY, (name(callee.result),)),)
      + block.ops[index + 1:],
      block.terminator)
  body = tuple(_renamed_block(b, name, done) for b in callee.blocks)
  blocks = []
  for b in caller.blocks:
    blocks.extend([head] + list(body) + [tail] if b.label == label else [b])
  last_site = len(_call_sites(program)[callee_name]) == 1
  functions = tuple(
      dataclasses.replace(f, blocks=tuple(blocks)) if f.name == caller_name
      else f for f in program.functions
      if not (last_site and f.name == callee_name))
  types = {key: t for key, t in program.types.items()
           if not (last_site and key[0] == callee_name)}
  for (fn_name, var), t in program.types.items():
    if fn_name == callee_name:
      types[(caller_name, name(var))] = t
  return ir1.Program(functions, types)


def _renamed_block(block, name, done):
  ops = []
  for op in block.ops:
    match op:
      case ir1.Primitive(outs, code, ins, batched):
        ops.append(ir1.Primitive(tuple(map(name, outs)), code,
                                 tuple(map(name, ins)), batched))
      case ir1.Call(outs, callee, ins, lineno):
        ops.append(ir1.Call(tuple(map(name, outs)), callee,
                            tuple(map(name, ins)), lineno))
      case _:
        raise errors.IRError(f"unknown IR-1 op {op!r}")
  match block.terminator:
    case ir1.Jump(target):
      terminator = ir1.Jump(name(target))
    case ir1.Branch(cond, then_label, else_label):
      terminator = ir1.Branch(name(cond), name(then_label), name(else_label))
    case ir1.Return():
      terminator = ir1.Jump(done)
    case other:
      raise errors.IRError(f"unknown IR-1 terminator {other!r}")
  return ir1.Block(name(block.label), tuple(ops), terminator)
