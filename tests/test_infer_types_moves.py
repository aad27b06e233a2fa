"""Type inference's record of code that only moves its inputs
(`passes/infer_types.moved_inputs`), which the VM then does not vectorise
(`runtime/block_runner.py`)."""
import collections

import tensorflow as tf

from tfp_autobatch.ir import ir1
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.passes import infer_types
from tfp_autobatch.passes import inline

Pair = collections.namedtuple("Pair", ["a", "b"])
SCALAR = types_lib.TensorType(tf.float32, ())
VECTOR = types_lib.TensorType(tf.float32, (3,))
INTS = types_lib.TensorType(tf.int32, (2,))
PAIR = Pair(SCALAR, VECTOR)


def _primitive(fn, outs, ins):
  return ir1.Primitive(outs, ir1.Code(fn, "test code"), ins)


def test_fields_and_whole_inputs_are_found_by_position():
  op = _primitive(lambda p, k: (p.b, p, k), ("u", "v", "w"), ("p", "k"))
  infer_types.abstract_eval(op, [PAIR, INTS])
  # Flattened inputs: p.a, p.b, k.
  assert infer_types.moved_inputs(op, [PAIR, INTS]) == ((1,), (0, 1), (2,))


def test_code_that_computes_anything_moves_nothing():
  plus_one = _primitive(lambda p, k: (p.b, k + 1), ("u", "w"), ("p", "k"))
  infer_types.abstract_eval(plus_one, [PAIR, INTS])
  assert infer_types.moved_inputs(plus_one, [PAIR, INTS]) is None
  constant = _primitive(lambda k: (k, tf.constant(0)), ("u", "w"), ("k",))
  infer_types.abstract_eval(constant, [INTS])
  assert infer_types.moved_inputs(constant, [INTS]) is None


def test_only_types_traced_are_known():
  op = _primitive(lambda k: (k,), ("u",), ("k",))
  assert infer_types.moved_inputs(op, [INTS]) is None   # not traced yet
  infer_types.abstract_eval(op, [INTS])
  assert infer_types.moved_inputs(op, [INTS]) == ((0,),)
  assert infer_types.moved_inputs(op, [VECTOR]) is None


def test_inlining_copies_move_their_inputs_in_order():
  copy = ir1.Primitive(("u", "v"), inline.COPY, ("p", "k"))
  assert infer_types.moved_inputs(copy, [PAIR, INTS]) == ((0, 1), (2,))
