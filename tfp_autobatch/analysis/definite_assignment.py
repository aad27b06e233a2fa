"""Definite assignment of IR-1 variables: no read of a possibly unbound one.

In Python, `if n > 1: y = n * 10` followed by `return y` raises
UnboundLocalError for an example with n <= 1. A batched program has no such
per-example failure: the variable is a register that holds whatever it was
initialised with (zeros), so that example would silently return 0. So, as
AutoGraph does for tensor-dependent control flow, we reject at conversion
a read that some path from the function's entry reaches without assigning
the variable.

A forward "must" analysis, a worklist fixpoint over each function's
control-flow graph: a variable is assigned at a block's entry if it is
assigned on every path to it (the parameters are assigned at the entry
block). A `while True` loop enters its body unconditionally (the frontend
emits a jump, not a branch), so a variable assigned in its first pass is
assigned after it; so does a `for` over a non-empty range of Python ints,
and a `while` whose test the literals assigned before it make true
(`FunctionConverter.while_statement`).
"""
from tfp_autobatch import errors
from tfp_autobatch.ir import ir1


def assigned_at_entry(function):
  """`{label: variables assigned on every path to the block's entry}`;
  blocks no path reaches are left out."""
  blocks = {b.label: b for b in function.blocks}
  entry = function.blocks[0].label
  result = {entry: frozenset(function.params)}
  work = [entry]
  while work:
    label = work.pop()
    assigned = set(result[label])
    for op in blocks[label].ops:
      assigned.update(op.outs)
    for s in ir1.successors(blocks[label].terminator):
      old = result.get(s)
      new = frozenset(assigned) if old is None else old & assigned
      if new != old:
        result[s] = new
        work.append(s)
  return result


def check_definitely_assigned(program):
  """Raises `ConversionError` at the first read, in any function of the
  untyped IR-1 `program`, of a variable that some path reaches unassigned.
  Returns `program`."""
  for function in program.functions:
    at_entry = assigned_at_entry(function)
    for block in function.blocks:
      if block.label not in at_entry:
        continue
      assigned = set(at_entry[block.label])
      for op in block.ops:
        for v in op.ins:
          if v not in assigned:
            _raise_unbound(function, v, op)
        assigned.update(op.outs)
  return program


def _raise_unbound(function, variable, op):
  if isinstance(op, ir1.Primitive):
    lineno = dict(op.code.read_lines).get(variable, op.code.lineno)
  else:
    lineno = op.lineno
  raise errors.ConversionError(
      f"variable '{variable}' may be read before it is assigned: some "
      "path through an `if` or a loop reaches this line without assigning "
      "it (Python would raise UnboundLocalError for such an example; a "
      "batched program would silently read a zero). Assign it a value "
      "before the `if` or loop, on every path",
      function=function.shown_name, filename=function.filename,
      lineno=lineno or function.lineno,
      construct="a possibly unassigned variable")
