"""IR-2: one merged program of blocks with explicit stacks (paper Fig. 4).

    program    ::= block+                          (entry block first)
    block      ::= label: op* terminator           labels "function/label"
    op         ::= Primitive(outs, code, ins, batched)   as in IR-1
                 | Move(outs, ins)                 parallel copy outs := ins
                 | Push(var)                       save var's value on its stack
                 | Pop(var)                        restore var from its stack
                 | Update(var)                     restore var from its stack,
                                                   leaving the copy saved
                 | Guarded(cond, when, op)         op for the members whose
                                                   cond is `when`; the others
                                                   keep their values
    terminator ::= Jump(label) | Branch(var, then, else)
                 | PushJump(callee_label, return_label)
                 | PushBranch(var, then, else, return_label)
                                                   push return_label, then
                                                   branch (a call whose
                                                   callee's entry block was
                                                   run by the caller)
                 | Return()                        pop the pc stack
                 | ReturnOr(cond, when, otherwise) Return for the members
                                                   whose cond is `when`,
                                                   `otherwise` for the rest
    Halt       ::= the block index len(blocks)

Variables are namespaced by function ("fib.n"), so one program holds every
function. A call `y = F(x)` in IR-1 becomes caller-saves code:

    Push(v) for v live across the call; Move(F.params := x);
    PushJump(F/entry, cont)        cont: Move(y := F.result); Pop(v) ...

Each variable has one of three storage classes, derived from the program:
  stacked    it appears in a Push/Pop/Update: a stack [D, Z, ...] and a
             stack pointer [Z] (plus a separately stored top when
             `cached_top`, so reads need no gather);
  register   any other variable that lives across a VM step: [Z, ...];
  temporary  listed in `temporaries`: lives only inside one block execution.
`types` maps each variable to its per-example type (see `ir.types`).
"""
import dataclasses
from typing import Optional

from tfp_autobatch import errors
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import types as types_lib

Primitive = ir1.Primitive
Jump = ir1.Jump
Branch = ir1.Branch
Return = ir1.Return


@dataclasses.dataclass(frozen=True)
class Move:
  outs: tuple
  ins: tuple


@dataclasses.dataclass(frozen=True)
class Push:
  var: str


@dataclasses.dataclass(frozen=True)
class Pop:
  var: str


@dataclasses.dataclass(frozen=True)
class Update:
  var: str


@dataclasses.dataclass(frozen=True)
class Guarded:
  """`op` (a Move, a Push or an unbatched Primitive) run only for the
  members whose `cond` equals `when`: the others keep their old values and
  their stacks. Made by `passes.return_early`."""
  cond: str
  when: bool
  op: object


def is_plain(op):
  """Single-example code: a Move or a Primitive that is not batched (no
  stack operation, no call of the model)."""
  return isinstance(op, Move) or (isinstance(op, Primitive)
                                  and not op.batched)


def unguarded(op):
  """The op a `Guarded` wraps, or `op` itself."""
  return op.op if isinstance(op, Guarded) else op


def batched_primitive_calls(block):
  """How many `@batched_primitive` (model) calls `block` makes, guarded or
  not."""
  return sum(isinstance(unguarded(op), Primitive) and unguarded(op).batched
             for op in block.ops)


def calls_batched_primitive(block):
  """Whether `block` calls a `@batched_primitive` (the model), guarded or
  not."""
  return batched_primitive_calls(block) > 0


@dataclasses.dataclass(frozen=True)
class PushJump:
  target: str
  return_label: str


@dataclasses.dataclass(frozen=True)
class PushBranch:
  cond: str
  then_label: str
  else_label: str
  return_label: str


@dataclasses.dataclass(frozen=True)
class ReturnOr:
  """Return for the members whose `cond` equals `when`; `otherwise` (a
  Jump, Branch, PushJump or PushBranch) for the others."""
  cond: str
  when: bool
  otherwise: object


CALLS = (PushJump, PushBranch)


def call_of(terminator):
  """The call a terminator may make (a PushJump or PushBranch), or None."""
  if isinstance(terminator, ReturnOr):
    terminator = terminator.otherwise
  return terminator if isinstance(terminator, CALLS) else None


def entered(terminator):
  """The callee blocks a call terminator may enter."""
  match terminator:
    case PushJump(target, _):
      return (target,)
    case PushBranch(_, then_label, else_label, _):
      return (then_label, else_label)
    case _:
      raise errors.IRError(f"not a call: {terminator!r}")


def callee_of(terminator):
  """The function a call terminator enters."""
  return function_of(entered(terminator)[0])


@dataclasses.dataclass(frozen=True)
class Block:
  label: str
  ops: tuple
  terminator: object


@dataclasses.dataclass(frozen=True)
class Program:
  """The merged program; `params`/`result` are the entry's variables and
  `results` maps each function to its result variable."""
  blocks: tuple
  params: tuple
  result: str
  types: dict
  results: dict = dataclasses.field(default_factory=dict)
  temporaries: frozenset = frozenset()
  cached_top: bool = False

  @property
  def halt(self):
    return len(self.blocks)

  def block_index(self):
    return {b.label: i for i, b in enumerate(self.blocks)}

  def variables(self):
    return sorted(self.types)

  @property
  def stacked(self):
    return frozenset(unguarded(op).var for b in self.blocks for op in b.ops
                     if isinstance(unguarded(op), (Push, Pop, Update)))

  @property
  def registers(self):
    return frozenset(self.types) - self.stacked - self.temporaries

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)

  def __str__(self):
    return format_program(self)


def function_of(name):
  """The function of a label ("fib/entry") or variable ("fib.n")."""
  return name.split("/", 1)[0] if "/" in name else name.split(".", 1)[0]


