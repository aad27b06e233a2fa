"""Type inference: per-example types of every variable, from the inputs' types.

A worklist-free fixpoint: sweep all functions, abstractly evaluating each
`Primitive` by tracing its code on placeholders in a scratch graph, joining the
types a variable gets (see `ir.types.join`), and propagating argument types
into callees and result types out of them, until nothing changes. Recursion
converges because a call whose callee result is not known yet contributes
nothing until the base case has been typed.

A primitive's code gives each value it assigns the type its variable has so
far (`pyops.as_assigned`), so that code after `b = 1.0 / 3.0` in the same
primitive reads a float64 `b` where `b` is float64 (say, a parameter)
rather than the Python float, which would make what it computes a float32
literal; when a variable's type grows stronger, the code that assigns it is
traced again.
"""
import itertools
import weakref

import tensorflow as tf

from tfp_autobatch import errors
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.operators import pyops
from tfp_autobatch.operators import single_example
from tfp_autobatch.passes import inline

_MAX_SWEEPS = 100


def infer_types(program, arg_types):
  """Returns `program` with `types` filled in for entry args `arg_types`.

  A variable typed by Python literals alone (`i = 0; i += 1`) is weak: it
  takes TensorFlow's default dtype (int32, float32) unless it is joined
  with a value of another. Where that default makes a primitive fail (`i <
  n` with an int64 `n`, as NumPy's default integers are), the variable
  takes the dtype of the primitive's other inputs instead, as the literal
  would in Python (`_promoted_literals`), and the types are inferred again.
  """
  chosen = {}   # (function, variable) -> the type a literal variable takes
  while True:
    try:
      env = _fixpoint(program, arg_types, chosen)
    except errors.TypeInferenceError as e:
      if not chosen:
        raise
      shown = ", ".join(
          f"'{v}' of '{program.function(f).shown_name}': "
          f"{types_lib.format_type(t)}" for (f, v), t in chosen.items())
      raise errors.TypeInferenceError(
          f"{e} (This after Python literals took the dtypes of what they "
          f"meet: {shown}. A variable, and a function's result, has one "
          "dtype for all its uses and calls: give the literal its dtype "
          "where it is assigned, e.g. `tf.constant(1, tf.int64)`.)") from e
    promoted = _promoted_literals(program, env)
    if not promoted:
      break
    chosen.update(promoted)
  _check_complete(program, env)
  return ir1.Program(program.functions, env)


def _fixpoint(program, arg_types, chosen):
  env = dict(chosen)
  entry = program.entry
  for param, t in zip(entry.params, arg_types):
    env[(entry.name, param)] = t
  for _ in range(_MAX_SWEEPS):
    before = dict(env)
    for fn in program.functions:
      if all((fn.name, p) in env for p in fn.params):
        _sweep_function(program, fn, env)
    if env == before:
      return env
  raise errors.TypeInferenceError("type inference did not converge")


def _promoted_literals(program, env):
  """`{(function, variable): type}` for the inputs with literal-typed
  (weak) leaves of the first primitive that fails on their default dtype,
  those leaves given the dtype of the primitive's other inputs that lets
  it run (see `_candidates`, `_takes`);
  {} if every primitive runs. Raises `TypeInferenceError` naming the
  variables if no such dtype does. First, an argument of a call that is
  weaker than its parameter (the literal `0` where the parameter is int64)
  takes the parameter's type, so that a call passes its arguments as they
  are; and a callee's result weaker than the variable a call assigns it to
  (promoted there: `j = ident(1); j + n` with an int64 `n`) takes that
  variable's type, so that the call returns its result as it is (an
  inlined call copies it without a cast)."""
  def stronger(key, than_key):
    t, than = env.get(key), env.get(than_key)
    return (t is not None and than is not None and t != than
            and types_lib.join(t, than) == t)

  for fn in program.functions:
    for block in fn.blocks:
      for op in block.ops:
        if isinstance(op, ir1.Call):
          callee = program.function(op.callee)
          promoted = {}
          for v, param in zip(op.ins, callee.params):
            if stronger((op.callee, param), (fn.name, v)):
              promoted[(fn.name, v)] = env[(op.callee, param)]
          if stronger((fn.name, op.outs[0]), (op.callee, callee.result)):
            promoted[(op.callee, callee.result)] = env[(fn.name, op.outs[0])]
          if promoted:
            return promoted
  for fn in program.functions:
    for block in fn.blocks:
      for op in block.ops:
        in_types = [env.get((fn.name, v)) for v in op.ins]
        if (not isinstance(op, ir1.Primitive) or op.batched
            or any(t is None for t in in_types)):
          continue
        weak = [i for i, t in enumerate(in_types)
                if any(leaf.weak for leaf in tf.nest.flatten(t))]
        out_types = [env.get((fn.name, v)) for v in op.outs]
        if not weak or _runs(op, [_strong(t) for t in in_types], out_types):
          continue
        for dtypes in _choices(_candidates(in_types), len(weak)):
          trial = list(in_types)
          for i, dtype in zip(weak, dtypes):
            trial[i] = tf.nest.map_structure(
                lambda t, d=dtype: _takes(t, d), in_types[i])
          if _runs(op, [_strong(t) for t in trial], out_types):
            return {(fn.name, op.ins[i]): trial[i] for i in weak
                    if trial[i] != in_types[i]}
        _raise_unpromotable(op, in_types, weak)
  return {}


