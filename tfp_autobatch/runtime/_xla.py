"""TensorFlow's private XLA operations, imported in this one place.

`dynamic_update_slice` writes a slice into a buffer at a dynamic offset, in
place inside a compiled loop. TensorFlow's public scatter would do as well,
but rejects (at XLA compile time) row indices into a buffer with no
elements, which an empty batch makes. Only the XLA backend calls this.
"""
from tensorflow.compiler.tf2xla.python import xla as _xla

dynamic_update_slice = _xla.dynamic_update_slice