def reads(op):
  """Variables whose value `op` reads (a guarded write also reads the old
  value it keeps for the members it skips)."""
  match op:
    case Guarded(cond, _, inner):
      return (cond,) + reads(inner) + writes(inner)
    case Primitive(_, _, ins, _) | Move(_, ins):
      return tuple(ins)
    case Push(var):
      return (var,)
    case Pop() | Update():
      return ()
    case _:
      raise errors.IRError(f"not an IR-2 op: {op!r}")


def writes(op):
  """Variables whose value `op` sets."""
  match op:
    case Guarded(_, _, inner):
      return writes(inner)
    case Primitive(outs, _, _, _) | Move(outs, _):
      return tuple(outs)
    case Push():
      return ()
    case Pop(var) | Update(var):
      return (var,)
    case _:
      raise errors.IRError(f"not an IR-2 op: {op!r}")


def successors(terminator):
  match terminator:
    case Jump(target):
      return (target,)
    case Branch(_, then_label, else_label):
      return (then_label, else_label)
    case PushJump(target, return_label):
      return (target, return_label)
    case PushBranch(_, then_label, else_label, return_label):
      return (then_label, else_label, return_label)
    case Return():
      return ()
    case ReturnOr(_, _, otherwise):
      return successors(otherwise)
    case _:
      raise errors.IRError(f"not an IR-2 terminator: {terminator!r}")


def format_op(op):
  match op:
    case Primitive():
      return ir1.format_op(op)
    case Move(outs, ins):
      return f"{', '.join(outs)} = move({', '.join(ins)})"
    case Push(var):
      return f"push {var}"
    case Pop(var):
      return f"pop {var}"
    case Update(var):
      return f"update {var}"
    case Guarded(cond, when, inner):
      return f"if {'' if when else 'not '}{cond}: {format_op(inner)}"
    case _:
      raise errors.IRError(f"not an IR-2 op: {op!r}")


def format_terminator(t):
  match t:
    case PushJump(target, return_label):
      return f"pushjump {target}, return to {return_label}"
    case PushBranch(cond, then_label, else_label, return_label):
      return (f"pushbranch {cond} ? {then_label} : {else_label}, "
              f"return to {return_label}")
    case ReturnOr(cond, when, otherwise):
      return (f"return if {'' if when else 'not '}{cond}, else "
              f"{format_terminator(otherwise)}")
    case Jump() | Branch() | Return():
      return ir1.format_terminator(t)
    case _:
      raise errors.IRError(f"not an IR-2 terminator: {t!r}")


def format_program(program, types=False):
  def names(vs):
    return ", ".join(sorted(vs)) or "-"
  lines = [f"program({', '.join(program.params)}) -> {program.result}  "
           f"[halt = {program.halt}; stacks with "
           f"{'cached top' if program.cached_top else 'top in the stack'}]",
           f"  stacked:     {names(program.stacked)}",
           f"  registers:   {names(program.registers)}",
           f"  temporaries: {names(program.temporaries)}"]
  for i, b in enumerate(program.blocks):
    lines.append(f"  {i} {b.label}:")
    for op in b.ops:
      lines.append(f"    {format_op(op)}")
    lines.append(f"    {format_terminator(b.terminator)}")
  if types:
    lines.append("  types: " + ", ".join(
        f"{v}: {types_lib.format_type(t)}"
        for v, t in sorted(program.types.items())))
  return "\n".join(lines)


def verify_ir2(program, after="?"):
  """Raises IRError naming the pass `after` which broke an IR-2 invariant."""
  def fail(msg):
    raise errors.IRError(f"after pass '{after}': {msg}")

  labels = [b.label for b in program.blocks]
  if not labels:
    fail("program has no blocks")
  if len(set(labels)) != len(labels):
    fail("duplicate block labels")
  known = set(program.types)
  for v in tuple(program.params) + (program.result,):
    if v not in known:
      fail(f"entry variable '{v}' has no type")
  if not program.temporaries <= known:
    fail(f"unknown temporaries {sorted(program.temporaries - known)}")
  if program.result in program.temporaries:
    fail(f"the program's result '{program.result}' is a temporary")
  for b in program.blocks:
    for op in b.ops:
      for v in reads(op) + writes(op):
        if v not in known:
          fail(f"{b.label}: variable '{v}' has no type")
      if isinstance(op, Guarded) and isinstance(op.op,
                                                (Guarded, Pop, Update)):
        fail(f"{b.label}: guarded op {format_op(op)} (a guard may hold a "
             "Move, a Push or a Primitive)")
      op = unguarded(op)
      if isinstance(op, (Push, Pop, Update)) and op.var in program.temporaries:
        fail(f"{b.label}: temporary '{op.var}' is saved on a stack")
      if isinstance(op, (Primitive, Move)) and len(set(op.outs)) != len(op.outs):
        fail(f"{b.label}: an op writes a variable twice")
    t = b.terminator
    if isinstance(t, ReturnOr):
      if t.cond not in known:
        fail(f"{b.label}: return on unknown '{t.cond}'")
      if isinstance(t.otherwise, (Return, ReturnOr)):
        fail(f"{b.label}: returnor's otherwise is {t.otherwise!r}")
      t = t.otherwise
    if isinstance(t, (Branch, PushBranch)) and t.cond not in known:
      fail(f"{b.label}: branch on unknown '{t.cond}'")
    if (isinstance(t, PushBranch)
        and function_of(t.else_label) != function_of(t.then_label)):
      fail(f"{b.label}: pushbranch into two functions")
    for target in successors(t):
      if target not in labels:
        fail(f"{b.label}: jump to unknown label '{target}'")
    if call_of(t) and callee_of(t) not in program.results:
      fail(f"{b.label}: call of '{callee_of(t)}' whose result "
           "variable is unknown")
  return program
