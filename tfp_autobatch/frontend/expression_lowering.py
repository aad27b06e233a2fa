"""Lowers one Python expression into IR-1, for `convert.FunctionConverter`.

Calls of batched functions cannot stay inside a compiled Python expression:
they become `Call`s (or batched `Primitive`s) of their own, their arguments
held in variables. Conditional expressions and short-circuiting `and`/`or`
become branches, and operators that do not work on symbolic tensors (`not`,
chained comparisons, indexing) become calls of `pyops`. The lowering emits its
ops and blocks through the converter that owns the function being built.
"""
import ast
import copy

from tfp_autobatch.ir import ir1
from tfp_autobatch.operators import pyops


def _safe_operand(node):
  """An expression that cannot fail or act when its value is not needed."""
  match node:
    case ast.Name() | ast.Constant():
      return True
    case ast.Attribute(value=value):
      return _safe_operand(value)
    case ast.UnaryOp(op=ast.Not(), operand=operand):
      return _safe_operand(operand)
    case ast.Compare(left=left, comparators=comparators):
      return all(_safe_operand(v) for v in [left] + comparators)
    case ast.BoolOp(values=values):
      return all(_safe_operand(v) for v in values)
  return False


def _literal_slice(index):
  """Whether `index` is a slice whose bounds are literals (`v[1:-1]`), which
  `pyops.getitem` need not see: other slices go there to be checked."""
  if not isinstance(index, ast.Slice):
    return False
  def literal(bound):
    if isinstance(bound, ast.UnaryOp) and isinstance(bound.op, ast.USub):
      bound = bound.operand
    return bound is None or isinstance(bound, ast.Constant)
  return all(literal(b) for b in (index.lower, index.upper, index.step))


def _constant_index(node):
  """Whether one index of a subscript is a literal (`"w"`, `0`, `-1`):
  indices made of those are not gathered (see `pyops.getitem`)."""
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
    node = node.operand
  return isinstance(node, ast.Constant)


def _is_getitem(node):
  """Whether `node` is a subscript rewritten into `pyops.getitem`."""
  return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and isinstance(node.func.value, ast.Name)
          and node.func.value.id == pyops.NAME
          and node.func.attr == "getitem")


def checks_index(node):
  """Whether `node` is a subscript rewritten into `pyops.getitem` (not yet
  numbered) that may gather by a computed index, which `pyops.getitem`
  then checks: not a slice, nor an index made of literals."""
  if not _is_getitem(node) or len(node.args) != 2:
    return False
  index = node.args[1]
  parts = index.elts if isinstance(index, ast.Tuple) else [index]
  return not (any(isinstance(p, ast.Slice) for p in parts)
              or all(_constant_index(p) for p in parts))


class _AsWritten(ast.NodeTransformer):
  def visit_Call(self, node):
    node = self.generic_visit(node)
    if _is_getitem(node):
      return ast.Subscript(node.args[0], node.args[1], ast.Load())
    return node


def subscript_as_written(node):
  """The source of a rewritten subscript as written (`m[i][j]`, where its
  value is itself a rewritten `m[i]`)."""
  return ast.unparse(_AsWritten().visit(copy.deepcopy(node)))


class _ElementwiseEquality(ast.NodeTransformer):
  _CALLS = {ast.Eq: "equal", ast.NotEq: "not_equal"}

  def visit_Compare(self, node):
    node = self.generic_visit(node)
    if not any(type(op) in self._CALLS for op in node.ops):
      return node
    operands = [node.left] + node.comparators
    pairs = [ast.copy_location(
        pyops.call(self._CALLS[type(op)], [a, b]) if type(op) in self._CALLS
        else ast.Compare(a, [op], [b]), node)
             for a, op, b in zip(operands, node.ops, operands[1:])]
    if len(pairs) == 1:
      return pairs[0]
    return ast.copy_location(pyops.call("all_of", pairs), node)


def elementwise_equality(stmt):
  """`stmt` (a copy, changed in place) with `a == b` and `a != b` as
  `pyops.equal(a, b)` and `pyops.not_equal(a, b)`: the code a primitive
  runs, which must compare tensors elementwise in a `tf.compat.v1` graph
  too (see `pyops.equal`). The IR prints the comparison as written."""
  return _ElementwiseEquality().visit(stmt)


