"""Converts the Python source of one batched function into an IR-1 `Function`.

Statements are lowered into basic blocks. Straight-line statements become
`Primitive`s (consecutive ones are grouped into one, compiled once); calls of
other `@tab.batch` functions are hoisted out of expressions into `Call`s;
`if`/`while`/`for range`/`break`/`continue`/`return`, conditional expressions
and `and`/`or` become `Jump`/`Branch`/`Return` terminators; a short `for`
over a range of Python ints is unrolled instead (`static_trips`). Anything we
cannot batch raises `ConversionError` naming the line and saying what to write.
In a primitive's code each assignment is followed by `pyops.as_assigned`,
which gives the value its variable's inferred dtype where a Python literal
would otherwise stand for it.
Expressions are lowered by `expression_lowering`, using the facts about names
that `name_analysis` finds.
"""
import ast
import builtins
import copy
import itertools

import tensorflow as tf

from tfp_autobatch import errors
from tfp_autobatch.frontend import _source
from tfp_autobatch.frontend import batched_callees
from tfp_autobatch.frontend import expression_lowering
from tfp_autobatch.frontend import name_analysis
from tfp_autobatch.ir import ir1
from tfp_autobatch.operators import pyops

MAX_UNROLLED_ITERATIONS = 16   # longer loops over constant ranges stay loops

_REJECTED = {
    ast.Try: ("try/except", "check values with tf.where or tf.debugging instead"),
    ast.With: ("with", "move the `with` block outside the batched function"),
    ast.AsyncWith: ("async with", "write synchronous code"),
    ast.AsyncFor: ("async for", "write synchronous code"),
    ast.Global: ("global", "pass the value as an argument or capture it by closure"),
    ast.Nonlocal: ("nonlocal", "return the new value instead of assigning it"),
    ast.Yield: ("yield", "return a value; generators cannot be batched"),
    ast.YieldFrom: ("yield from", "return a value; generators cannot be batched"),
    ast.Await: ("await", "write synchronous code"),
    ast.FunctionDef: ("nested def", "define helper functions at module level"),
    ast.AsyncFunctionDef: ("nested async def", "define helpers at module level"),
    ast.ClassDef: ("class definition", "define classes at module level"),
    ast.Delete: ("del", "just stop using the variable"),
    ast.Raise: ("raise", "use tf.debugging assertions outside the batched function"),
    ast.Assert: ("assert", "check inputs before calling the batched function"),
    ast.Import: ("import", "import at module level"),
    ast.ImportFrom: ("import", "import at module level"),
    ast.Match: ("match", "use if/elif/else"),
    ast.NamedExpr: ("the walrus operator :=", "assign in a statement of its own"),
}
if hasattr(ast, "TryStar"):
  _REJECTED[ast.TryStar] = _REJECTED[ast.Try]

