"""Checks the invariants of IR programs; run after every pass in tests."""
from tfp_autobatch import errors
from tfp_autobatch.ir import ir1


def verify(program, after="?"):
  """Raises IRError naming the pass `after` which broke an IR-1 invariant."""
  def fail(msg):
    raise errors.IRError(f"after pass '{after}': {msg}")

  names = [f.name for f in program.functions]
  if len(set(names)) != len(names):
    fail(f"duplicate function names {names}")
  for fn in program.functions:
    labels = [b.label for b in fn.blocks]
    if not labels:
      fail(f"function '{fn.name}' has no blocks")
    if len(set(labels)) != len(labels):
      fail(f"duplicate labels in '{fn.name}'")
    defined = set(fn.params)
    for b in fn.blocks:
      for op in b.ops:
        if not isinstance(op, (ir1.Primitive, ir1.Call)):
          fail(f"{fn.name}/{b.label}: not an IR-1 op: {op!r}")
        defined.update(op.outs)
    for b in fn.blocks:
      for op in b.ops:
        for v in op.ins:
          if v not in defined:
            fail(f"{fn.name}/{b.label}: '{v}' is read but never assigned")
        if isinstance(op, ir1.Call):
          if op.callee not in names:
            fail(f"{fn.name}/{b.label}: call of unknown function {op.callee}")
          callee = program.function(op.callee)
          if len(callee.params) != len(op.ins) or len(op.outs) != 1:
            fail(f"{fn.name}/{b.label}: call of {op.callee} with "
                 f"{len(op.ins)} arguments, it takes {len(callee.params)}")
          if program.types is not None:
            for p, v in zip(callee.params, op.ins):
              if (program.var_type(op.callee, p)
                  != program.var_type(fn.name, v)):
                fail(f"{fn.name}/{b.label}: argument '{v}' of call "
                     f"{op.callee} does not have the parameter's type")
      match b.terminator:
        case ir1.Jump(target):
          targets = [target]
        case ir1.Branch(cond, then_label, else_label):
          targets = [then_label, else_label]
          if cond not in defined:
            fail(f"{fn.name}/{b.label}: branch on unassigned '{cond}'")
        case ir1.Return():
          targets = []
          if fn.result not in defined:
            fail(f"{fn.name}: returns '{fn.result}' which is never assigned")
        case other:
          fail(f"{fn.name}/{b.label}: not an IR-1 terminator: {other!r}")
      for t in targets:
        if t not in labels:
          fail(f"{fn.name}/{b.label}: jump to unknown label '{t}'")
    if program.types is not None:
      for var in defined:
        if program.var_type(fn.name, var) is None and any(
            (fn.name, p) in program.types for p in fn.params):
          fail(f"{fn.name}: variable '{var}' has no inferred type")
  return program
