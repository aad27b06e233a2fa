"""Modes: the default backend, as a context variable."""
import contextlib
import contextvars

from tfp_autobatch import backends

_DEFAULT_BACKEND = contextvars.ContextVar("tfp_autobatch_default_backend",
                                          default="pc:xla")


def current_default_backend():
  return _DEFAULT_BACKEND.get()


@contextlib.contextmanager
def default_backend(name):
  """Use backend `name` for batched calls in this scope that name none.

      with tab.default_backend("local:eager"):
        fib(x)
  """
  backends.check_name(name)
  token = _DEFAULT_BACKEND.set(name)
  try:
    yield name
  finally:
    _DEFAULT_BACKEND.reset(token)
