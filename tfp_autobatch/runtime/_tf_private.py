"""TensorFlow's private modules and methods the runtime uses, imported in
this one place (its XLA operations are in `_xla`), so that a TensorFlow
upgrade breaks here; setup.py pins TensorFlow 2.21.

- `record`: the eager tapes (`could_possibly_record`, `stop_recording`,
  `record_operation`, `VariableWatcher`), for the VM that XLA compiles,
  which no gradient goes through (`no_gradient`, `pc_vm`).
- `ops`, `resource_variable_ops`: the gradient registry and variable
  accesses reported to the tapes (`no_gradient`).
- `in_xla_context`: whether the graph being built is compiled by XLA
  (TensorFlow's `control_flow_util`).
- `pfor`, `pfor_impl`: pfor's converters and entry point (`vectorize`,
  `pfor_conditions`); None where this TensorFlow lacks them.
- `call_concrete`: a traced function called at its flat inputs.
- `traced_without_tapes`: a `tf.function` traced apart from the eager
  tapes recording in this thread (tapes are per thread).
- `has_xla_kernel`, `called_graphs`: the kernel registry and the
  functions an operation calls, to find operations XLA has no kernel for (`xla_kernels`).
- `eager_captures_as_constants`: a function graph's capture of eager
  tensors, replaced while a model is traced (`vectorize`).
- `float_ops`: TensorFlow's estimate of a graph's floating-point
  operations (its profiler's registry), to tell a cheap model from a
  costly one (`batched_primitive_calls`).
- `matrix_work_on_constants`: a graph's matrix factorisations and solves
  of matrices that do not depend on its arguments
  (`batched_primitive_calls`).
- `func_graph`, `is_stateful`, `calls_functions`, `reroute`: a function's
  graph, read and rewired while it is traced, to move its work on fixed
  matrices out of the VM's loop (`constant_work`).
"""
import concurrent.futures
import contextlib
import contextvars

import tensorflow as tf
from tensorflow.python.eager import record  # pylint: disable=g-direct-tensorflow-import,unused-import
from tensorflow.python.framework import func_graph  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import kernels  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import ops  # pylint: disable=g-direct-tensorflow-import,unused-import
from tensorflow.python.ops import control_flow_util  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import,unused-import
# Registers the floating-point operations of more op types (elementwise
# arithmetic, reductions, matrix products) than TensorFlow's math ops do.
from tensorflow.python.profiler.internal import flops_registry  # pylint: disable=g-direct-tensorflow-import,unused-import
from tensorflow.python.util import deprecation  # pylint: disable=g-direct-tensorflow-import

try:   # tf.vectorized_map's machinery
  from tensorflow.python.ops.parallel_for import pfor  # pylint: disable=g-direct-tensorflow-import
  from tensorflow.python.ops.parallel_for.control_flow_ops import (  # pylint: disable=g-direct-tensorflow-import
      _pfor_impl as pfor_impl)
except ImportError:  # pragma: no cover (TF 2.21 has them)
  pfor = pfor_impl = None


def in_xla_context():
  """Whether the graph being built will be compiled by XLA: traced for
  `pc:xla`, or inside a user's `tf.function(jit_compile=True)`."""
  return control_flow_util.GraphOrParentsInXlaContext(
      tf.compat.v1.get_default_graph())


def call_concrete(concrete, args):
  """`concrete(*args)` without the binding: `args` must be laid out as
  the signature `concrete` was traced for (a list of nested structures
  of tensors of its dtypes and shapes).

  A concrete function's own call binds its arguments to its structured
  signature (a Python `inspect`-style binding, then a flattening and a
  check of every argument against its spec) before it runs the function,
  which was about half of a small program's call on few members. The
  runtimes call their
  traces with arguments whose structure, dtypes and static shapes already
  chose the trace, so this passes them flattened straight to the
  function, through `ConcreteFunction._call_flat`, which still records
  the call on a tape that watches its inputs and, in a graph, checks
  their shapes."""
  return concrete._call_flat(   # pylint: disable=protected-access
      tf.nest.flatten(args), concrete.captured_inputs)


def traced_without_tapes(function, *args):
  """`function.get_concrete_function(*args)`, traced in a thread of its
  own.

  Traced while an eager tape records, an XLA-compiled VM's inner function
  calls would be recorded by that tape, which would build their backward
  functions and fail (the VM's in-place writes have none). Tapes are per
  thread, and `record.stop_recording` would stop the tapes of the traced
  code too (a batched primitive's own gradient). The thread runs in a copy
  of this one's context variables (the default backend)."""
  context = contextvars.copy_context()
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    return pool.submit(context.run, function.get_concrete_function,
                       *args).result()


