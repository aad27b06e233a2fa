"""Which names a piece of a function body reads, assigns or binds to a lambda.

The converter needs these facts before it lowers anything: the locals decide
which names are IR variables (the rest resolve to globals and closures), and
the names a statement reads and writes become the ins and outs of its
`Primitive`. Pure functions of the `ast`, kept apart from the lowering so they
can be read and tested on their own.
"""
import ast


class _Scope:
  """Names bound in a lambda or comprehension inside an expression."""

  @staticmethod
  def bound_names(node):
    names = set()
    if isinstance(node, ast.Lambda):
      a = node.args
      for arg in a.posonlyargs + a.args + a.kwonlyargs:
        names.add(arg.arg)
      for arg in (a.vararg, a.kwarg):
        if arg is not None:
          names.add(arg.arg)
    else:
      for gen in node.generators:
        names |= {n.id for n in ast.walk(gen.target) if isinstance(n, ast.Name)}
    return names


def read_names(node, bound=frozenset()):
  """Names read by an expression, outside lambda/comprehension scopes."""
  if isinstance(node, _SCOPES):
    bound = bound | _Scope.bound_names(node)
  if isinstance(node, ast.Name):
    return [] if node.id in bound or not isinstance(node.ctx, ast.Load) \
        else [node.id]
  names = []
  for child in ast.iter_child_nodes(node):
    names.extend(read_names(child, bound))
  return names


_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
           ast.GeneratorExp)


def assigned_names(stmts):
  """Names a function body assigns, outside lambda/comprehension scopes."""
  names, todo = set(), list(stmts)
  while todo:
    node = todo.pop()
    if isinstance(node, _SCOPES):
      continue
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
      names.add(node.id)
    todo.extend(ast.iter_child_nodes(node))
  return names


def local_lambdas(stmts, params):
  """Local names bound exactly once, to a lambda: {name: Lambda node}."""
  stores, lambdas = {}, {}
  for stmt in stmts:
    for node in ast.walk(stmt):
      if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        stores[node.id] = stores.get(node.id, 0) + 1
      if (isinstance(node, ast.Assign) and len(node.targets) == 1
          and isinstance(node.targets[0], ast.Name)
          and isinstance(node.value, ast.Lambda)):
        lambdas[node.targets[0].id] = node.value
  return {k: v for k, v in lambdas.items()
          if stores.get(k) == 1 and k not in params}


def target_names(target):
  """The names in an assignment target."""
  return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