_MAX_CHOICES = 64   # dtype assignments tried for one primitive's literals


def _choices(candidates, num_weak):
  """The dtypes the literal-typed inputs may take together, as one tuple
  (one per input) each: first one dtype for all of them, then (up to
  `_MAX_CHOICES` in all) a dtype each, for literals that meet different
  dtypes (`a = 0; b = 1.5` before an `if`, then `a + n, b + x` with an
  int64 `n` and a float64 `x`)."""
  same = [(d,) * num_weak for d in candidates]
  mixed = (c for c in itertools.product(candidates, repeat=num_weak)
           if c not in same)
  return same + list(itertools.islice(mixed, _MAX_CHOICES - len(same)))


def _candidates(in_types):
  """The dtypes a literal among `in_types` may take: those of the strong
  leaves, integers first, no integer under 32 bits (an int8 counter would
  wrap where Python's would not; a float literal may take float16)."""
  return sorted(
      {leaf.dtype for t in in_types for leaf in tf.nest.flatten(t)
       if not leaf.weak and (leaf.dtype.is_floating or (
           leaf.dtype.is_integer and leaf.dtype.size >= 4))},
      key=lambda d: (not d.is_integer, d.name))


def _takes(leaf, dtype):
  """`leaf` as it would be if a literal leaf took `dtype`: an integer
  literal only an integer dtype (a float loop counter stops counting
  past 2**24), a float literal only a float one."""
  if leaf.weak and (leaf.dtype.is_integer == dtype.is_integer
                    and types_lib.compatible_kind(leaf.dtype, dtype)):
    return types_lib.TensorType(dtype, leaf.shape)
  return leaf


def _raise_unpromotable(op, in_types, weak):
  """The error for a primitive that fails on its literal-typed inputs
  whatever dtype they take. Names the user's variables (the frontend's
  own, `_i0` and the like, only if there are no others)."""
  names = [op.ins[i] for i in weak]
  names = [n for n in names if not n.startswith("_")] or names
  raise errors.TypeInferenceError(
      f"`{op.code.source}` ({op.code.filename}, line {op.code.lineno}) "
      f"fails on {', '.join(repr(n) for n in names)}, typed by Python "
      "literals (TensorFlow's int32/float32), with inputs of types "
      + ", ".join(f"{v}: {types_lib.format_type(t)}"
                  for v, t in zip(op.ins, in_types))
      + (" (names starting with `_` are the frontend's: `_iN` and `_stepN` "
         "count a `for` loop over a range)" if names[0].startswith("_") else "")
      + ". An integer literal stays an integer of at least 32 bits: cast "
      "where it meets another dtype (`tf.cast(i, x.dtype)`), or give the "
      "variable its dtype where it is first assigned (`i = tf.constant(0, "
      "tf.int64)`)")


def _strong(var_type):
  """The type a variable of `var_type` has at run time (weak leaves as
  tensors of their default dtype)."""
  return tf.nest.map_structure(
      lambda t: types_lib.TensorType(t.dtype, t.shape), var_type)


def _runs(op, in_types, out_types):
  try:
    abstract_eval(op, in_types, out_types)
    return True
  except errors.TypeInferenceError:
    return False


def _join_into(env, function, var, t):
  key = (function.name, var)
  env[key] = types_lib.join(
      env.get(key), t,
      f"variable '{var}' of function '{function.shown_name}'")


def _sweep_function(program, fn, env):
  for block in fn.blocks:
    for op in block.ops:
      in_types = [env.get((fn.name, v)) for v in op.ins]
      if any(t is None for t in in_types):
        continue
      match op:
        case ir1.Primitive():
          out_types = abstract_eval(
              op, in_types, [env.get((fn.name, v)) for v in op.outs])
          for var, t in zip(op.outs, out_types):
            _join_into(env, fn, var, t)
        case ir1.Call(outs, callee, ins):
          callee_fn = program.function(callee)
          for param, t in zip(callee_fn.params, in_types):
            _join_into(env, callee_fn, param, t)
          result = env.get((callee, callee_fn.result))
          if result is not None:
            _join_into(env, fn, outs[0], result)
        case _:
          raise errors.IRError(f"unknown IR-1 op {op!r}")