class ExpressionLowering(ast.NodeTransformer):
  """Rewrites one expression, emitting ops and blocks into the converter."""

  def __init__(self, converter):
    self.c = converter

  def operand(self, node):
    """Lowers `node` and makes sure it is held in a variable."""
    node = self.visit(node)
    if isinstance(node, ast.Name) and node.id in self.c.locals:
      return node.id
    tmp = self.c.fresh("t")
    self.c.assign(tmp, node, node if hasattr(node, "lineno") else self.c.node)
    return tmp

  def visit_Call(self, node):
    kind, value = self.c.batched_kind(node.func)
    if kind is None:
      node = self.generic_visit(node)
      # By identity: the user's callable may be unhashable.
      if any(self.c.resolve(node.func) is f for f in (min, max)):
        return self._min_max(node)
      return node
    if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
      raise self.c.error(node, "keyword or starred arguments to a batched "
                         "function", "pass arguments positionally")
    ins = tuple(self.operand(a) for a in node.args)
    out = self.c.fresh("t")
    self.c.flush()
    if kind == "call":
      self.c.ops.append(ir1.Call((out,), self.c.callee_name(value), ins,
                                  node.lineno))
    else:
      code = ir1.Code(value.as_primitive_fn(), ast.unparse(node),
                      self.c.filename, node.lineno,
                      declared_outputs=value.declared_outputs,
                      fine_buckets=value.fine_buckets)
      self.c.ops.append(ir1.Primitive((out,), code, ins, batched=True))
    return ast.copy_location(ast.Name(out, ast.Load()), node)

  def _min_max(self, node):
    """`min(a, b, ...)`/`max(a, b, ...)` as `pyops.minimum`/`maximum`
    (Python's compare values with `<`, which a symbolic tensor cannot
    answer)."""
    name = self.c.resolve(node.func).__name__
    if (len(node.args) < 2 or node.keywords
        or any(isinstance(a, ast.Starred) for a in node.args)):
      raise self.c.error(node, f"{name}() of one sequence or with keyword "
                         "arguments", f"pass the values to compare: `{name}(a, "
                         f"b)`, or reduce a tensor with tf.reduce_{name}")
    return ast.copy_location(pyops.call(f"{name}imum", node.args), node)

  def visit_Name(self, node):
    if isinstance(node.ctx, ast.Load) and node.id in self.c.lambdas:
      return copy.deepcopy(self.c.lambdas[node.id])   # Python binds late too
    kind, _ = self.c.batched_kind(node)
    if kind == "call":
      raise self.c.error(node, f"using the batched function `{node.id}` as a "
                         "value", "call it directly by name")
    return node

  def visit_Attribute(self, node):
    kind, _ = self.c.batched_kind(node)
    if kind == "call":
      raise self.c.error(node, f"using the batched function "
                         f"`{ast.unparse(node)}` as a value",
                         "call it directly")
    return self.generic_visit(node)

  def visit_Lambda(self, node):
    self._no_batched_calls(node, "a lambda")
    return node

  def _no_batched_calls(self, node, where):
    for sub in ast.walk(node):
      if isinstance(sub, ast.Call) and self.c.batched_kind(sub.func)[0]:
        raise self.c.error(sub, f"calling a batched function inside {where}",
                           "call it in a statement of its own")
    return node

  def visit_ListComp(self, node):
    return self._no_batched_calls(node, "a comprehension")

  visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_ListComp

  def visit_Subscript(self, node):
    node = self.generic_visit(node)
    if not isinstance(node.ctx, ast.Load) or _literal_slice(node.slice):
      return node
    return ast.copy_location(
        pyops.call("getitem", [node.value, node.slice]), node)

  def visit_UnaryOp(self, node):
    node = self.generic_visit(node)
    if isinstance(node.op, ast.Not):
      return ast.copy_location(
          pyops.call("logical_not", [node.operand]), node)
    return node

  def visit_Compare(self, node):
    node = self.generic_visit(node)
    for op, right in zip(node.ops, node.comparators):
      if isinstance(op, (ast.In, ast.NotIn)):
        if not isinstance(right, (ast.Tuple, ast.List, ast.Set)):
          raise self.c.error(node, "`in` over something other than a "
                             "literal tuple or list of values", "compare "
                             "with each value, or use tf.reduce_any("
                             "tf.equal(values, x))")
        if any(isinstance(e, ast.Starred) for e in right.elts):
          raise self.c.error(node, "a starred value in an `in` test",
                             "list the values one by one")
    if len(node.ops) == 1:
      return self._membership(node)
    operands = [node.left] + node.comparators
    pairs = [self._membership(ast.Compare(a, [op], [b]))
             for a, op, b in zip(operands, node.ops, operands[1:])]
    return ast.copy_location(pyops.call("all_of", pairs), node)

  @staticmethod
  def _membership(node):
    """A one-operator comparison, with `x in (a, b)` as
    `pyops.is_one_of(x, a, b)` (Python's compares with `==`, which a
    symbolic tensor cannot answer as a bool)."""
    op = node.ops[0]
    if not isinstance(op, (ast.In, ast.NotIn)):
      return node
    test = ast.copy_location(pyops.call(
        "is_one_of", [node.left] + node.comparators[0].elts), node)
    if isinstance(op, ast.NotIn):
      test = ast.copy_location(pyops.call("logical_not", [test]), node)
    return test

  def visit_IfExp(self, node):
    c = self.c
    result = c.fresh("t")
    cond = c.condition(node.test)
    then_label, else_label, join = (c.new_label("then"), c.new_label("else"),
                                    c.new_label("endif"))
    c.finish(ir1.Branch(cond, then_label, else_label))
    for label, branch in ((then_label, node.body), (else_label, node.orelse)):
      c.start(label)
      c.assign(result, self.visit(branch), node)
      c.finish(ir1.Jump(join))
    c.start(join)
    return ast.copy_location(ast.Name(result, ast.Load()), node)

  def visit_BoolOp(self, node):
    """`a and b`: result = a; if truthy(result): result = b (dually for or).

    When every operand is safe to evaluate regardless of the others (names,
    attributes, constants, and comparisons and `not` of those), nothing is
    gained by short-circuiting, and a branch would cost batched steps: the
    operands are combined by a select instead (`pyops.and_values`).
    """
    c = self.c
    if all(_safe_operand(v) for v in node.values):
      combine = "and_values" if isinstance(node.op, ast.And) else "or_values"
      return ast.copy_location(
          pyops.call(combine, [self.visit(v) for v in node.values]), node)
    result = c.fresh("t")
    join = c.new_label("endbool")
    c.assign(result, self.visit(node.values[0]), node)
    for value in node.values[1:]:
      cond = c.fresh("cond")
      c.assign(cond, pyops.call("truthy", [ast.Name(result, ast.Load())]),
               node)
      more = c.new_label("bool")
      if isinstance(node.op, ast.And):
        c.finish(ir1.Branch(cond, more, join))
      else:
        c.finish(ir1.Branch(cond, join, more))
      c.start(more)
      c.assign(result, self.visit(value), node)
    c.finish(ir1.Jump(join))
    c.start(join)
    return ast.copy_location(ast.Name(result, ast.Load()), node)
