"""A batched primitive's work on fixed matrices, moved before the VM's loop.

Under XLA every block of the VM, and every call of a `@batched_primitive`
in it, runs inside conditionals, out of which XLA does not move work that
depends on constants alone, as it does out of a plain loop (such as
`tfp.mcmc.NoUTurnSampler`'s leapfrog loop). A Gaussian with a fixed
covariance (`tfd.MultivariateNormalTriL`, Inference Gym's
`IllConditionedGaussian`) solves against its fixed Cholesky factor, which
XLA does by inverting the factor, a loop of its own, then multiplying: at
every call of the model, so that NUTS took 15 to 30 times TFP's time per
leapfrog on it.

So where XLA compiles the VM, a batched primitive's kernel is traced with
that work moved into the graph the VM's loop is built in (`moving_into`),
computed there once a call of the batched program, and read by the kernel
as a captured value:

* an operation of `MATRIX_OPS` (a factorisation, an inversion, a solve, a
  determinant) whose inputs depend on constants alone, with everything it
  depends on;
* the inverse of the matrix of a solve (triangular or general) whose
  matrix depends on constants alone and whose right-hand side does not,
  for matrices of at most `MAX_INVERTED` rows: the solve becomes a
  product with that inverse. For a triangular solve that is what XLA's
  own lowering computes at every call (it inverts the diagonal blocks of
  `MAX_INVERTED` rows, here the whole matrix, and multiplies); a general
  one it factorises (LU) first.

"Constants" are the kernel's constants and the values it captures from
outside the VM (a model's eager tensors, tensors of the caller's
function), never a variable's value or anything stateful. Where a tape
could record the trace, nothing moves (a gradient with respect to a
captured value must see the work where it is), nor for `pc:xla`'s
gradient, whose kernels are traced in place.
"""
import contextlib
import contextvars

import tensorflow as tf

from tfp_autobatch.runtime import _tf_private

# The largest matrix (rows) whose solves become products with its
# inverse: XLA's lowering of a triangular solve inverts diagonal blocks
# of this size, so up to it the inverse is the one XLA computes anyway;
# past it a solve keeps XLA's blocked substitution, which is more accurate
# for an ill-conditioned matrix than a product with its whole inverse.
MAX_INVERTED = 128

# The name scope of what moves (its copies in the graph before the loop).
_SCOPE = "fixed_matrix_work"

# The solves `solve(matrix, rhs, adjoint)` that become products with the
# matrix's inverse where the matrix is fixed and the rhs is not.
_SOLVES = ("MatrixTriangularSolve", "MatrixSolve")

_TARGET = contextvars.ContextVar("tfp_autobatch_constant_work_target",
                                 default=None)


@contextlib.contextmanager
def moving_into(graph):
  """Within it, batched primitives traced for XLA move their work on fixed
  matrices into `graph` (a function's graph, where the VM's loop is
  built)."""
  token = _TARGET.set(graph)
  try:
    yield
  finally:
    _TARGET.reset(token)


def target():
  """The graph work on fixed matrices moves into (`moving_into`), or None
  where nothing moves: outside the VM's loop, or where a tape could record
  the trace."""
  graph = _TARGET.get()
  if graph is None or _tf_private.record.could_possibly_record():
    return None
  return graph


def move(outs, into):
  """`outs` (tensors of the kernel graph being traced, the default graph),
  its work on fixed matrices moved into the graph `into` (see the module
  docstring): the operations that read that work read captured values of
  `into` instead, and so do `outs` where they are such work. What is left
  behind no longer reaches the kernel's outputs, and XLA removes it."""
  graph = tf.compat.v1.get_default_graph()
  if (into is None or graph is into
      or not isinstance(into, _tf_private.func_graph.FuncGraph)
      or not isinstance(graph, _tf_private.func_graph.FuncGraph)):
    return outs
  mover = _Mover(graph, into)
  replaced = mover.move([t for t in tf.nest.flatten(outs) if tf.is_tensor(t)])
  if not replaced:
    return outs
  return tf.nest.map_structure(
      lambda t: replaced.get(t.ref(), t) if tf.is_tensor(t) else t, outs)


