"""The public API: `@batch`, `@batched_primitive` and batched functions."""
import contextvars
import functools
import inspect
import numbers
import sys

import numpy as np
import tensorflow as tf

from tfp_autobatch import backends
from tfp_autobatch import config
from tfp_autobatch import errors
from tfp_autobatch import pipeline
from tfp_autobatch.frontend import batched_callees
from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.operators import single_example
from tfp_autobatch.runtime import batch_state
from tfp_autobatch.runtime import reference
from tfp_autobatch.runtime import stats as stats_lib

DEFAULT_MAX_STACK_DEPTH = 64

# True while `run_unbatched` runs plain Python: nested batched calls then run
# their Python function directly too.
_UNBATCHED = contextvars.ContextVar("tfp_autobatch_unbatched", default=False)


class BatchedFunction(batched_callees.BatchedFunctionBase):
  """A function written for one example, callable on a batch.

  Call it with batches (tensors, arrays, or tuples, namedtuples or dicts of
  them, whose leading dimension is the batch); it returns what calling the
  Python function on each example and stacking the results would.

  Attributes:
    max_stack_depth: the recursion bound of a call (see `tab.batch`).
    backend: the backend given to `tab.batch`, or None for the default.
    last_stats: the `tab.RunStats` of this thread's last eager call (None
      after a call traced inside `tf.function`, or one that raised).
    last_stats_tensors: the same counts as tensors of this thread's last
      call, also a traced one (the pc backends; None on the local ones).
  """
  last_stats = stats_lib.PerThread()
  last_stats_tensors = stats_lib.PerThread()

  def __init__(self, python_function, max_stack_depth=DEFAULT_MAX_STACK_DEPTH,
               backend=None):
    if not inspect.isfunction(inspect.unwrap(python_function)):
      raise TypeError(
          "@tab.batch needs a Python function defined with `def` (its "
          f"source is what gets batched), got {python_function!r}; instead "
          "of a functools.partial or a callable object, batch a `def` that "
          "does the work, with the shared values captured by closure")
    if backend is not None:
      backends.check_name(backend)
    # An int, not anything int() takes: 2.5 was silently a bound of 2.
    if (not isinstance(max_stack_depth, numbers.Integral)
        or isinstance(max_stack_depth, bool)):
      raise TypeError("max_stack_depth must be an int (the deepest "
                      f"recursion a call may reach), got {max_stack_depth!r}")
    if max_stack_depth < 1:
      raise ValueError(f"max_stack_depth must be >= 1, got {max_stack_depth}")
    self.python_function = python_function
    self.max_stack_depth = int(max_stack_depth)
    self.backend = backend
    self._last_types = None
    self._last_backend = None   # the last call's, for `ir()`
    self._last_dense = None   # see `_prepare`
    functools.update_wrapper(self, python_function)
    # The call's signature: the function's batch parameters and `backend`
    # (what `tf.function(functools.partial(f, backend=...))` binds).
    # (Not for a parameter named `backend` or a `**kwargs`, which a
    # keyword-only `backend` cannot join; the frontend rejects the second.)
    signature = inspect.signature(python_function)
    params = list(signature.parameters.values())
    if "backend" not in signature.parameters and not any(
        p.kind == p.VAR_KEYWORD for p in params):
      self.__signature__ = signature.replace(parameters=params + [
          inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY,
                            default=None)])

  def __repr__(self):
    return f"<tab.batch {self.python_function.__qualname__}>"

  def __reduce_ex__(self, protocol):
    """Pickled by reference, as a function is: a batched function reached
    by its module and qualified name unpickles as the one found there
    (its Python function, which that name now holds, cannot pickle by
    name), and copies as itself. Any other (one made in a function) is
    copied and pickled by its state, which fails as pickling a nested
    function does."""
    found = sys.modules.get(getattr(self, "__module__", None))
    for name in getattr(self, "__qualname__", "").split("."):
      found = getattr(found, name, None)
    if found is self:
      return self.__qualname__
    return super().__reduce_ex__(protocol)

  def __getstate__(self):
    """For pickling and copying by state: without what was compiled and
    the per-thread statistics (made again when called)."""
    return {k: v for k, v in self.__dict__.items()
            if k not in (pipeline.CACHE_ATTRIBUTE,
                         stats_lib.PerThread.ATTRIBUTE)}

  def __get__(self, instance, owner=None):
    """Looked up on an instance, a batched function is a method, which
    cannot be batched (its `self` would be one more batch argument)."""
    if instance is None:
      return self
    def method_called(*args, **kwargs):
      del args, kwargs
      raise TypeError(
          f"{self!r} is a method: @tab.batch batches plain functions, "
          "whose every argument is a batch. Define it outside the class, "
          "and pass what it needs from `self` as batch arguments or "
          "capture it by closure (e.g. a function built in __init__)")
    return method_called

  @functools.cached_property
  def param_names(self):
    """The names of the Python function's parameters: one batch each."""
    return tuple(inspect.signature(self.python_function).parameters)

  @tf.autograph.experimental.do_not_convert
  def __call__(self, *args, backend=None, **batches):
    """Runs the function on a batch: one argument per parameter, each a
    batch, by position or by the parameter's name (as a Python call
    binds them; a parameter named `backend` only by position); `backend`
    (a name in `tab.BACKENDS`) overrides the function's and the scope's
    default for this call."""
    if batches:
      args = self._in_parameter_order(args, batches)
    if _UNBATCHED.get():
      return self.python_function(*args)
    if single_example.inside_vectorized_code.get():
      raise errors.ConversionError(
          f"batched function {self.python_function.__name__} was called "
          "from single-example code (a plain helper function or lambda "
          "called by a @tab.batch function); call it directly in the body "
          "of a @tab.batch function, or decorate the helper with @tab.batch "
          "too")
    name = backends.check_name(backend or self.backend
                               or config.current_default_backend())
    args, arg_types, batch_size = _prepare(self, args)
    if name in backends.COMPILED_BY_XLA and any(
        x.dtype == tf.string for x in tf.nest.flatten(args)):
      raise TypeError(
          f"backend {name!r} compiles with XLA, which has no strings, and an "
          f"argument of {self!r} holds strings; use 'pc:graph' (outside a "
          "tf.function compiled with jit_compile) or 'local:eager' for it")
    if name in backends.EAGER_ONLY and not tf.executing_eagerly():
      raise errors.AutobatchError(
          f"backend {name!r} runs its control flow eagerly in Python and "
          "cannot run inside tf.function; use 'pc:graph' or 'pc:xla' there")
    runtime = pipeline.runtime(self, arg_types, name)
    self._last_types, self._last_backend = arg_types, name
    self.last_stats = self.last_stats_tensors = None   # if the run raises
    result = runtime.run(args, batch_size)
    self.last_stats = runtime.stats
    self.last_stats_tensors = getattr(runtime, "stats_tensors", None)
    return result

  def _in_parameter_order(self, args, batches):
    """The positional `args` and the keyword `batches` as one tuple in
    parameter order, with Python's errors for names that do not bind."""
    params = self.param_names
    unknown = sorted(set(batches) - set(params))
    if unknown:
      raise TypeError(
          f"{self!r} got an unexpected keyword argument {unknown[0]!r}; its "
          f"batch arguments are ({', '.join(params)})")
    twice = sorted(set(params[:len(args)]) & set(batches))
    if twice:
      raise TypeError(f"{self!r} got multiple values for argument "
                      f"{twice[0]!r}")
    missing = [p for p in params[len(args):] if p not in batches]
    if missing:
      raise TypeError(f"{self!r} is missing the batch argument "
                      f"{missing[0]!r}")
    return tuple(args) + tuple(batches[p] for p in params[len(args):])

  def ir(self, level=1, backend=None):
    """The program as IR-1 (typed for the last call's inputs, if any), or
    with `level=2` as IR-2 (typed, so only after a call), as `backend`
    runs it: by default the last call's backend. (`pc:xla` alone makes
    small floating-point `if`s selects: `pipeline.selects_floats`.)"""
    if backend is not None:
      backends.check_name(backend)
    else:
      backend = self._last_backend
    if level == 2:
      if self._last_types is None:
        raise ValueError("IR-2 is typed by the inputs: call the function "
                         "once before asking for ir(level=2)")
      return pipeline.stack_program(self, self._last_types, backend)
    if level != 1:
      raise ValueError(f"IR level {level} is not available; levels: 1, 2")
    if self._last_types is not None:
      return pipeline.typed_program(self, self._last_types, backend)
    return pipeline.convert_program(self)

  def batched_primitive_calls(self, backend=None):
    """`{"function/label": n}` for the blocks of `ir(level=1, backend)`
    that call batched primitives, `n` calls each. The local backends'
    `RunStats` name blocks the same way, so a caller can count the rows
    its batched primitives computed from the block counts."""
    program = self.ir(level=1, backend=backend)
    calls = {f"{f.name}/{b.label}":
             sum(isinstance(op, ir1.Primitive) and op.batched
                 for op in b.ops)
             for f in program.functions for b in f.blocks}
    return {label: n for label, n in calls.items() if n}

  def reference(self, *args):
    """Runs the reference interpreter on each example; stacks the results."""
    args, arg_types, batch_size = _prepare(self, args)
    program = pipeline.typed_program(self, arg_types)
    results = []
    for i in range(batch_size):
      example = [tf.nest.map_structure(lambda x: x[i], a) for a in args]  # pylint: disable=cell-var-from-loop
      results.append(reference.run_example(program, example,
                                           self.max_stack_depth))
    result_type = program.var_type(program.entry.name, program.entry.result)
    if not results:
      return types_lib.zeros(result_type, 0)
    return tf.nest.map_structure(lambda *xs: tf.stack(xs), *results)

  def run_unbatched(self, *args):
    """Runs the plain Python function on ONE example, eagerly."""
    token = _UNBATCHED.set(True)
    try:
      return self.python_function(*args)
    finally:
      _UNBATCHED.reset(token)