# What `FunctionConverter.literal_value` evaluates: arithmetic without `**`
# (no huge powers at conversion), comparisons and `and`/`or`/`not`.
_LITERAL_NODES = (
    ast.Constant, ast.Name, ast.Load, ast.UnaryOp, ast.BinOp, ast.BoolOp,
    ast.Compare, ast.UAdd, ast.USub, ast.Not, ast.Add, ast.Sub, ast.Mult,
    ast.Div, ast.FloorDiv, ast.Mod, ast.And, ast.Or, ast.Eq, ast.NotEq,
    ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _is_exact(value):
  """A Python int or bool (bool is an int): what `literal_value` computes
  with. Not a float: Python's float64 test could decide otherwise than
  TensorFlow's float32 one (0.1 + 0.2 != 0.3 only in float64)."""
  return isinstance(value, int)


def _assigned_names(stmt):
  """The names a straight-line statement (an assignment) assigns, each
  once, in order."""
  targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
  return list(dict.fromkeys(n for t in targets
                            for n in name_analysis.target_names(t)))


class FunctionConverter:
  """Builds the IR-1 function for one Python function."""

  def __init__(self, py_fn, ir_name, callee_name):
    """`callee_name(batched_function) -> str` names (and queues) a callee."""
    self.py_fn = py_fn
    self.ir_name = ir_name
    self.callee_name = callee_name
    self.node, self.filename = _source.parse_function(py_fn)
    self.closure, self.scope = _source.frozen_scope(py_fn, self.node)
    self.blocks = []
    self.label = None
    self.ops = []
    self.pending = []        # straight-line statements not yet a Primitive
    self.loops = []          # (continue_label, break_label)
    self.counter = itertools.count()
    self.locals = set()
    self.lambdas = {}   # local name -> the lambda it is bound to, once
    self.result = "_result"

  # --- errors and name resolution -------------------------------------------

  def error(self, node, construct, hint):
    return errors.ConversionError(
        f"not supported here: {construct}; {hint}.",
        function=self.py_fn.__qualname__, filename=self.filename,
        lineno=getattr(node, "lineno", self.node.lineno), construct=construct)

  def resolve(self, node):
    """The Python value an expression like `f` or `mod.f` names, or None."""
    if isinstance(node, ast.Name):
      if node.id in self.locals:
        return None
      for scope in (self.closure, self.scope, vars(builtins)):
        if node.id in scope:
          return scope[node.id]
      return None
    if isinstance(node, ast.Attribute):
      base = self.resolve(node.value)
      return None if base is None else getattr(base, node.attr, None)
    return None

  def batched_kind(self, node):
    """'call' for a @tab.batch function, 'primitive' for a batched primitive."""
    value = self.resolve(node)
    if isinstance(value, batched_callees.BatchedFunctionBase):
      return "call", value
    if isinstance(value, batched_callees.BatchedPrimitiveBase):
      return "primitive", value
    return None, value

  # --- block building ---------------------------------------------------------

  def fresh(self, hint):
    name = f"_{hint}{next(self.counter)}"
    self.locals.add(name)
    return name

  def new_label(self, hint):
    return f"{hint}{next(self.counter)}"

  def start(self, label):
    self.label, self.ops, self.pending = label, [], []

  def flush(self):
    """Turns pending straight-line statements into one Primitive."""
    if not self.pending:
      return
    stmts, self.pending = self.pending, []
    ins, outs, read_lines = [], [], []
    for stmt in stmts:
      reads = name_analysis.read_names(stmt.value)
      if isinstance(stmt, ast.AugAssign):
        reads = name_analysis.target_names(stmt.target) + reads
      for n in reads:
        if n in self.locals and n not in outs and n not in ins:
          ins.append(n)
          read_lines.append((n, stmt.lineno))
      for n in _assigned_names(stmt):
        if n not in outs:
          outs.append(n)
    self.ops.append(ir1.Primitive(
        tuple(outs), self.compile(stmts, ins, outs, tuple(read_lines)),
        tuple(ins)))

  def finish(self, terminator):
    self.flush()
    self.blocks.append(ir1.Block(self.label, tuple(self.ops), terminator))
    self.label = None

  def compile(self, stmts, ins, outs, read_lines=()):
    """Compiles statements into `fn(*ins) -> tuple(outs)` in the user's
    scope (`read_lines`: see `ir1.Code`).

    After each statement, each variable it assigned is passed through
    `pyops.as_assigned`, which gives it its inferred dtype for the rest of
    the code (`b = 1.0 / 3.0` then `c = b` for a float64 `b`: `c` reads a
    float64 tensor, not the Python float that would type it float32). The
    code's `source`, which the IR prints, is the user's statements alone;
    the code it runs numbers its subscripts (`number_subscripts`) and
    compares with `==` and `!=` elementwise in every mode
    (`expression_lowering.elementwise_equality`)."""
    name = f"{self.py_fn.__name__}_L{stmts[0].lineno}"
    ret = ast.Return(ast.Tuple([ast.Name(o, ast.Load()) for o in outs],
                               ast.Load()))
    source = "; ".join(ast.unparse(s) for s in stmts)
    stmts, sites = self.number_subscripts(stmts)
    stmts = [expression_lowering.elementwise_equality(s) for s in stmts]
    body = []
    for stmt in stmts:
      body.append(stmt)
      body.extend(ast.copy_location(ast.Assign(
          [ast.Name(n, ast.Store())],
          pyops.call("as_assigned", [ast.Constant(outs.index(n)),
                                     ast.Name(n, ast.Load())])), stmt)
                  for n in _assigned_names(stmt))
    inner = ast.FunctionDef(
        name=name,
        args=ast.arguments(posonlyargs=[], args=[ast.arg(i) for i in ins],
                           kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=body + [ret], decorator_list=[], returns=None,
        type_params=[])
    free = sorted(self.closure)
    outer = ast.FunctionDef(
        name="__tab_make",
        args=ast.arguments(posonlyargs=[],
                           args=[ast.arg(pyops.NAME)]
                           + [ast.arg(v) for v in free],
                           kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[inner, ast.Return(ast.Name(name, ast.Load()))],
        decorator_list=[], returns=None, type_params=[])
    module = ast.Module(body=[outer], type_ignores=[])
    ast.fix_missing_locations(module)
    for node in ast.walk(module):
      if getattr(node, "lineno", None) is None and hasattr(node, "lineno"):
        node.lineno = stmts[0].lineno
    namespace = {}
    exec(compile(module, self.filename, "exec"),   # pylint: disable=exec-used
         self.scope, namespace)
    fn = namespace["__tab_make"](pyops, *[self.closure[v] for v in free])
    return ir1.Code(fn, source, self.filename, stmts[0].lineno, read_lines,
                    sites)

  def number_subscripts(self, stmts):
    """`(copies of stmts, their sites)`: each subscript whose gather's index
    is checked (`expression_lowering.checks_index`) becomes
    `getitem(value, index, k)`, k its number among `sites` (its
    `ir1.SubscriptSite`s)."""
    stmts = copy.deepcopy(stmts)
    sites = []
    for stmt in stmts:
      # (In the order they are written: `ast.walk` goes breadth first.)
      found = sorted((node for node in ast.walk(stmt)
                      if expression_lowering.checks_index(node)),
                     key=lambda n: (n.lineno, n.col_offset))
      for node in found:
        sites.append(ir1.SubscriptSite(
            self.py_fn.__qualname__, self.filename, node.lineno,
            expression_lowering.subscript_as_written(node)))
        node.args.append(ast.Constant(len(sites) - 1))
    return stmts, tuple(sites)

  def assign(self, name, value_node, like):
    stmt = ast.Assign([ast.Name(name, ast.Store())], value_node)
    self.pending.append(ast.copy_location(stmt, like))

  # --- statements -------------------------------------------------------------

  def convert(self):
    args = self.node.args
    if (args.vararg or args.kwarg or args.kwonlyargs or args.defaults
        or args.posonlyargs):
      raise self.error(self.node, "*args, **kwargs, keyword-only or default "
                       "arguments", "take plain positional arguments, one per "
                       "batch")
    self.reject_unsupported()
    params = tuple(a.arg for a in args.args)
    self.lambdas = name_analysis.local_lambdas(self.node.body, params)
    assigned = name_analysis.assigned_names(self.node.body)
    self.locals = (set(params) | assigned) - set(self.lambdas)
    self.locals.add(self.result)
    self.start("entry")
    body = self.node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(
        body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
      body = body[1:]   # the docstring
    self.statements(body)
    falls_off = self.label
    if falls_off is not None:
      self.finish(ir1.Return())
    blocks = ir1.reachable(self.blocks)
    if falls_off is not None and any(b.label == falls_off for b in blocks):
      raise self.error(self.node.body[-1], "reaching the end of the function "
                       "without `return`", "make every path return a value")
    return ir1.Function(self.ir_name, params, self.result, tuple(blocks),
                        self.filename, self.node.lineno,
                        self.py_fn.__qualname__)

  def statements(self, stmts):
    for stmt in stmts:
      if self.label is None:      # code after return/break/continue
        self.start(self.new_label("dead"))
      self.statement(stmt)

  def reject_unsupported(self):
    for stmt in self.node.body:
      for node in ast.walk(stmt):
        if type(node) in _REJECTED:
          construct, hint = _REJECTED[type(node)]
          raise self.error(node, construct, hint)

  def statement(self, s):
    match s:
      case ast.Assign(targets=[ast.Name(id=name)]) if name in self.lambdas:
        pass   # inlined where it is used
      case ast.Assign(targets=targets, value=value):
        for t in targets:
          self.check_target(t)
        value = self.expression(value)    # may start new blocks
        self.pending.append(ast.copy_location(ast.Assign(targets, value), s))
      case ast.AugAssign(target=target, op=op, value=value):
        self.check_target(target)
        value = self.expression(value)
        self.pending.append(ast.copy_location(
            ast.AugAssign(target, op, value), s))
      case ast.AnnAssign(target=target, value=value) if value is not None:
        self.check_target(target)
        value = self.expression(value)
        self.pending.append(ast.copy_location(ast.Assign([target], value), s))
      case ast.Pass():
        pass
      case ast.Expr():
        raise self.error(s, "an expression statement (its result is thrown "
                         "away, so it can only matter for a side effect)",
                         "assign its result to a variable, or remove it")
      case ast.Return(value=None):
        raise self.error(s, "`return` without a value",
                         "return the value computed for this example")
      case ast.Return(value=value):
        self.assign(self.result, self.expression(value), s)
        self.finish(ir1.Return())
      case ast.If():
        self.if_statement(s)
      case ast.While():
        self.while_statement(s)
      case ast.For():
        self.for_statement(s)
      case ast.Break() | ast.Continue():
        if not self.loops:
          raise self.error(s, "break/continue outside a loop", "remove it")
        cont, brk = self.loops[-1]
        self.finish(ir1.Jump(brk if isinstance(s, ast.Break) else cont))
      case _:
        raise self.error(s, type(s).__name__, "rewrite it with assignments, "
                         "if/while/for and return")

  def check_target(self, target):
    for node in ast.walk(target):
      if isinstance(node, (ast.Subscript, ast.Attribute)):
        raise self.error(node, "assigning to an element or attribute "
                         f"(`{ast.unparse(target)}`) mutates an object",
                         "build a new value (e.g. with tf.tensor_scatter_nd_"
                         "update) and assign it to a variable")
      if isinstance(node, ast.Starred):
        raise self.error(node, "starred assignment", "unpack each element "
                         "explicitly")

  def condition(self, test):
    """Evaluates a test into a fresh bool variable; returns its name."""
    value = self.expression(test)
    cond = self.fresh("cond")
    self.assign(cond, pyops.call("truthy", [value]), test)
    return cond

  def if_statement(self, s):
    if isinstance(s.test, ast.Constant):
      # `if True:` / `if False:` (debugging switches): only the branch
      # taken, so what it assigns is assigned after it.
      self.statements(s.body if s.test.value else s.orelse)
      return
    cond = self.condition(s.test)
    then_label, else_label, join = (self.new_label("then"),
                                    self.new_label("else"),
                                    self.new_label("endif"))
    self.finish(ir1.Branch(cond, then_label, else_label if s.orelse else join))
    self.start(then_label)
    self.statements(s.body)
    if self.label is not None:
      self.finish(ir1.Jump(join))
    if s.orelse:
      self.start(else_label)
      self.statements(s.orelse)
      if self.label is not None:
        self.finish(ir1.Jump(join))
    self.start(join)

  def loop(self, header, cond, body_stmts, prologue=(), body=None):
    """Emits `header: cond? body : exit`, returns with `exit` started
    (`body`: the body's label, if the caller needs it first)."""
    body = body or self.new_label("body")
    exit_label = self.new_label("endloop")
    if cond is None:   # `while True`: leaves only by break or return
      self.finish(ir1.Jump(body))
    else:
      self.finish(ir1.Branch(cond, body, exit_label))
    self.start(body)
    self.pending.extend(prologue)
    self.loops.append((header, exit_label))
    self.statements(body_stmts)
    self.loops.pop()
    if self.label is not None:
      self.finish(ir1.Jump(header))
    self.start(exit_label)

  def while_statement(self, s):
    if s.orelse:
      raise self.error(s, "while ... else", "set a flag before `break` and "
                       "test it after the loop")
    header = self.new_label("while")
    forever = isinstance(s.test, ast.Constant) and bool(s.test.value)
    # A test that the int and bool literals assigned just before the loop
    # make true (`i = 0; while i < 3:`, `done = False; while not done:`)
    # is known to pass the first time: the loop is entered without it, so
    # what the body assigns is assigned after the loop, as in Python.
    body = None
    if not forever and self.literal_value(
        s.test, self.pending_literals()) not in (None, 0):
      body = self.new_label("body")   # (0 == False)
    self.finish(ir1.Jump(body or header))
    self.start(header)
    self.loop(header, None if forever else self.condition(s.test), s.body,
              body=body)

  def pending_literals(self):
    """`{name: value}` of the variables that the straight-line statements
    just before this point (those not yet in a Primitive, all in the
    current block) last assigned a Python int or bool, such as
    `i = 0`."""
    known = {}
    for stmt in self.pending:
      if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and
          isinstance(stmt.targets[0], ast.Name)):
        value = self.literal_value(stmt.value, known)
        if value is not None:
          known[stmt.targets[0].id] = value
          continue
      targets = (stmt.targets if isinstance(stmt, ast.Assign)
                 else [stmt.target])
      for target in targets:
        for name in name_analysis.target_names(target):
          known.pop(name, None)
    return known

  def literal_value(self, node, known):
    """The Python int or bool `node` evaluates to when it is made only
    of such literals, names in `known` and names bound outside the
    function to Python ints (as for `static_range`), with arithmetic,
    comparisons and `and`/`or`/`not`; otherwise None."""
    names = {}
    for n in ast.walk(node):
      if not isinstance(n, _LITERAL_NODES):
        return None
      if isinstance(n, ast.Constant) and not _is_exact(n.value):
        return None
      if isinstance(n, ast.Name):
        value = known.get(n.id, self.resolve(n))
        if not _is_exact(value):
          return None
        names[n.id] = value
    expression = ast.fix_missing_locations(
        ast.Expression(copy.deepcopy(node)))
    try:
      value = eval(compile(expression, "<literal>", "eval"),  # pylint: disable=eval-used
                   {"__builtins__": {}}, names)
    except (ArithmeticError, ValueError):
      return None
    return value if _is_exact(value) else None

  def for_statement(self, s):
    if s.orelse:
      raise self.error(s, "for ... else", "set a flag before `break` and "
                       "test it after the loop")
    it = s.iter
    if not (isinstance(it, ast.Call) and not it.keywords and
            1 <= len(it.args) <= 3 and
            self.resolve(it.func) in (range, tf.range)):
      raise self.error(s, "a for loop over something other than range(...) "
                       "or tf.range(...)", "loop over range(n) and index, or "
                       "write a while loop")
    if not isinstance(s.target, ast.Name):
      raise self.error(s, "a for loop target that is not a plain name",
                       "loop over range(...) into one variable")
    static = self.static_range(it)
    trips = self.static_trips(static, s.body)
    if trips is not None:
      # Every member runs the same iterations: no loop blocks at all.
      for i in trips:
        self.assign(s.target.id, ast.Constant(i), s)
        # (A copy: lowering expressions rewrites their nodes in place.)
        self.statements(copy.deepcopy(s.body))
        if self.label is None:   # the body returned on every path
          return
      return
    counter, stop, step = (self.fresh("i"), self.fresh("stop"),
                           self.fresh("step"))
    bounds = [self.expression(a) for a in it.args]
    init = pyops.call("range_init", bounds)
    unpack = ast.Assign([ast.Tuple([ast.Name(n, ast.Store())
                                    for n in (counter, stop, step)],
                                   ast.Store())], init)
    self.pending.append(ast.copy_location(unpack, s))
    header, body = self.new_label("for"), self.new_label("body")
    # A range of Python ints that is not empty is entered without a test
    # (the first one is known to pass): the body runs at least once, so
    # what it assigns is assigned after the loop, as in Python.
    self.finish(ir1.Jump(body if static else header))
    self.start(header)
    test = pyops.call("range_continues", [ast.Name(n, ast.Load())
                                          for n in (counter, stop, step)])
    cond = self.fresh("cond")
    self.assign(cond, test, s)
    prologue = [
        ast.copy_location(ast.Assign([ast.Name(s.target.id, ast.Store())],
                                     ast.Name(counter, ast.Load())), s),
        ast.copy_location(ast.AugAssign(ast.Name(counter, ast.Store()),
                                        ast.Add(), ast.Name(step, ast.Load())),
                          s),
    ]
    self.loop(header, cond, s.body, prologue, body)

  def static_range(self, it):
    """`range(...)` of the Python ints its arguments are now, or None if
    one is not (a name bound outside the function counts, as for
    unrolling)."""
    bounds = []
    for arg in it.args:
      value = (arg.value if isinstance(arg, ast.Constant)
               else self.resolve(arg))
      if not isinstance(value, int) or isinstance(value, bool):
        return None
      bounds.append(value)
    return range(*bounds)

  def static_trips(self, trips, body):
    """`trips` (a `static_range`, or None) when unrolling the loop is safe
    and cheap, else None.

    Like AutoGraph's Python loops, a loop over a range of Python ints (a
    literal or a name bound outside the function) is unrolled, but only when
    the body can run straight through: no `break`/`continue`, no nested loop
    and no call of a batched function (members reaching different iterations
    of a call would no longer share its continuation blocks), and at most
    MAX_UNROLLED_ITERATIONS iterations.
    """
    if trips is None or len(trips) > MAX_UNROLLED_ITERATIONS:
      return None
    for stmt in body:
      for node in ast.walk(stmt):
        if isinstance(node, (ast.Break, ast.Continue, ast.While, ast.For)):
          return None
        if isinstance(node, ast.Call) and self.batched_kind(
            node.func)[0] == "call":
          return None
    return trips

  # --- expressions ------------------------------------------------------------

  def expression(self, node):
    """Hoists batched calls and control flow out of an expression."""
    return expression_lowering.ExpressionLowering(self).visit(node)
