"""IR-1: programs of functions of basic blocks (paper Fig. 2).

    program    ::= function+                       (entry function first)
    function   ::= name(params) -> result: block+  (entry block first)
    block      ::= label: op* terminator
    op         ::= Primitive(outs, code, ins)      single-example TF code
                 | Primitive(outs, code, ins, batched=True)
                                                   code that maps over the batch
                 | Call(outs, callee, ins)         call of a batched function
    terminator ::= Jump(label) | Branch(var, then, else) | Return()

Variables are names local to their function; each holds a nest of tensors.
A function's `result` variable holds what `Return()` returns. `types`, when
present, maps `(function, variable)` to its per-example type (see
`ir.types`); it is filled in by `passes.infer_types`.
"""
import dataclasses
from typing import Callable, Optional

from tfp_autobatch import errors
from tfp_autobatch.ir import types as types_lib


@dataclasses.dataclass(frozen=True)
class SubscriptSite:
  """A subscript `v[i]` or `m[i, j]` of the user's code that the frontend
  rewrote into a gather (`pyops.getitem`), whose index is checked when
  it runs (`operators.subscripts`); what an error names."""
  function: str   # the Python function's qualified name
  filename: str
  lineno: int
  source: str     # the subscript, as written (`table[i - 3]`)


@dataclasses.dataclass(frozen=True, eq=False)
class Code:
  """A piece of the user's straight-line code, as a callable and its text.

  `fn(*ins)` returns the tuple of output values. `source` is the user's code
  for printing; `filename`/`lineno` point at it. `subscripts`: the
  `SubscriptSite`s of its rewritten subscripts, the k-th called as
  `getitem(value, index, k)`. `declared_outputs`, for a
  `@tab.batched_primitive` given an `output_signature`:
  `declared_outputs(*input_specs)` is the tuple of its outputs'
  `tf.TensorSpec`s (batch dimension None), or None where not declared.
  `fine_buckets`: whether such a primitive asked for buckets at every 3/4
  step under XLA (`tab.batched_primitive`).
  """
  fn: Callable
  source: str
  filename: str = "<unknown>"
  lineno: int = 0
  read_lines: tuple = ()   # (input, the line of its first read), per input
  subscripts: tuple = ()
  declared_outputs: Callable = None
  fine_buckets: bool = False


@dataclasses.dataclass(frozen=True)
class Primitive:
  outs: tuple
  code: Code
  ins: tuple
  batched: bool = False


@dataclasses.dataclass(frozen=True)
class Call:
  outs: tuple
  callee: str
  ins: tuple
  lineno: int = 0   # the call's line in the caller (0: not known)


@dataclasses.dataclass(frozen=True)
class Jump:
  target: str


@dataclasses.dataclass(frozen=True)
class Branch:
  cond: str
  then_label: str
  else_label: str


@dataclasses.dataclass(frozen=True)
class Return:
  pass


@dataclasses.dataclass(frozen=True)
class Block:
  label: str
  ops: tuple
  terminator: object


@dataclasses.dataclass(frozen=True)
class Function:
  name: str
  params: tuple
  result: str
  blocks: tuple
  filename: str = "<unknown>"
  lineno: int = 0
  python_name: str = ""   # the Python function's qualified name

  @property
  def shown_name(self):
    """The name messages give: the Python function's, not the program's
    (two batched functions may share a Python name; the program renames
    the second `name_2`)."""
    return self.python_name or self.name

  def block(self, label):
    for b in self.blocks:
      if b.label == label:
        return b
    raise KeyError(label)

  def block_index(self):
    return {b.label: i for i, b in enumerate(self.blocks)}


@dataclasses.dataclass(frozen=True)
class Program:
  functions: tuple
  types: Optional[dict] = None
  # What the pipeline derives from this program (its IR-2), cached with
  # it; not an argument, so `dataclasses.replace` starts a new program's
  # empty.
  derived: dict = dataclasses.field(default_factory=dict, init=False,
                                    repr=False, compare=False)

  @property
  def entry(self):
    return self.functions[0]

  def function(self, name):
    for f in self.functions:
      if f.name == name:
        return f
    raise KeyError(name)

  def var_type(self, function, var):
    return None if self.types is None else self.types.get((function, var))

  def __str__(self):
    return format_program(self)


def successors(terminator):
  """The labels a terminator may transfer control to."""
  match terminator:
    case Jump(target):
      return [target]
    case Branch(_, then_label, else_label):
      return [then_label, else_label]
    case _:
      return []


def predecessor_counts(blocks):
  """{label: how many of the blocks' terminators may jump to it}. (A
  function's callers enter its entry too: not counted here.)"""
  counts = {b.label: 0 for b in blocks}
  for b in blocks:
    for target in successors(b.terminator):
      counts[target] += 1
  return counts


def reachable(blocks, successors_of=None):
  """The blocks reachable from the first, in their original order.
  `successors_of(terminator)` defaults to IR-1's `successors` (IR-2 passes
  give theirs)."""
  successors_of = successors_of or successors
  by_label = {b.label: b for b in blocks}
  seen, todo = set(), [blocks[0].label]
  while todo:
    label = todo.pop()
    if label not in seen:
      seen.add(label)
      todo.extend(successors_of(by_label[label].terminator))
  return [b for b in blocks if b.label in seen]


def format_op(op):
  match op:
    case Primitive(outs, code, ins, batched):
      body = code.source.strip().replace("\n", "; ")
      kind = "batched_primitive" if batched else "primitive"
      return f"{', '.join(outs)} = {kind}({', '.join(ins)}) {{ {body} }}"
    case Call(outs, callee, ins):
      return f"{', '.join(outs)} = call {callee}({', '.join(ins)})"
    case _:
      raise errors.IRError(f"not an IR-1 op: {op!r}")


def format_terminator(t):
  match t:
    case Jump(target):
      return f"jump {target}"
    case Branch(cond, then_label, else_label):
      return f"branch {cond} ? {then_label} : {else_label}"
    case Return():
      return "return"
    case _:
      raise errors.IRError(f"not an IR-1 terminator: {t!r}")


def format_program(program):
  lines = []
  for f in program.functions:
    lines.append(f"def {f.name}({', '.join(f.params)}) -> {f.result}:")
    for b in f.blocks:
      lines.append(f"  {b.label}:")
      for op in b.ops:
        lines.append(f"    {format_op(op)}")
      lines.append(f"    {format_terminator(b.terminator)}")
    if program.types is not None:
      typed = sorted((v, t) for (fn, v), t in program.types.items()
                     if fn == f.name)
      lines.append("  types: " + ", ".join(
          f"{v}: {types_lib.format_type(t)}" for v, t in typed))
  return "\n".join(lines)