def _prepare(fn, args):
  """Converts arguments to tensors; returns (args, per-example types, size).

  Arguments that are all arrays or eager tensors of the dtypes and shapes
  of the last such call skip the checks and typing: the same loop calling
  a small batch paid about a tenth of each call to repeat them."""
  key = _dense_key(args)
  if key is not None:
    last = fn._last_dense   # pylint: disable=protected-access
    if last is not None and last[0] == key:
      return [tf.convert_to_tensor(a) for a in args], last[1], last[2]
  converted, arg_types, size = _checked_and_typed(fn, args)
  if key is not None:
    fn._last_dense = (key, arg_types, size)   # pylint: disable=protected-access
  return converted, arg_types, size


def _dense_key(args):
  """The arguments' kinds, dtypes and shapes if each is a NumPy array or
  an eager tensor (a shape known in full), else None."""
  if not tf.executing_eagerly():
    return None
  key = []
  for a in args:
    if type(a) is np.ndarray:   # pylint: disable=unidiomatic-typecheck
      key.append((np.ndarray, a.dtype, a.shape))
    elif isinstance(a, tf.Tensor):
      key.append((tf.Tensor, a.dtype, tuple(a.shape)))
    else:
      return None
  return tuple(key)


def _checked_and_typed(fn, args):
  """`_prepare`'s checks, conversion and typing, done in full."""
  params = fn.param_names
  if not params:
    raise TypeError(f"{fn!r} needs at least one batch argument: the batch "
                    "size is the arguments' leading dimension")
  if len(args) != len(params):
    # A signature the frontend rejects (default arguments, *args) is a
    # clearer error than the count.
    pipeline.convert_program(fn)
    raise TypeError(
        f"{fn!r} takes {len(params)} batch argument"
        f"{'s' if len(params) != 1 else ''} ({', '.join(params)}), "
        f"got {len(args)}")
  converted = []
  for i, a in enumerate(args):
    if isinstance(a, (bool, int, float)):
      raise TypeError(
          f"argument {i} of {fn!r} is the Python scalar {a!r}; every positional "
          "argument is a batch with a leading batch dimension. Capture values "
          "shared by all examples in a closure instead.")
    if isinstance(a, list):
      raise TypeError(
          f"argument {i} of {fn!r} is a Python list, which would be read as "
          "a structure of separate batches; pass the batch as an array or "
          "tensor (np.array([...])), or a tuple of batches")
    numbers = [x for x in tf.nest.flatten(a)
               if isinstance(x, (bool, int, float))]
    if numbers:
      raise TypeError(
          f"argument {i} of {fn!r} holds the scalar {numbers[0]!r} "
          "inside a structure (a list, or a number in a tuple or dict), "
          "where every leaf must be a batch; pass each batch as an array or "
          "tensor (np.array([...]))")
    composite = [x for x in tf.nest.flatten(a) if isinstance(
        x, (tf.RaggedTensor, tf.SparseTensor))]
    if composite:
      raise TypeError(
          f"argument {i} of {fn!r} holds a {type(composite[0]).__name__}; "
          "batches must be dense tensors or arrays: pad the examples to one "
          "shape (e.g. RaggedTensor.to_tensor()) and pass their lengths as "
          "another argument")
    converted.append(tf.nest.map_structure(tf.convert_to_tensor, a))
  ranks = {x.shape.rank for x in tf.nest.flatten(converted)}
  if None in ranks:
    raise ValueError(f"every argument leaf of {fn!r} needs a known rank (a "
                     "leading batch dimension, then the per-example shape); "
                     "got a tensor of unknown rank: give your tf.function's "
                     "input_signature a shape such as [None] or [None, 3]")
  if 0 in ranks:
    raise ValueError(f"every argument leaf of {fn!r} needs a leading batch "
                     "dimension; got a scalar tensor")
  converted, size = _same_batch_size(fn, converted)
  arg_types = [types_lib.type_of_value(a, batched=True) for a in converted]
  return converted, arg_types, size


