"""If-conversion: a small `if` becomes a select in one block.

Every block a batched runtime runs is a step, and members on different arms
of an `if` run them in different steps: in a loop whose body is an `if`
(collatz: halve an even n, else 3n + 1), a batch whose members disagree
takes a step per arm per iteration, each for part of the batch. When both
arms are a few ops of integer and boolean code that raises on no values
(`analysis.raise_free`: sums, comparisons, divisions by a nonzero
constant), running both for every member and selecting costs less than a
step: such a branch

    B: ops; branch c ? T : E       T: t_ops; jump J       E: e_ops; jump J

(or an `if` with one arm, `T: t_ops; jump E`) becomes

    B: ops; outs = primitive(c, ins) { t_ops and e_ops, select by c }; jump J

and tail duplication then merges J in as before. Only blocks whose one
predecessor is B are taken, so no other path sees the change.

A variable the arms assign takes, where c picks the arm that does not
assign it, its value from before the `if`. If it may be unassigned there
(some path reaches B without assigning it), every later read follows a
new assignment (definite assignment rejected any other read), so it simply
takes the assigning arm's value.

Floating-point arms are left as branches by default: the select's
gradient is zero for the arm not taken, but a NaN or infinity that arm
computed (`log` of a negative) would make it `0 * inf = NaN` for backends
that differentiate. With `floats=True` (the pipeline asks so for the
backends no gradient goes through, `backends.NEVER_DIFFERENTIATED`:
`pc:xla`) they are converted too, under the same budget: the forward
select discards that NaN. The pipeline runs the pass that way on the
program already converted without it, so such a backend's program
differs from the others' only in its floating-point `if`s. Code with
effects or ops that may raise (`tf.print`, `tf.debugging.check_numerics`,
a gather, a random op) is never run for members that did not take its
arm.
"""
import dataclasses

import tensorflow as tf

from tfp_autobatch.analysis import definite_assignment
from tfp_autobatch.analysis import raise_free
from tfp_autobatch.ir import ir1
from tfp_autobatch.operators import single_example

# The TensorFlow ops an arm may compute (traced for one example; both arms
# run for every member): collatz's arms are 1 and 2, a VM step's own
# bookkeeping a few dozen.
MAX_ARM_COMPUTATIONS = 12


def if_to_select(program, floats=False):
  """Returns typed IR-1 `program` with small integer `if`s made selects,
  and with `floats`, small floating-point ones too (see above). Returns
  `program` itself where it converts nothing."""
  computations = {}   # (function, op) -> its ops if harmless, else None
  functions = tuple(_function(program, fn, computations, floats)
                    for fn in program.functions)
  if all(new is old for new, old in zip(functions, program.functions)):
    return program
  return dataclasses.replace(program, functions=functions)


def _function(program, fn, computations, floats):
  while True:
    merged = _convert_one(program, fn, computations, floats)
    if merged is None:
      return fn
    fn = merged


def _convert_one(program, fn, computations, floats):
  """`fn` with its first convertible `if` converted, or None."""
  blocks = {b.label: b for b in fn.blocks}
  predecessors = ir1.predecessor_counts(fn.blocks)
  predecessors[fn.blocks[0].label] += 1   # its callers enter the entry
  assigned = None
  for block in fn.blocks:
    arms = _diamond(block, blocks, predecessors)
    if arms is None:
      continue
    then_ops, else_ops, join = arms
    if not all(_selectable(program, fn, ops, computations, floats)
               for ops in (then_ops, else_ops)):
      continue
    if assigned is None:
      assigned = definite_assignment.assigned_at_entry(fn)
    before = set(assigned.get(block.label, ()))
    before.update(v for op in block.ops for v in op.outs)
    select = _select_primitive(program, fn, block.terminator.cond,
                               then_ops, else_ops, before)
    new_block = ir1.Block(block.label, block.ops + (select,), ir1.Jump(join))
    return dataclasses.replace(fn, blocks=tuple(ir1.reachable([
        new_block if b.label == block.label else b for b in fn.blocks])))
  return None


