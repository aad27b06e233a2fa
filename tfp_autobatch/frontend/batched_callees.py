"""What the frontend recognises as a batched callee in converted code.

`tab.batch` and `tab.batched_primitive` (in `api`) return instances of
these classes. The frontend only needs to tell the two kinds apart, so the
classes live here, below `api`, and `api` subclasses them: conversion then
never imports the layer that calls it.
"""


class BatchedFunctionBase:
  """A `@tab.batch` function: a call of it becomes an IR `Call`.

  Subclasses set `python_function`, the function written for one example.
  """
  python_function = None


class BatchedPrimitiveBase:
  """A `@tab.batched_primitive`: a call of it becomes a batched `Primitive`.

  Subclasses set `fn`, the function that maps over the batch itself, and
  `output_signature`, what it returns, and `fine_buckets`, how its
  members are gathered under XLA (see `tab.batched_primitive`).
  """
  fn = None
  output_signature = None
  fine_buckets = False

  def as_primitive_fn(self):
    """`fn` as a primitive's code: its result as a one-output tuple."""
    return lambda *args: (self.fn(*args),)

  def declared_outputs(self, *input_specs):
    """Its result's `tf.TensorSpec`s as a one-output tuple, from
    `output_signature` and the inputs' specs; None where undeclared."""
    signature = self.output_signature
    if callable(signature):
      signature = signature(*input_specs)
    return None if signature is None else (signature,)