def _same_batch_size(fn, args):
  """`(args, batch size)`: every leaf's leading dimension must be the same.

  Sizes known at trace time are checked now. A leaf whose size is unknown
  (a `tf.function` input_signature of [None, ...]) is checked when the
  graph runs: against the known size with `tf.ensure_shape`, or against
  the first leaf's by `batch_state.with_rows`, whose assertions every
  leaf, the first included, waits for (so the VM cannot start before
  them), and whose reshape fails where XLA drops them (`jit_compile=True`).
  Either way a mismatch is an error, never an answer. The size is None if
  no leaf knows it."""
  leaves = tf.nest.flatten(args)
  known = {x.shape[0] for x in leaves} - {None}
  if len(known) > 1:
    raise ValueError(f"arguments of {fn!r} have different batch sizes "
                     f"{sorted(known)}")
  if all(x.shape[0] is not None for x in leaves):
    return args, int(known.pop())
  if known:
    size = int(known.pop())
    def checked(x):
      return tf.ensure_shape(x, [size] + x.shape[1:]) if (
          x.shape[0] is None) else x
    return tf.nest.map_structure(checked, args), size
  message = (f"arguments of {fn!r} have different batch sizes (their "
             "leading dimensions)")
  return batch_state.with_rows(args, tf.shape(leaves[0])[0], message), None