def _diamond(block, blocks, predecessors):
  """`(then ops, else ops, join label)` if `block` ends in an `if` whose
  arms are blocks only it enters, each jumping to one join (or one arm
  jumping to the other), else None."""
  t = block.terminator
  if not isinstance(t, ir1.Branch) or t.then_label == t.else_label:
    return None
  then_block, else_block = blocks[t.then_label], blocks[t.else_label]

  def arm(b):   # where the block goes, if only `block` enters it and it jumps
    if (b.label != block.label and predecessors[b.label] == 1
        and isinstance(b.terminator, ir1.Jump)):
      return _forwarded(b.terminator.target, blocks)
    return None

  then_join, else_join = arm(then_block), arm(else_block)
  if then_join is not None and then_join == else_join:
    if then_join in (then_block.label, else_block.label):
      return None
    return then_block.ops, else_block.ops, then_join
  if then_join == _forwarded(else_block.label, blocks):   # no else
    return then_block.ops, (), then_join
  if else_join == _forwarded(then_block.label, blocks):   # `if not c`
    return (), else_block.ops, else_join
  return None


def _forwarded(label, blocks):
  """Where jumping to `label` leads through blocks with no ops (the joins
  of nested `if`s: `elif`'s join jumps to the outer `if`'s)."""
  seen = set()
  while (label not in seen and not blocks[label].ops
         and isinstance(blocks[label].terminator, ir1.Jump)):
    seen.add(label)
    label = blocks[label].terminator.target
  return label


def _selectable(program, fn, ops, computations, floats):
  """Whether `ops` may run for every member: primitives of integer (with
  `floats`, also floating-point) code that raises on no values, at most
  `MAX_ARM_COMPUTATIONS` ops in all (memoised in `computations`, by
  function and op: a long `elif` chain asks again at each conversion)."""
  def count(op):
    key = (fn.name, op)
    if key not in computations:
      types = program.types
      computations[key] = raise_free.computations_if_harmless(
          op, [types[(fn.name, v)] for v in op.ins],
          [types[(fn.name, v)] for v in op.outs], floats=floats)
    return computations[key]

  if not all(isinstance(op, ir1.Primitive) and not op.batched for op in ops):
    return False
  counts = [count(op) for op in ops]
  return None not in counts and sum(counts) <= MAX_ARM_COMPUTATIONS


def _written(ops):
  return list(dict.fromkeys(v for op in ops for v in op.outs))


def _read_first(ops):
  """Variables `ops` read before writing them, in order."""
  written, reads = set(), {}
  for op in ops:
    reads.update((v, None) for v in op.ins if v not in written)
    written.update(op.outs)
  return list(reads)


def _select_primitive(program, fn, cond, then_ops, else_ops, before):
  """The primitive that runs both arms and selects by `cond`."""
  then_writes, else_writes = _written(then_ops), _written(else_ops)
  outs = tuple(dict.fromkeys(then_writes + else_writes))
  # Where an arm leaves a variable alone, its value from before the `if`.
  kept = [v for v in outs if v in before
          and (v not in then_writes or v not in else_writes)]
  ins = tuple(dict.fromkeys([cond] + _read_first(then_ops)
                            + _read_first(else_ops) + kept))
  types = {v: program.types[(fn.name, v)] for v in ins + outs}
  arm_types = [[[types[v] for v in op.outs] for op in arm]
               for arm in (then_ops, else_ops)]

  def run_arm(ops, out_types, env):
    env = dict(env)
    for op, op_types in zip(ops, out_types):
      run = single_example.single_example_fn(op, op_types)
      env.update(zip(op.outs, run(*[env[v] for v in op.ins])))
    return env

  def fn_(*values):
    env = dict(zip(ins, values))
    then_env = run_arm(then_ops, arm_types[0], env)
    else_env = run_arm(else_ops, arm_types[1], env)
    c = env[cond]
    results = []
    for v in outs:
      if v in then_env and v in else_env:
        results.append(tf.nest.map_structure(
            lambda a, b: tf.where(c, a, b), then_env[v], else_env[v]))
      else:   # assigned by one arm only, and unassigned before the `if`
        results.append(then_env.get(v, else_env.get(v)))
    return tuple(results)

  first = (then_ops + else_ops)[0].code
  source = (f"if {cond}: {_source(then_ops)} else: {_source(else_ops)}  "
            f"(both run; a select keeps one)")
  read_lines = tuple(dict.fromkeys(
      pair for op in then_ops + else_ops for pair in op.code.read_lines))
  return ir1.Primitive(outs, ir1.Code(fn_, source, first.filename,
                                     first.lineno, read_lines), ins)


def _source(ops):
  if not ops:
    return "pass"
  return "; ".join(op.code.source.strip().replace("\n", "; ") for op in ops)
