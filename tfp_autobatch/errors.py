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
  """A variable gets different dtypes or shapes on different paths."""


class StackOverflowError(AutobatchError):
  """Recursion went deeper than the function's `max_stack_depth`."""


class IRError(AutobatchError):
  """An IR invariant is broken: a bug in a pass, never the user's fault."""


class UnknownBackendError(AutobatchError, ValueError):
  """A backend name that is not one of `tfp_autobatch.BACKENDS`."""