class BatchedPrimitive(batched_callees.BatchedPrimitiveBase):
  """A function that already maps over the leading (batch) dimension.

  Called from a batched function, it runs once on the batch of active
  members instead of being vectorised again. Call it directly in the body of
  the `@tab.batch` function (not from inside a helper). See
  `tab.batched_primitive` for `output_signature` and `fine_buckets`.
  """

  def __init__(self, fn, output_signature=None, fine_buckets=False):
    if not isinstance(fine_buckets, bool):
      raise TypeError(
          f"batched_primitive's fine_buckets must be True or False, not "
          f"{fine_buckets!r}")
    self.fn = fn
    functools.update_wrapper(self, fn)
    self.output_signature = output_signature
    self.fine_buckets = fine_buckets

  def __call__(self, *args):
    if _UNBATCHED.get():   # one example: give it (and take away) a batch dim
      batched = [tf.nest.map_structure(lambda x: tf.expand_dims(x, 0), a)
                 for a in args]
      return tf.nest.map_structure(lambda x: x[0], self.fn(*batched))
    if single_example.inside_vectorized_code.get():
      raise errors.ConversionError(
          f"batched primitive {self.fn.__name__} was called from single-"
          "example code (a helper function or lambda); call it directly in "
          "the body of the @tab.batch function, as `y = "
          f"{self.fn.__name__}(x)`.")
    return self.fn(*args)


