"""Which blocks may leave inactive rows' junk inputs alone outside XLA
(`raise_free`): integer and boolean code that raises on no values."""
import numpy as np
import pytest
import tensorflow as tf

import example_programs
import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.analysis import raise_free
from tfp_autobatch.ir import types as types_lib

INT = [types_lib.TensorType(tf.int32, ())]


def _blocks_that_cannot_raise(fn, types):
  program = pipeline.stack_program(fn, types)
  return {b.label: raise_free.block_cannot_raise(program, b)
          for b in program.blocks}


def test_integer_code_of_total_ops_cannot_raise():
  # collatz: comparisons, sums, products, and // and % by the constant 2.
  assert all(_blocks_that_cannot_raise(example_programs.collatz_steps,
                                       INT).values())


@tab.batch
def _divides(n, d):
  if d != 0:
    return n // d
  return n


@tab.batch
def _halves_by_constant(n):
  return n // 2 + n % 3


@tab.batch
def _scales(x):
  return x * 2.


def test_what_may_raise_or_poison_is_not_counted_harmless():
  # A division by a per-example value (zero on the rows that skip it).
  assert not all(_blocks_that_cannot_raise(_divides, INT + INT).values())
  assert all(_blocks_that_cannot_raise(_halves_by_constant, INT).values())
  # A gather by a per-example index.
  assert not all(_blocks_that_cannot_raise(example_programs.find_first, [
      types_lib.TensorType(tf.float32, (5,)),
      types_lib.TensorType(tf.float32, ())]).values())
  # Floating-point code: a junk row's infinity would poison gradients.
  assert not all(_blocks_that_cannot_raise(
      _scales, [types_lib.TensorType(tf.float32, ())]).values())


@pytest.mark.parametrize("backend", ["pc:eager", "pc:graph"])
def test_guarded_division_by_a_per_example_zero_does_not_raise(backend):
  # The members with d == 0 do not take the division; their rows must not
  # run it on their own inputs (TensorFlow raises on an integer division
  # by zero).
  n = np.array([7, 9, 4], np.int32)
  d = np.array([2, 0, 3], np.int32)
  np.testing.assert_array_equal(_divides(n, d, backend=backend), [3, 9, 1])
