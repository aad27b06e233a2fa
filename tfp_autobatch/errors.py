"""The errors tfp_autobatch raises, each saying what to do about it."""


class AutobatchError(Exception):
  """Base class of every error raised by tfp_autobatch."""


class ConversionError(AutobatchError):
  """The Python source of a batched function uses a construct we cannot batch.

  The message names the function, file, line and construct, and says what to
  write instead.
  """

  def __init__(self, message, *, function=None, filename=None, lineno=None,
               construct=None):
    self.function = function
    self.filename = filename
    self.lineno = lineno
    self.construct = construct
    where = ""
    if function is not None:
      where = f"in function '{function}'"
      if filename is not None:
        where += f" ({filename}, line {lineno})"
      where += ": "
    super().__init__(where + message)


class TypeInferenceError(AutobatchError):
  """A variable gets different dtypes or shapes on different paths, or the
  code fails when traced. `failure`: then, the exception the code raised
  (also the error's `__cause__`, which a `tf.function` the error passes
  through drops)."""

  failure = None


class StackOverflowError(AutobatchError):
  """Recursion went deeper than the function's `max_stack_depth`."""


class IndexOutOfRangeError(AutobatchError, IndexError):
  """A subscript `v[i]` or `m[i, j]` of a batched function got an index
  out of range for some example, on any backend (the XLA ones included,
  where a gather would clamp it). The message names the function, file,
  line and subscript, the index, the axis and its size, and the example
  where known; the attributes hold them."""

  def __init__(self, message, *, function=None, filename=None, lineno=None,
               source=None, index=None, axis=None, size=None, example=None):
    self.function = function
    self.filename = filename
    self.lineno = lineno
    self.source = source
    self.index = index
    self.axis = axis
    self.size = size
    self.example = example
    super().__init__(message)


class IRError(AutobatchError):
  """An IR invariant is broken: a bug in a pass, never the user's fault."""


class XlaUnsupportedError(AutobatchError):
  """A batched program that XLA compiles (`pc:xla`, or `pc:graph` inside
  `tf.function(jit_compile=True)`) uses operations XLA has no kernel for
  (`tf.numpy_function`, `tf.py_function`, `tf.print`, ...). The message
  names each, and the line that made it where the operation's trace shows
  one; `ops` holds one `tf.Operation` of each type. (No constructor of
  its own: AutoGraph re-raises an error from a converted caller by its
  type only where that takes the message alone.)"""

  ops = ()


class UnknownBackendError(AutobatchError, ValueError):
  """A backend name that is not one of `tfp_autobatch.BACKENDS`."""