class _Mover:
  """One kernel graph's work on fixed matrices, and its copy in `into`."""

  def __init__(self, graph, into):
    self.graph, self.into = graph, into
    self.external = _captured_values(graph)
    self.above = []      # `into` and the graphs it is nested in
    g = into
    while g is not None:
      self.above.append(g)
      g = getattr(g, "outer_graph", None)
    self.fixed = {}      # op -> depends on constants alone
    self.work = {}       # fixed op -> its result is (or reads) matrix work
    self.outer = {}      # tensor ref -> its value in `into`
    self.roots = {}      # capture placeholder ref -> its value above the loop
    self.order = {}      # op -> its place in creation order: inputs first
    for op in graph.get_operations():
      self.order[op] = len(self.order)
      fixed = self._fixed(op)
      self.fixed[op] = fixed
      if fixed:
        self.work[op] = op.type in _tf_private.MATRIX_OPS or any(
            self.work[t.op] for t in op.inputs)

  def _fixed(self, op):
    if op.type == "Placeholder":
      root = self._root(op.outputs[0])
      if root is None:
        return False
      self.roots[op.outputs[0].ref()] = root
      return True
    return (not op.control_inputs and not _tf_private.is_stateful(op)
            and not _tf_private.calls_functions(op)
            and all(self.fixed.get(t.op, False) for t in op.inputs))

  def _root(self, tensor):
    """A captured value's value outside the VM's loop: an eager tensor, or
    a tensor of `into` or of a graph it is nested in; None for a value
    made inside the loop, a variable or any other resource."""
    if tensor.dtype in (tf.resource, tf.variant):
      return None
    value = self.external.get(tensor.ref())
    while value is not None:
      if isinstance(value, _tf_private.ops.EagerTensor):
        return value
      graph = value.graph
      if any(graph is g for g in self.above):
        return value
      if not isinstance(graph, _tf_private.func_graph.FuncGraph):
        return None
      value = _captured_values(graph).get(value.ref())
    return None

  def move(self, outs):
    """{tensor ref: its replacement in the kernel graph}, for `outs` (the
    kernel's results) to swap in; the kernel graph's readers are
    rewired."""
    ops = list(self.order)
    read = [t for op in ops if not self.fixed[op] for t in op.inputs] + [
        t for t in outs if t.graph is self.graph]
    # Fixed matrix work that the rest of the kernel reads, or returns, once
    # each.
    moved = list({t.ref(): t for t in read
                  if self.fixed[t.op] and self.work[t.op]}.values())
    solves = [op for op in ops
              if op.type in _SOLVES and not self.fixed[op]
              and self.fixed[op.inputs[0].op] and _invertible(op.inputs[0])]
    if not moved and not solves:
      return {}
    replaced = {}
    with self.into.as_default(), self.into.control_dependencies(None):
      values = [self._copy(t) for t in moved]
      inverses = [self._inverse(op) for op in solves]
    with self.graph.as_default():
      for t, value in zip(moved, values):
        replaced[t.ref()] = self.graph.capture(value)
        _tf_private.reroute(t, replaced[t.ref()])
      for op, inverse in zip(solves, inverses):
        product = tf.linalg.matmul(self.graph.capture(inverse), op.inputs[1],
                                   adjoint_a=op.get_attr("adjoint"))
        if not product.shape.is_compatible_with(op.outputs[0].shape):
          continue
        product = tf.ensure_shape(product, op.outputs[0].shape)
        _tf_private.reroute(op.outputs[0], product)
        replaced[op.outputs[0].ref()] = product
    return replaced

  def _copy(self, tensor):
    """`tensor`'s value in `into`, its fixed operations copied there."""
    if tensor.ref() in self.outer:
      return self.outer[tensor.ref()]
    pending, cone = [tensor.op], []
    seen = set()
    while pending:
      op = pending.pop()
      if op in seen or op.outputs and op.outputs[0].ref() in self.outer:
        continue
      seen.add(op)
      cone.append(op)
      pending.extend(t.op for t in op.inputs)
    for op in sorted(cone, key=self.order.get):
      if op.type == "Placeholder":
        self.outer[op.outputs[0].ref()] = self.into.capture(
            self.roots[op.outputs[0].ref()])
        continue
      copy = self.into.create_op(
          op.type, [self.outer[t.ref()] for t in op.inputs],
          [t.dtype for t in op.outputs],
          attrs={k: v for k, v in op.node_def.attr.items()
                 if not k.startswith("_")},
          name=f"{_SCOPE}/{op.name.split('/')[-1]}")
      for t, c in zip(op.outputs, copy.outputs):
        self.outer[t.ref()] = c
    return self.outer[tensor.ref()]

  def _inverse(self, solve):
    """The inverse of `solve`'s (fixed) matrix, in `into`."""
    matrix = self._copy(solve.inputs[0])
    with tf.name_scope(_SCOPE):
      if solve.type == "MatrixSolve":
        return tf.linalg.inv(matrix)
      identity = tf.eye(matrix.shape[-1],
                        batch_shape=matrix.shape[:-2].as_list(),
                        dtype=matrix.dtype)
      return tf.linalg.triangular_solve(matrix, identity,
                                        lower=solve.get_attr("lower"))


def _captured_values(graph):
  """{a capture's placeholder in `graph` (its ref): the value captured}."""
  return {internal.ref(): external for external, internal in graph.captures}


def _invertible(matrix):
  """Whether a fixed solve's matrix is inverted instead: its shape known,
  at most `MAX_INVERTED` rows."""
  return (matrix.shape.is_fully_defined()
          and matrix.shape[-1] <= MAX_INVERTED)