def has_xla_kernel(op_type):
  """Whether an operation type has a kernel for an XLA device (registered
  for `XLA_CPU_JIT`, `XLA_GPU_JIT`, ...): what XLA compiles it with."""
  return any(k.device_type.startswith("XLA_")
             and k.device_type.endswith("_JIT")
             for k in kernels.get_registered_kernels_for_op(op_type).kernel)


def called_graphs(op, library):
  """The graphs of the functions `op` calls (a call's function, a loop's
  condition and body, a conditional's branches), traced ones only (a
  function loaded from a definition has none), found in the graph
  `library`, which holds them (a traced function's graph holds every
  function called within it, at any depth). A graph also holds functions
  it never calls, which XLA never compiles."""
  functions = (library._functions.get(n) for n in _called_names(op))  # pylint: disable=protected-access
  return [f.graph for f in functions
          if f is not None and getattr(f, "graph", None) is not None]


def _called_names(op):
  """The names of the functions `op` calls, from its function-valued
  attributes."""
  names = []
  for value in op.node_def.attr.values():
    if value.HasField("func"):
      names.append(value.func.name)
    names.extend(f.name for f in value.list.func)
  return names


def is_stateful(op):
  """Whether `op` has state or effects (a variable's read, a random draw):
  not a function of its inputs alone."""
  return op._is_stateful   # pylint: disable=protected-access


def calls_functions(op):
  """Whether `op` runs functions (a call, a loop, a conditional)."""
  return bool(_called_names(op))


def reroute(tensor, replacement):
  """Every operation that reads `tensor` (of a graph being built) reads
  `replacement` instead."""
  graph = tensor.graph
  with graph._mutation_lock():   # pylint: disable=protected-access
    for consumer in tensor.consumers():
      for i, t in enumerate(consumer.inputs):
        if t is tensor:
          consumer._update_input(i, replacement)   # pylint: disable=protected-access


# Operations that run a function an unknown number of times.
_LOOPS = ("While", "StatelessWhile")
# Operations that compute nothing (`float_ops`).
_FREE = ("Placeholder", "Const", "Identity", "IdentityN", "NoOp",
         "ReadVariableOp", "Reshape", "Shape", "StopGradient")


def float_ops(graph, library=None):
  """An estimate of the floating-point operations one run of `graph`
  computes, or None where it cannot tell (a loop, whose trip count it does
  not know).

  Operations TensorFlow's profiler has a count for (arithmetic,
  reductions, matrix products) count as it counts them; any other that
  computes something counts one per element of its outputs of known
  shape; a call counts its
  function's operations, a conditional its costliest branch; an operation
  whose result no output reads counts nothing. `library`:
  the graph that holds the functions called (`called_graphs`), `graph`
  itself at the top."""
  library = graph if library is None else library
  total = 0
  live = _live_ops(graph)
  for op in graph.get_operations():
    if op not in live:
      continue   # computes nothing the outputs read (`constant_work`)
    if op.type in _LOOPS:
      return None
    if op.type in _FREE:
      continue
    inner = [float_ops(g, library) for g in called_graphs(op, library)]
    if None in inner:
      return None
    if inner:
      total += max(inner)
      continue
    try:
      # (The registry reads shapes through a function TensorFlow marks
      # deprecated, which would print a warning on the user's console.)
      with deprecation.silence():
        stats = ops.get_stats_for_node_def(graph, op.node_def, "flops")
    except ValueError:   # an input's shape is not known
      stats = None
    if stats is not None and stats.value is not None:
      total += stats.value
    else:
      total += sum(t.shape.num_elements() or 0 for t in op.outputs
                   if t.shape.is_fully_defined())
  return total


# The most elements a captured eager tensor may have to be made a constant
# of the graph that reads it (`eager_captures_as_constants`).
CONSTANT_CAPTURE_MAX_ELEMENTS = 4096


@contextlib.contextmanager
def eager_captures_as_constants(max_elements=CONSTANT_CAPTURE_MAX_ELEMENTS):
  """Within it, an eager tensor of at most `max_elements` numbers that
  the default graph (a function's) reads becomes a constant of that
  graph, where TensorFlow passes it in as an argument. An eager tensor's
  value never changes, and TensorFlow captures it by value, so the
  function computes what it did.

  A model's parameters (a `tfd.Normal`'s scale, the data of a small
  model) are such tensors. Passed in, they reach XLA as parameters of the
  VM's computation, and what the model computes from them alone (the
  logarithm of a scale, a reciprocal) is computed again at every VM step
  that calls it: XLA moves such values out of a loop, but not out of the
  conditional that runs one block. As constants, XLA computes them once,
  when it compiles. Larger tensors (a regression's data) stay arguments:
  a constant is copied into every computation that holds it."""
  graph = tf.compat.v1.get_default_graph()
  if not isinstance(graph, func_graph.FuncGraph):
    yield   # a TF1 graph captures nothing
    return
  capture = graph.capture
  # An enclosing use's replacement, restored after this one.
  replaced = (None if getattr(capture, "__func__", None)
              is func_graph.FuncGraph.capture else capture)
  constants = {}

  def capture_as_constant(tensor, name=None, shape=None):
    if (isinstance(tensor, ops.EagerTensor)
        and (tensor.dtype.is_floating or tensor.dtype.is_integer
             or tensor.dtype.is_bool)
        and tensor.shape.num_elements() <= max_elements):
      key = id(tensor)
      if key not in constants:
        # Outside any control dependencies of the code being traced; the
        # tensor is kept so that its id is not reused.
        with graph.control_dependencies(None):
          constants[key] = (tensor, tf.constant(tensor.numpy(),
                                                tensor.dtype))
      return constants[key][1]
    return capture(tensor, name=name, shape=shape)

  graph.capture = capture_as_constant
  try:
    yield
  finally:
    if replaced is None:
      del graph.capture
    else:
      graph.capture = replaced