def _abstract_arg(t, batched, literal=0):
  """A TensorSpec for tracing; a weak type traces as a Python literal
  (`literal` of its dtype), except an int64 one (a literal past int32's
  range, which TensorFlow types int64): a Python 0 would type what it
  computes int32, and the value would wrap."""
  if t.weak and not batched and t.dtype != tf.int64:
    return t.dtype.as_numpy_dtype(literal).item()
  return t.spec((None,) if batched else ())


# The values literal-typed inputs trace as, in turn, while the code raises
# an ArithmeticError on them (`1.0 / scale` after `scale = 2.0` or `4.0`
# divides by zero at 0; `1 / (k - 1)` at 1).
_LITERAL_VALUES = (0, 1, 2)


# Code -> {(batched, input types[, strong output types]): output types};
# weak, so that the code of a batched function that is dropped is freed
# with it.
_EVAL_CACHE = weakref.WeakKeyDictionary()


def abstract_eval(op, in_types, out_types=None):
  """The per-example output types of a Primitive on inputs of `in_types`.

  `out_types`: the types its outputs have so far (None for one not known
  yet). What the code assigns takes the strong ones as it goes
  (`pyops.as_assigned`), so that a variable has its type within the
  primitive too: after `b = 1.0 / 3.0` with a float64 `b`, `c = b` types
  `c` float64. As types grow stronger the code is traced again, but only
  code that assigned a Python number can compute otherwise (`numbers_met`):
  other code's output types hold for any `out_types`.
  """
  out_types = out_types or [None] * len(op.outs)
  cache = _EVAL_CACHE.setdefault(op.code, {})
  key = (op.batched, types_lib.hashable(tuple(in_types)))
  if key in cache:
    return cache[key]
  declared = _declared_types(op, in_types)
  if declared is not None:
    cache[key] = declared
    return declared
  targets = tuple(types_lib.hashable(_strong_only(t)) for t in out_types)
  if key + targets not in cache:
    found, numbers_met, sources = _trace_types(op, in_types, out_types)
    cache[key + targets if numbers_met else key] = found
    if not op.batched and not numbers_met:
      _MOVED_INPUTS.setdefault(op.code, {})[key[1]] = sources
    return found
  return cache[key + targets]


# Code -> {input types: `_moved_inputs` of its trace on them}; weak, as
# `_EVAL_CACHE`.
_MOVED_INPUTS = weakref.WeakKeyDictionary()


def moved_inputs(op, in_types):
  """Where a primitive's code, on one example's inputs of `in_types`, only
  moves its inputs into its outputs (copies, renamings, a tuple's fields:
  much of what inlining and the frontend leave between the computing
  code): per output, the positions among its flattened inputs of that
  output's flattened leaves, which then hold for a batch as well. None
  where the code computes anything (a constant too), has rewritten
  subscripts, or was not traced on these types. (Inlining's copies,
  made after type inference, move their inputs in order.)"""
  if op.batched or op.code.subscripts:
    return None
  if op.code is inline.COPY:
    sizes = [len(tf.nest.flatten(t)) for t in in_types]
    return tuple(tuple(range(end - size, end)) for size, end in
                 zip(sizes, itertools.accumulate(sizes)))
  found = _MOVED_INPUTS.get(op.code, {})
  return found.get(types_lib.hashable(tuple(in_types)))


def _moved_inputs(args, outs):
  """`moved_inputs` of code traced on `args` that returned `outs`: each
  output leaf must be an input tensor itself."""
  position = {id(x): i for i, x in enumerate(tf.nest.flatten(args))
              if tf.is_tensor(x)}
  sources = []
  for out in outs:
    leaves = [position.get(id(v)) for v in tf.nest.flatten(out)]
    if any(i is None for i in leaves):
      return None
    sources.append(tuple(leaves))
  return tuple(sources)


def _declared_types(op, in_types):
  """The output types a `@tab.batched_primitive`'s `output_signature`
  declares for inputs of `in_types`, without tracing it; None where it
  declares none."""
  if not op.batched or op.code.declared_outputs is None:
    return None
  specs = [tf.nest.map_structure(lambda t: t.spec((None,)), t)
           for t in in_types]
  declared = op.code.declared_outputs(*specs)
  if declared is None:
    return None
  def leaf(spec):
    shape = (tf.TensorShape(spec.shape) if isinstance(spec, tf.TensorSpec)
             else tf.TensorShape(None))
    if (shape.rank is None or shape.rank == 0 or shape[0] is not None
        or not shape[1:].is_fully_defined()):
      raise errors.TypeInferenceError(
          f"the output_signature of the batched primitive "
          f"`{op.code.source}` ({op.code.filename}, line {op.code.lineno}) "
          f"gives {spec!r}: each output is a tf.TensorSpec whose leading "
          "(batch) dimension is None and whose other dimensions are known")
    return types_lib.TensorType(spec.dtype, tuple(shape[1:].as_list()))
  return [tf.nest.map_structure(leaf, d) for d in declared]


