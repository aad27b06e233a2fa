"""The compiler pipeline, in order, and the one cache of converted programs.

    Python source --frontend.convert--> IR-1 (untyped, one per entry function)
      --check_definitely_assigned--> the same, or a ConversionError
      --infer_types--> typed IR-1 (one per input signature)
      --inline, if_to_select, tail_duplicate--> fewer, bigger blocks
        (for `backends.NEVER_DIFFERENTIATED`, `pc:xla`, a variant whose
        floating-point `if`s are selects too)
      --lower, stack_optimize, branch_at_call, return_early,
        drop_redundant_copies--> IR-2 (program-counter backends)
      --backend--> runtime (one per signature and backend)

With TFP_AUTOBATCH_DEBUG=1 (the tests set it), `verify` runs after each pass.
"""
import itertools
import os

from tfp_autobatch import backends
from tfp_autobatch.analysis import definite_assignment
from tfp_autobatch.frontend import convert
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import ir2
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.ir import verify as verify_lib
from tfp_autobatch.passes import branch_at_call
from tfp_autobatch.passes import if_to_select
from tfp_autobatch.passes import infer_types
from tfp_autobatch.passes import inline
from tfp_autobatch.passes import lower
from tfp_autobatch.passes import redundant_copies
from tfp_autobatch.passes import return_early
from tfp_autobatch.passes import stack_optimize
from tfp_autobatch.passes import tail_duplicate

CACHE_ATTRIBUTE = "_pipeline_cache"   # the cache's name on the function


def _cache(entry):
  """The entry function's cache of what the pipeline made of it:

    "program"                                  -> untyped IR-1 program
    ("selected", arg types, floats)            -> typed IR-1 program after
                                                  if_to_select(floats=...)
    ("typed", arg types)                       -> typed IR-1 program
    ("typed", arg types, "floats selected")    -> the same for the backends
                                                  no gradient goes through
                                                  (the one above if their
                                                  if_to_select changed
                                                  nothing)
    ("runtime", arg types, backend, max_stack_depth) -> runtime

  Kept on the function, not in a module-level dict, so that a batched
  function made and dropped (one per NUTS kernel, or per closure from a
  factory) is freed with all it compiled (about 6 MB of traces each)."""
  return entry.__dict__.setdefault(CACHE_ATTRIBUTE, {})


def _checked(program, after):
  if os.environ.get("TFP_AUTOBATCH_DEBUG", "0") == "1":
    verify_lib.verify(program, after)
  return program


def convert_program(entry):
  """IR-1 for `entry` and every batched function it calls, entry first."""
  cache = _cache(entry)
  if "program" not in cache:
    names, queue, taken = {}, [], set()

    def name_of(bf):
      if bf not in names:
        base = bf.python_function.__name__
        name = base
        for k in itertools.count(2):
          if name not in taken:
            break
          name = f"{base}_{k}"
        taken.add(name)
        names[bf] = name
        queue.append(bf)
      return names[bf]

    name_of(entry)
    functions = []
    while len(functions) < len(queue):
      bf = queue[len(functions)]
      functions.append(convert.FunctionConverter(
          bf.python_function, names[bf], name_of).convert())
    program = _checked(ir1.Program(tuple(functions)), "convert")
    cache["program"] = definite_assignment.check_definitely_assigned(program)
  return cache["program"]


def selects_floats(backend):
  """Whether `backend`'s program makes floating-point `if`s selects too:
  only where no gradient can go through it (`pc:xla`), since a select's
  gradient turns the untaken arm's NaN into a NaN gradient."""
  return backend in backends.NEVER_DIFFERENTIATED


def _selected(entry, arg_types, floats):
  """Typed IR-1 through if_to_select: integer `if`s made selects, and with
  `floats` the floating-point ones too, converted in the integer-only
  program (so that the two differ in those only)."""
  cache = _cache(entry)
  key = ("selected", types_lib.hashable(tuple(arg_types)), floats)
  if key not in cache:
    if floats:
      program = _selected(entry, arg_types, floats=False)
    else:
      program = convert_program(entry)
      program = _checked(infer_types.infer_types(program, arg_types),
                         "infer_types")
      program = _checked(inline.inline(program), "inline")
    cache[key] = _checked(if_to_select.if_to_select(program, floats=floats),
                          "if_to_select")
  return cache[key]


def typed_program(entry, arg_types, backend=None):
  """Typed IR-1 for `entry` on inputs of `arg_types`, as `backend` runs it:
  the program every backend shares, or for a backend that selects
  floating-point `if`s (`selects_floats`) its own variant (the same object
  where it has none to select). None is the shared one, which the
  reference interpreter runs."""
  cache = _cache(entry)
  floats = selects_floats(backend)
  key = ("typed", types_lib.hashable(tuple(arg_types)))
  if floats:
    key += ("floats selected",)
  if key not in cache:
    selected = _selected(entry, arg_types, floats)
    if floats and selected is _selected(entry, arg_types, floats=False):
      cache[key] = typed_program(entry, arg_types)
    else:
      cache[key] = _checked(tail_duplicate.tail_duplicate(selected),
                            "tail_duplicate")
  return cache[key]


def _ir2_check(program, after):
  if os.environ.get("TFP_AUTOBATCH_DEBUG", "0") == "1":
    ir2.verify_ir2(program, after)
  return program


def _lowered(typed, before=None):
  """IR-2 of a typed IR-1 program, through every pass, or through the
  passes before the one named `before` (not cached)."""
  def checked(name, run):
    return name, lambda program: _ir2_check(run(program), name)
  passes = [
      ("stack_optimize",
       lambda program: stack_optimize.optimize(program, _ir2_check)),
      checked("branch_at_call_sites", branch_at_call.branch_at_call_sites),
      checked("return_early", return_early.return_early),
      checked("drop_redundant_copies", redundant_copies.drop_redundant_copies),
  ]
  if before is not None and before not in dict(passes):
    raise ValueError(f"no IR-2 pass {before!r}; passes after lowering: "
                     f"{[name for name, _ in passes]}")
  program = _ir2_check(lower.lower_to_stack_program(typed), "lower")
  for name, run in passes:
    if name == before:
      break
    program = run(program)
  return program


def stack_program_of(typed):
  """The optimised IR-2 program of a typed IR-1 program (cached on it)."""
  if "ir2" not in typed.derived:
    typed.derived["ir2"] = _lowered(typed)
  return typed.derived["ir2"]


def stack_program_before(typed, pass_name):
  """The IR-2 program of a typed IR-1 program as the pass `pass_name`
  receives it (for tests of one pass; not cached)."""
  return _lowered(typed, before=pass_name)


def stack_program(entry, arg_types, backend=None):
  """IR-2 for `entry` on inputs of `arg_types`, as `backend` runs it (see
  `typed_program`)."""
  return stack_program_of(typed_program(entry, arg_types, backend))


def runtime(entry, arg_types, backend):
  cache = _cache(entry)
  key = ("runtime", types_lib.hashable(tuple(arg_types)), backend,
         entry.max_stack_depth)
  if key not in cache:
    cache[key] = backends.make_runtime(
        backend, typed_program(entry, arg_types, backend),
        entry.max_stack_depth, stack_program_of,
        differentiable=lambda: runtime(entry, arg_types,
                                       backends.GRADIENT_BACKEND))
  return cache[key]
