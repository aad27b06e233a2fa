"""Reading the Python source of a user's function.

The one place that touches `inspect`/`ast` parsing of user code, so that the
converter sees a `FunctionDef` whose line numbers are the user's file lines.
(We parse with the standard `ast` module: no private TensorFlow import is
needed for the frontend.)
"""
import ast
import builtins
import inspect
import symtable
import textwrap

import numpy as np

from tfp_autobatch import errors


def parse_function(py_fn):
  """Returns (FunctionDef node, filename) for a Python function."""
  name = getattr(py_fn, "__name__", repr(py_fn))
  try:
    filename = inspect.getsourcefile(py_fn) or "<unknown>"
    lines, first_line = inspect.getsourcelines(py_fn)
  except (OSError, TypeError) as e:
    raise errors.ConversionError(
        f"cannot read the source code ({e}); define the function in a .py "
        "file or notebook cell, not with exec/eval.", function=name) from None
  source = textwrap.dedent("".join(lines))
  tree = ast.parse(source)
  ast.increment_lineno(tree, first_line - 1)
  node = tree.body[0]
  if isinstance(node, ast.AsyncFunctionDef):
    raise errors.ConversionError(
        "async functions cannot be batched; write a plain `def`.",
        function=name, filename=filename, lineno=node.lineno,
        construct="async def")
  if not isinstance(node, ast.FunctionDef):
    raise errors.ConversionError(
        "only functions defined with `def` can be batched (not lambdas).",
        function=name, filename=filename, lineno=first_line,
        construct=type(node).__name__)
  return node, filename


def closure_values(py_fn):
  """The values of the function's closure cells, by name (empty cells left out)."""
  values = {}
  for var, cell in zip(py_fn.__code__.co_freevars, py_fn.__closure__ or ()):
    try:
      values[var] = cell.cell_contents
    except ValueError:
      pass
  return values


def _frozen(value):
  """A NumPy array's copy (its later in-place changes are not seen);
  anything else as it is (a `tf.Variable` stays the variable)."""
  return value.copy() if isinstance(value, np.ndarray) else value


def _global_names(node):
  """The names a function (and the lambdas and comprehensions in it) reads
  from its module: free in it, not parameters or locals."""
  try:
    table = symtable.symtable(ast.unparse(node), "<batched function>",
                              "exec")
  except SyntaxError:
    # `nonlocal` out of its enclosing function, which the converter
    # rejects anyway: every name it reads.
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
  names, tables = set(), list(table.get_children())
  while tables:
    scope = tables.pop()
    names.update(scope.get_globals() if hasattr(scope, "get_globals")
                 else ())
    tables.extend(scope.get_children())
  return names


def frozen_scope(py_fn, node):
  """`(closure values, globals)` the converted code reads, as they are now.

  The batched function's code is traced again later (per input signature,
  per backend, and per batch size on some), and the types inferred now are
  kept: reading the live module and cells then would give a value rebound
  or resized since, on some backends and not others. So the globals are
  the ones the function names, and NumPy arrays among them or in its
  closure are copies. (A value reached through them, `cfg.w` or
  `params["w"]`, is read when traced, as under `tf.function`.)"""
  closure = {k: _frozen(v) for k, v in closure_values(py_fn).items()}
  module = py_fn.__globals__
  scope = {"__builtins__": module.get("__builtins__", builtins),
           "__name__": module.get("__name__")}
  for name in _global_names(node):
    if name in module:
      scope[name] = _frozen(module[name])
  return closure, scope
