"""The reference interpreter: runs IR-1 on ONE example with Python recursion.

The source of truth every backend is tested against. It is deliberately
plain: a dictionary of variables, a label, and a loop. A subscript's index
out of range raises `IndexOutOfRangeError`, as on every backend.
"""
import tensorflow as tf

from tfp_autobatch import errors
from tfp_autobatch.ir import ir1
from tfp_autobatch.operators import single_example
from tfp_autobatch.operators import subscripts
from tfp_autobatch.runtime import python_stack


def run_example(program, args, max_stack_depth):
  """Runs the entry function of a typed program on one example's args."""
  with python_stack.room_for(max_stack_depth, frames_per_level=4):
    return _run(program, program.entry, list(args), 1, max_stack_depth)


def _run(program, fn, args, depth, max_stack_depth):
  if depth > max_stack_depth:
    raise errors.StackOverflowError(
        f"recursion in '{fn.shown_name}' went deeper than max_stack_depth="
        f"{max_stack_depth}")
  env = dict(zip(fn.params, args))
  block = fn.blocks[0]
  while True:
    for op in block.ops:
      ins = [_read(env, fn, v) for v in op.ins]
      match op:
        case ir1.Primitive(outs, code, _, batched):
          types = [program.var_type(fn.name, v) for v in outs]
          if batched:
            one = [tf.nest.map_structure(lambda x: tf.expand_dims(x, 0), x)
                   for x in ins]
            values = [tf.nest.map_structure(lambda x: x[0], v)
                      for v in code.fn(*one)]
          else:
            values, fault = single_example.call_checking_subscripts(
                op, *ins, out_types=types)
            if fault is not None and fault[subscripts.KEY]:
              raise subscripts.error(fault)
          for var, value, t in zip(outs, values, types):
            env[var] = single_example.conform(value, t)
        case ir1.Call(outs, callee, _):
          env[outs[0]] = _run(program, program.function(callee), ins,
                              depth + 1, max_stack_depth)
        case _:
          raise errors.IRError(f"unknown IR-1 op {op!r}")
    match block.terminator:
      case ir1.Jump(target):
        block = fn.block(target)
      case ir1.Branch(cond, then_label, else_label):
        taken = bool(_read(env, fn, cond))
        block = fn.block(then_label if taken else else_label)
      case ir1.Return():
        return _read(env, fn, fn.result)
      case _:
        raise errors.IRError(f"unknown terminator {block.terminator!r}")


def _read(env, fn, var):
  if var not in env:
    raise UnboundLocalError(f"variable '{var}' of '{fn.shown_name}' is read "
                            "before it is assigned")
  return env[var]