def batch(fn=None, *, max_stack_depth=DEFAULT_MAX_STACK_DEPTH, backend=None):
  """Makes a function written for one example callable on a batch.

  Use as `@tab.batch` or `@tab.batch(max_stack_depth=..., backend=...)`.

  Args:
    fn: the Python function (given when used without parentheses).
    max_stack_depth: the deepest recursion a call may reach, the batched
      functions it calls included (default 64). Exceeding it raises
      `tab.StackOverflowError` (README, "Recursion depth"); the pc
      backends carry this many rows per stacked variable, so a bound far
      above what you need costs memory and time.
    backend: the backend for this function's calls (a name in
      `tab.BACKENDS`); None uses `tab.default_backend`'s, "pc:xla" unless
      set. A call's own `backend=` overrides both.

  Returns:
    A `BatchedFunction`.
  """
  if fn is None:
    return lambda f: BatchedFunction(f, max_stack_depth, backend)
  return BatchedFunction(fn, max_stack_depth, backend)


def batched_primitive(fn=None, *, output_signature=None, fine_buckets=False):
  """Decorator marking a function that maps over the batch dimension itself.

  Use as `@tab.batched_primitive` or
  `@tab.batched_primitive(output_signature=..., fine_buckets=...)`.

  Args:
    fn: the function (given when used without parentheses).
    output_signature: what it returns, as its nest of `tf.TensorSpec`s
      whose leading (batch) dimension is None; or a function that takes
      the `tf.TensorSpec`s of its arguments (leading dimension None) and
      returns them, or None where it cannot tell. None (the default):
      type inference traces the function to find out, on a batch of any
      size, before the runtime traces it again for the run; given, that
      first trace is skipped, which for an expensive function (a model's
      log density and gradient) is a large part of a first call. Each
      run checks what it returns against the signature, and a function
      that fails is reported as type inference would have
      (`tab.TypeInferenceError`).
    fine_buckets: under `pc:xla`, outside a gradient, run it on its
      members gathered into the smallest of Z, 3Z/4, Z/2, 3Z/8, ... rows
      that holds them (Z the batch), instead of Z, Z/2, Z/4, ...: at most
      a third of the rows it computes are padding instead of up to half,
      for about twice as many sizes traced and compiled. Worth it for a
      function costly per row that a program calls in few places (a
      TreeLSTM's cells); not for a `tfp.mcmc` target, where the extra
      compilation costs more than the rows save. Default False.

  Returns:
    A `BatchedPrimitive`.
  """
  if fn is None:
    return lambda f: BatchedPrimitive(f, output_signature, fine_buckets)
  return BatchedPrimitive(fn, output_signature, fine_buckets)