def _strong_only(var_type):
  """`var_type` with its weak leaves None: what `pyops.as_assigned` does
  with a variable's type."""
  if var_type is None:
    return None
  return tf.nest.map_structure(lambda t: None if t.weak else t, var_type)


def _trace_types(op, in_types, out_types):
  """`(output types, whether the code assigned a Python number, where it
  only moves its inputs: `_moved_inputs`)`; traces the code
  (`single_example.trace_in_scratch_graph`)."""
  found = []

  def trace(*args):
    with pyops.assigning(out_types, casts_tensors=False) as assigned:
      outs = single_example.call_single_example_code(op, *args)
    if op.batched:
      _check_keeps_the_batch(op, outs)
    found.append(([types_lib.type_of_value(v, batched=op.batched)
                   for v in outs], assigned.numbers_met,
                  _moved_inputs(args, outs)))

  for literal in _LITERAL_VALUES:
    args = [tf.nest.map_structure(
        lambda t, v=literal: _abstract_arg(t, op.batched, v), t)
            for t in in_types]
    try:
      single_example.trace_in_scratch_graph(trace, args)
      return found[0]
    except errors.AutobatchError:
      raise
    except ArithmeticError as e:
      if literal != _LITERAL_VALUES[-1]:
        continue
      raise_fails_on(op, in_types, e)
    except Exception as e:  # pylint: disable=broad-except
      raise_fails_on(op, in_types, e)


def raise_fails_on(op, in_types, e):
  """A TypeInferenceError: the code fails on inputs of `in_types`."""
  shown = ", ".join(f"{v}: {types_lib.format_type(t)}"
                    for v, t in zip(op.ins, in_types))
  hint = ""
  if isinstance(e, TypeError) and "list indices" in str(e):
    hint = (". A Python list cannot be indexed by a per-example value: "
            "stack it (`tf.stack(values)`) and index with `tf.gather`")
  casts = {"int": "tf.int32", "float": "tf.float32",
           "complex": "tf.complex64"}
  # Python's message starts "int() argument must be ...".
  python_cast = str(e).split("()", 1)[0]
  if (isinstance(e, TypeError) and "Tensor'" in str(e)
      and python_cast in casts):
    hint = (". A per-example value is a tensor, not a Python number: "
            f"instead of {python_cast}(x) write tf.cast(x, "
            f"{casts[python_cast]})"
            + (" (after tf.math.floor or tf.math.round, which pick the "
               "rounding)" if python_cast == "int" else ""))
  if isinstance(e, tf.errors.OperatorNotAllowedInGraphError):
    hint = (". (Not a matter of eager execution or tf.function here: "
            "Python's `if`, `while`, `min`/`max`, `in` and `bool()` of a "
            "per-example value work in a @tab.batch function's own body, "
            "which tfp_autobatch converts, but not inside a plain helper "
            "or lambda it calls: move them into the body, or use tf.where, "
            "tf.minimum and tf.maximum there)")
  error = errors.TypeInferenceError(
      f"`{op.code.source}` ({op.code.filename}, line {op.code.lineno}) "
      f"fails on inputs of types ({shown}): {type(e).__name__}: {e}{hint}")
  error.failure = e
  raise error from e


def _check_keeps_the_batch(op, outs):
  """A `@batched_primitive` maps over the batch: each tensor it returns
  has the batch (unknown while tracing) as its leading dimension."""
  for leaf in tf.nest.flatten(outs):
    shape = tf.convert_to_tensor(leaf).shape
    if shape.rank == 0 or shape[0] is not None:
      raise errors.TypeInferenceError(
          f"the batched primitive `{op.code.source}` ({op.code.filename}, "
          f"line {op.code.lineno}) returned a value of shape {shape} for a "
          "batch of any size: a @tab.batched_primitive maps over the "
          "batch, so everything it returns keeps the batch as its leading "
          "dimension (reduce over axis -1, not over all axes or axis 0)")


def _check_complete(program, env):
  for fn in program.functions:
    if not all((fn.name, p) in env for p in fn.params):
      continue   # never called with these inputs
    if (fn.name, fn.result) not in env:
      raise errors.TypeInferenceError(
          f"cannot infer the result type of '{fn.shown_name}': no path "
          "returns without first calling itself (is there a base case?)")
    for block in fn.blocks:
      if isinstance(block.terminator, ir1.Branch):
        t = env.get((fn.name, block.terminator.cond))
        if isinstance(t, types_lib.TensorType) and t.shape != ():
          raise errors.TypeInferenceError(
              f"a condition in '{fn.shown_name}' has shape {t.shape} per "
              "example; conditions must be scalars (reduce with "
              "tf.reduce_any/all)")
