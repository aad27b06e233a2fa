"""Programs and helpers shared by the tests of the IR-2 passes and the pc
VM (test_lower, test_stack_optimize, test_pc_vm, ...)."""
import tensorflow as tf

import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.runtime import pc_vm


INT = [types_lib.TensorType(tf.int32, ())]


@tab.batch
def fib(n):
  if n <= 1:
    return n
  return fib(n - 1) + fib(n - 2)


def fib_np(n):
  a, b = 0, 1
  for _ in range(n):
    a, b = b, a + b
  return a


def typed_program(fn, arg_types=INT):
  return pipeline.typed_program(fn, arg_types)


def run_on_graph_vm(program, *args, depth=16):
  """Runs an IR-2 program on the graph VM."""
  args = [tf.constant(a, tf.int32) for a in args]
  return pc_vm.PcVmRuntime(program, depth, mode="graph").run(args, None).numpy()


def count_ops(program, kind):
  return sum(isinstance(op, kind) for b in program.blocks for op in b.ops)


def steps_on_graph_vm(program, *args, depth=16):
  """(results, VM steps) of an IR-2 program on the graph VM."""
  runtime = pc_vm.PcVmRuntime(program, depth, mode="graph")
  got = runtime.run([tf.constant(a, tf.int32) for a in args], None)
  return got.numpy(), runtime.stats.steps


# A matrix product whose result `double_all` discards: it makes the
# primitive cost about 51,000 floating-point operations a row by
# TensorFlow's estimate, over `batched_primitive_calls`'s threshold, so that
# pc:xla computes it on its members gathered into buckets, as it does a
# costly model. (A cheap primitive runs on every row: `cheap_double_all`.)
_WIDTH = 160


@tab.batched_primitive
def double_all(x):
  rows = tf.ones([tf.shape(x)[0], _WIDTH])
  unused = tf.reduce_sum(tf.matmul(rows, tf.ones([_WIDTH, _WIDTH])), 1)
  return 2 * x + tf.cast(unused * 0., x.dtype)


@tab.batched_primitive
def cheap_double_all(x):
  return 2 * x


def calls_model_first(primitive):
  """A batched `model_first(n)` that calls the `@tab.batched_primitive`
  `primitive` on n, then itself on n - 1 down to 0, adding up: its k-th
  model call is made for the members whose n >= k."""
  @tab.batch
  def model_first(n):
    y = primitive(n)
    if n <= 0:
      return y
    return model_first(n - 1) + y
  return model_first


model_first = calls_model_first(double_all)


def repeated(primitive):
  """A batched function `(x, n) -> x` that applies the
  `@tab.batched_primitive` `primitive` to each example n times, its own n:
  a model called at every step of a loop, by fewer members each time."""
  @tab.batch
  def steps(x, n):
    while n > 0:
      x = primitive(x)
      n = n - 1
    return x
  return steps


def tree_of_model_calls(variable):
  """A batched `tree(x, depth)` that calls a `@tab.batched_primitive`
  model, `tanh(v * variable)`, at depth 0 and otherwise itself twice: `x`
  is saved on the stack across the recursive calls, and the second call
  reads the first's result. Its gradient reaches `variable` through the
  model (test_gradients, test_reverse_vm)."""
  @tab.batched_primitive
  def model(v):
    return tf.tanh(v * variable)

  @tab.batch
  def tree(x, depth):
    if depth == 0:
      return model(x)
    a = tree(x * 0.5 + 0.1, depth - 1)
    b = tree(a * x, depth - 1)
    return a + b * x
  return tree


@tab.batch
def sum_to(n):
  if n <= 0:
    return 0
  return n + sum_to(n - 1)
