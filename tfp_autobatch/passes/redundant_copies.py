"""Drop writes that give a variable the value it already holds.

A recursive function that returns what its own call returned,

    first = f(...)                 # IR-2:  _t = move(f._result)
    if not ok(first):                       first = primitive(_t) {first = _t}
      return first                          if not ok: f._result = first

copies the callee's result register back into itself: `f._result` already
holds `first`'s value. Under `pc:xla` every write a block makes is a row of
its bank write, padded to the largest writer of its dispatch, so such a
copy costs as much as any other write (NUTS's `build_tree` wrote its whole
[d]-vector `Subtree` back this way after every first half).

Within each block, the pass follows which variables hold the same value
(value numbering of copies): a `Move`, the identity `inline.COPY`, and a
statement `a = b` of a primitive's code make a copy; any other write makes
a new value. An op all of whose writes would leave their variables with the
value they already hold is dropped, guarded or not.
"""
import ast
import inspect
import itertools

from tfp_autobatch.ir import ir2
from tfp_autobatch.passes import inline


def drop_redundant_copies(program):
  """The program with every no-op copy dropped (pure)."""
  blocks = tuple(ir2.Block(b.label, _kept_ops(b.ops, program.types),
                           b.terminator) for b in program.blocks)
  return program.replace(blocks=blocks)


def _kept_ops(ops, types):
  fresh = itertools.count()
  value = {}           # variable -> the value it holds now (by default,
                       # the one it held when the block began)
  now = lambda v: value.get(v, ("entry", v))  # pylint: disable=unnecessary-lambda-assignment
  kept = []
  for op in ops:
    inner = ir2.unguarded(op)
    copied = _copies(inner)
    new = {}
    for out in ir2.writes(inner):
      source = copied.get(out)
      same_type = (source is not None and types.get(out) is not None
                   and types.get(source) == types.get(out))
      new[out] = now(source) if same_type else ("new", next(fresh))
    if new and all(new[v] == now(v) for v in new):
      continue                               # changes nothing: dropped
    if isinstance(op, ir2.Guarded):
      # Some members keep their old values: what the op writes is now
      # known to hold neither.
      new = {v: ("new", next(fresh)) for v in new}
    value.update(new)
    kept.append(op)
  return tuple(kept)


def _copies(op):
  """`{out: in}` for the outputs `op` sets to the value an input had when
  the op began (none for a Push, Pop or Update: a Pop or Update gives its
  variable a value from the stack)."""
  if isinstance(op, ir2.Move) or (isinstance(op, ir2.Primitive)
                                  and op.code is inline.COPY):
    return dict(zip(op.outs, op.ins))
  if not isinstance(op, ir2.Primitive) or op.batched:
    return {}
  return _copies_in_code(op)


def _local(var):
  """A variable's name in its function's code ("f.leaf.2.q" -> "q")."""
  return var.rsplit(".", 1)[-1]


def _copies_in_code(op):
  """`{out: in}` from the statements `a = b` of a primitive's source.

  Trusted only where the code's parameters are named as the op's inputs
  are locally (the frontend's primitives), so that the source speaks of
  the op's own variables; any other code copies nothing."""
  try:
    params = list(inspect.signature(op.code.fn).parameters)
    statements = ast.parse(op.code.source).body
  except (TypeError, ValueError, SyntaxError):
    return {}
  ins = [_local(v) for v in op.ins]
  if params != ins or len(set(ins)) != len(ins):
    return {}
  holds = dict(zip(ins, op.ins))     # local name -> input whose value it has
  for stmt in statements:
    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and isinstance(stmt.value, ast.Name)):
      holds[stmt.targets[0].id] = holds.get(stmt.value.id)
      continue
    for node in ast.walk(stmt):
      if isinstance(node, (ast.Attribute, ast.Subscript)) and not isinstance(
          node.ctx, ast.Load):
        return {}                  # an object changed in place: trust none
      if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        holds[node.id] = None
  return {out: holds[_local(out)] for out in op.outs
          if holds.get(_local(out)) is not None}
