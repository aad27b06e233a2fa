"""tfp_autobatch: write a function for one example, run it on a batch.

    import tfp_autobatch as tab

    @tab.batch
    def fib(n):
      if n <= 1:
        return n
      return fib(n - 1) + fib(n - 2)

    fib(np.array([3, 7, 4, 5]))        # -> [2, 13, 3, 5]
"""
from tfp_autobatch.api import batch
from tfp_autobatch.api import batched_primitive
from tfp_autobatch.api import BatchedFunction
from tfp_autobatch.api import BatchedPrimitive
from tfp_autobatch.backends import BACKENDS
from tfp_autobatch.config import default_backend
from tfp_autobatch.errors import AutobatchError
from tfp_autobatch.errors import ConversionError
from tfp_autobatch.errors import IndexOutOfRangeError
from tfp_autobatch.errors import IRError
from tfp_autobatch.errors import StackOverflowError
from tfp_autobatch.errors import TypeInferenceError
from tfp_autobatch.errors import UnknownBackendError
from tfp_autobatch.errors import XlaUnsupportedError
from tfp_autobatch.runtime.no_gradient import tape_may_record
from tfp_autobatch.runtime.stats import RunStats

__all__ = [
    "batch", "batched_primitive", "BatchedFunction", "BatchedPrimitive",
    "BACKENDS", "default_backend", "AutobatchError", "ConversionError",
    "IndexOutOfRangeError", "IRError", "StackOverflowError",
    "TypeInferenceError", "UnknownBackendError", "XlaUnsupportedError", "RunStats",
    "tape_may_record",
]