# Matrix operations whose XLA lowering loops over their first operand (a
# factorisation, an inversion of triangular blocks): work that depends on
# that operand alone (`matrix_work_on_constants`).
MATRIX_OPS = ("Cholesky", "MatrixTriangularSolve", "MatrixSolve",
              "MatrixInverse", "MatrixDeterminant", "LogMatrixDeterminant",
              "SelfAdjointEigV2", "Svd", "Qr", "Lu")
# Function calls, whose outputs may depend on any of their inputs.
_CALLS = ("PartitionedCall", "StatefulPartitionedCall")
# The file paths of libraries, skipped when naming where an operation was
# made: TensorFlow, TensorFlow Probability and this package.
_LIBRARY_PATHS = ("/tensorflow/", "/tensorflow_probability/",
                  "/tfp_autobatch/", "/nuts/", "/keras/", "/tf_keras/")


def matrix_work_on_constants(graph, library=None, dependent=None):
  """`[(op type, "file:line")]` of the `MATRIX_OPS` in `graph` (and in the
  functions it calls) whose matrix (first input) does not depend on the
  graph's arguments: the same factorisation or solve at every call.
  "file:line" is the innermost frame of the op's creation outside
  TensorFlow, TFP and this package (the model's own line), or "". A
  captured value (a model's fixed scale, a variable) does not depend on
  the arguments. `dependent`: for a called graph, its inputs that depend
  on the caller's arguments (default: every argument of `graph`)."""
  library = graph if library is None else library
  if dependent is None:
    captured = {t.ref() for t in graph.internal_captures}
    dependent = {t.ref() for t in graph.inputs if t.ref() not in captured}
  depends = {}   # op -> whether one of its inputs depends on them
  entered = set()

  def depends_on_arguments(tensor):
    # Iteratively, inputs first: a model's graph can be deeper than
    # Python's recursion limit (an unrolled time series). An input met
    # again before it is done (a cycle, which a function's graph has not)
    # counts as not depending.
    if tensor.ref() in dependent:
      return True
    pending = [tensor.op]
    while pending:
      op = pending[-1]
      if op in depends:
        pending.pop()
        continue
      if op not in entered:
        entered.add(op)
        waiting = [t.op for t in op.inputs if t.ref() not in dependent
                   and t.op not in depends and t.op not in entered]
        if waiting:
          pending.extend(waiting)
          continue
      pending.pop()
      depends[op] = any(t.ref() in dependent or depends.get(t.op, False)
                        for t in op.inputs)
    return depends[tensor.op]

  found = []
  live = _live_ops(graph)
  for op in graph.get_operations():
    if op not in live:
      continue   # left behind when the work moved (`constant_work`)
    if op.type in MATRIX_OPS and op.inputs and not depends_on_arguments(
        op.inputs[0]):
      found.append((op.type, _made_at(op)))
    elif op.type in _CALLS:
      for called in called_graphs(op, library):
        inner = {t.ref() for t, outer in zip(called.inputs, op.inputs)
                 if depends_on_arguments(outer)}
        found += matrix_work_on_constants(called, library, inner)
  return found


def _live_ops(graph):
  """The operations of a function's graph that its outputs (or its
  effects) depend on; every operation of another graph."""
  if not isinstance(graph, func_graph.FuncGraph):
    return set(graph.get_operations())
  pending = [t.op for t in graph.outputs] + list(graph.control_outputs)
  live = set()
  while pending:
    op = pending.pop()
    if op not in live:
      live.add(op)
      pending.extend(t.op for t in op.inputs)
      pending.extend(op.control_inputs)
  return live


def _made_at(op):
  """"file:line" of the innermost frame of `op`'s creation outside the
  libraries (`_LIBRARY_PATHS`), or "" if none."""
  for frame in reversed(op.traceback):
    if not any(path in frame.filename for path in _LIBRARY_PATHS):
      return f"{frame.filename}:{frame.lineno}"
  return ""
