"""Tests of the program-counter VM (`runtime/pc_vm.py`, paper Algorithm
2): tracing, stack overflow, packed state and results, through the
public API and on IR-2 programs."""
import collections
import re

import numpy as np
import pytest
import tensorflow as tf

from pc_testing import INT, fib, fib_np, repeated
import tfp_autobatch as tab
from tfp_autobatch import pipeline
from tfp_autobatch.ir import ir2
from tfp_autobatch.runtime import pc_vm


@tab.batch
def _steps_down(n):
  # For the tests that count traces: its runtimes are theirs alone (other
  # tests' calls of fib trace fib's).
  if n <= 0:
    return n
  return _steps_down(n - 1) - 1


@pytest.mark.parametrize("backend", ["pc:graph", "pc:xla"])
def test_no_retracing_on_new_values(backend):
  x = np.array([5, 9, 2, 0], np.int32)
  _steps_down(x, backend=backend)
  runtime = pipeline.runtime(_steps_down, INT, backend)
  traces = runtime.trace_count
  np.testing.assert_array_equal(_steps_down(x + 1, backend=backend), -x - 1)
  assert runtime.trace_count == traces == 1
  # Both trace once per batch size (pc:graph for its first few sizes).
  _steps_down(x[:3], backend=backend)
  _steps_down(x[:3] + 1, backend=backend)
  assert runtime.trace_count == 2


def test_pc_graph_traces_its_first_sizes_alone_then_one_trace_for_all():
  @tab.batch
  def steps_down(n):   # this test's own: no other test has traced it
    if n <= 0:
      return n
    return steps_down(n - 1) - 1

  backend = "pc:graph"
  x = np.arange(12, dtype=np.int32) % 7
  sizes = range(1, pc_vm.GRAPH_SIZES_TRACED + 4)
  for n in sizes:
    np.testing.assert_array_equal(steps_down(x[:n], backend=backend),
                                  -x[:n])
  runtime = pipeline.runtime(steps_down, INT, backend)
  # One trace per size up to the limit, then one more for any size.
  assert runtime.trace_count == pc_vm.GRAPH_SIZES_TRACED + 1
  for n in sizes:   # every size again: no new trace
    steps_down(x[:n] + 1, backend=backend)
  assert runtime.trace_count == pc_vm.GRAPH_SIZES_TRACED + 1


@tab.batch
def _halve_until_small(x):
  while tf.reduce_sum(x) > 1.0:
    x = x * 0.5
  return x


def _halve_until_small_np(x):
  x = np.array(x)
  for row in x:
    while row.sum() > 1.0:
      row *= 0.5
  return x


@tab.batch
def _depth_and_empty(n, empty):
  # `empty` has no elements per member; each call changes it and it is
  # read after the call, so the VM saves it on a stack across the call.
  if n <= 0:
    return tf.cast(n, tf.float32), empty
  depth, deeper = _depth_and_empty(n - 1, empty + 1.)
  return depth + tf.reduce_sum(empty) + 1., deeper + empty


@pytest.mark.parametrize("backend", ["pc:eager", "pc:graph", "pc:xla"])
@pytest.mark.parametrize("shape", [(0,), (2, 0)])
def test_values_without_elements_live_across_a_call(backend, shape):
  # Saving such a value was a scatter into a stack with no elements, which
  # TensorFlow rejects: eagerly, when a graph runs it, and XLA when it
  # compiles. (pc:graph passed where the saved value was only read by
  # tf.size: TensorFlow's graph optimiser dropped the scatter.)
  n = np.array([2, 3, 0], np.int32)
  empty = np.zeros((3,) + shape, np.float32)
  tf.nest.map_structure(np.testing.assert_array_equal,
                        _depth_and_empty(n, empty, backend=backend),
                        _depth_and_empty(n, empty, backend="local:eager"))
  assert "_depth_and_empty.empty" in _depth_and_empty.ir(level=2).stacked


def test_values_without_elements_in_pc_graph_inside_a_user_xla_function():
  # There pc:graph writes its stacks one by one with XLA's scatter.
  n = np.array([2, 3, 0], np.int32)
  empty = np.zeros([3, 0], np.float32)
  got = tf.function(lambda n, e: _depth_and_empty(n, e, backend="pc:graph"),
                    jit_compile=True)(n, empty)
  tf.nest.map_structure(np.testing.assert_array_equal, got,
                        _depth_and_empty(n, empty, backend="local:eager"))


def test_xla_reads_primitive_inputs_without_gathering_them():
  """With the batch size static, pfor takes row i of a primitive's input
  to be the input itself; with it unknown, pfor gathered every row by its
  index, a gather XLA kept and repeated in the kernels that read it (a NUTS
  transition at 4 chains: 5.7 -> 4.1 ms). A batch of unknown size (in a
  caller's tf.function) still runs, on a trace of its own."""
  x = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3))
  np.testing.assert_array_equal(_halve_until_small(x, backend="pc:xla"),
                                _halve_until_small_np(x))
  runtime = pipeline.runtime(_halve_until_small,
                             _halve_until_small._last_types, "pc:xla")  # pylint: disable=protected-access
  def pfor_gathers(compiled):
    hlo = compiled.experimental_get_compiler_ir(x)(stage="hlo")
    return [line for line in hlo.splitlines()
            if " gather(" in line and "pfor" in line]
  assert not pfor_gathers(runtime.compiled_for([x]))
  unknown_size = tf.function(
      lambda x: _halve_until_small(x, backend="pc:xla"),
      input_signature=[tf.TensorSpec([None, 3], tf.float32)])
  np.testing.assert_array_equal(unknown_size(x), _halve_until_small_np(x))
  assert pfor_gathers(runtime._compiled[(None, False)])  # pylint: disable=protected-access


def _counter_conditions(hlo):
  """The while-loop conditions of an HLO module that compare a loop
  variable with a constant (`i < n`), which XLA's loop passes take for a
  counter's: their headers."""
  found = []
  for computation in re.split(r"\n(?=\S)", hlo):
    header, _, body = computation.partition("\n")
    if "cond" not in header:
      continue
    opcodes, compares = {}, []
    for line in body.splitlines():
      m = re.match(r"\s*(?:ROOT )?%(\S+) = \S+ ([\w-]+)\((.*)", line)
      if m:
        opcodes[m.group(1)] = m.group(2)
        if m.group(2) == "compare":
          compares.append(re.findall(r"%([\w.-]+)", m.group(3).split(")")[0]))
    if any(sorted(opcodes.get(a) for a in args)
           == ["constant", "get-tuple-element"] for args in compares):
      found.append(header)
  return found


@pytest.mark.parametrize("n", [[3, 7, 1], [6]])
def test_the_vm_loop_condition_is_not_a_counters(n):
  """XLA's while-loop passes (run about fifty times a compilation under
  `sample_chain`) take a loop whose condition compares a loop variable
  with a constant for a counted loop, and to check the count they copy out
  everything that variable depends on in the body: for the VM's loop, the
  whole step. Its condition reads the next block from a table instead."""
  n = tf.constant(n, tf.int32)
  np.testing.assert_array_equal(fib(n, backend="pc:xla"),
                                [fib_np(k) for k in n.numpy()])
  runtime = pipeline.runtime(fib, fib._last_types, "pc:xla")  # pylint: disable=protected-access
  hlo = runtime.compiled_for([n]).experimental_get_compiler_ir(n)(
      stage="hlo")
  assert " while(" in hlo
  assert not _counter_conditions(hlo)
  # The detector sees a condition that reads the loop variable directly.
  assert _counter_conditions(hlo.replace(" = s32[] gather(",
                                         " = s32[] get-tuple-element("))


def test_stats():
  fib(np.array([6, 1, 3], np.int32), backend="pc:graph")
  stats = fib.last_stats
  assert stats.batch_size == 3
  assert stats.steps == sum(stats.block_executions.values()) > 0
  assert stats.max_stack_depth == 6
  assert 0 < stats.utilization <= 1


def test_inside_user_xla_function_with_unknown_batch():
  @tf.function(jit_compile=True,
               input_signature=[tf.TensorSpec([None], tf.int32)])
  def user(n):
    return fib(n, backend="pc:xla") * 2

  n = np.array([7, 0, 3, 10, 1], np.int32)
  np.testing.assert_array_equal(user(n), [2 * fib_np(i) for i in n])
  np.testing.assert_array_equal(user(n[:2]), [2 * fib_np(i) for i in n[:2]])


def test_pc_graph_inside_user_graph_with_unknown_batch():
  @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
  def user(n):
    return fib(n, backend="pc:graph")

  n = np.array([7, 0, 3], np.int32)
  np.testing.assert_array_equal(user(n), [fib_np(i) for i in n])


# -- stack overflow: never a silently wrong answer.

@tab.batch(max_stack_depth=4)
def shallow_fib(n):
  if n <= 1:
    return n
  return shallow_fib(n - 1) + shallow_fib(n - 2)


@pytest.mark.parametrize("backend", ["pc:eager", "pc:graph", "pc:xla"])
def test_overflow_raises_when_called_eagerly(backend):
  with pytest.raises(tab.StackOverflowError, match="max_stack_depth=4"):
    shallow_fib(np.array([2, 6], np.int32), backend=backend)
  # Within the limit it works (depth 4 frames: n <= 4).
  np.testing.assert_array_equal(
      shallow_fib(np.array([4, 2], np.int32), backend=backend), [3, 1])


def test_overflow_inside_user_graph_fails_the_graph():
  @tf.function
  def user(n):
    return shallow_fib(n, backend="pc:graph")

  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="stack depth exceeded"):
    user(tf.constant([2, 6], tf.int32))


def test_overflow_inside_user_xla_poisons_the_members():
  @tf.function(jit_compile=True)
  def user(n):
    return shallow_fib(n, backend="pc:xla")

  got = user(tf.constant([2, 6, 4], tf.int32)).numpy()
  assert got.tolist() == [1, np.iinfo(np.int32).min, 3]


@tab.batch
def _one_value_two_registers(x, n):
  """Its entry block writes one computed value to two registers."""
  e = tf.cos(x)
  a = e
  b = e
  while n > 0:
    a = a * 0.5
    b = b + 1.
    n = n - 1
  return a + b


def test_a_value_written_to_several_registers_is_computed_once():
  # A block's register writes are one concatenation, and XLA's loop
  # fusion evaluates a concatenation's operands row by row: fused into it,
  # `cos(x)` would be computed once for `a` and again for `b`. Under pc:xla
  # such a value is computed into a buffer of its own first (a reduction,
  # which XLA does not fuse into its readers).
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  n = np.array([0, 2, 5], np.int32)
  want = [np.cos(v) * 0.5**k + np.cos(v) + k for v, k in zip(x, n)]
  np.testing.assert_allclose(_one_value_two_registers(x, n, backend="pc:xla"),
                             want, rtol=1e-6)
  runtime = pipeline.runtime(_one_value_two_registers,
                             _one_value_two_registers._last_types,  # pylint: disable=protected-access
                             "pc:xla")
  args = [tf.constant(x), tf.constant(n)]
  hlo = runtime.compiled_for(args).experimental_get_compiler_ir(*args)(
      stage="optimized_hlo")
  computations = re.split(r"\n(?=\S)", hlo)
  with_cosine = [c for c in computations if " cosine(" in c]
  assert with_cosine
  assert not any(" concatenate(" in c for c in with_cosine)
  np.testing.assert_allclose(
      _one_value_two_registers(x, n, backend="pc:graph"), want, rtol=1e-6)


def test_pc_eager_writes_only_the_stacks_a_block_pushes(monkeypatch):
  # Outside XLA a stack write is a copy of the whole [D, Z] stack, and
  # every VM step wrote every stack, those the block left alone included
  # (fib on 4,096 members under pc:graph spent most of its steps there).
  from tfp_autobatch.runtime import stack_banks
  applied = collections.Counter()
  apply = stack_banks.apply_stack_write
  def counted(stack, write, xla=False):
    applied["writes"] += 1
    return apply(stack, write, xla=xla)
  monkeypatch.setattr(stack_banks, "apply_stack_write", counted)
  n = np.array([3, 6, 1, 5])
  np.testing.assert_array_equal(fib(n, backend="pc:eager"), [2, 8, 1, 5])
  program = fib.ir(level=2)
  pushes = {b.label: len({ir2.unguarded(op).var for op in b.ops
                          if isinstance(ir2.unguarded(op), ir2.Push)})
                     + bool(ir2.call_of(b.terminator))
            for b in program.blocks}
  runs = {label.split("/", 1)[-1]: count
          for label, count in fib.last_stats.block_executions.items()}
  expected = sum(runs.get(label.split("/", 1)[-1], 0) * k
                 for label, k in pushes.items())
  assert 0 < expected < fib.last_stats.steps * 3
  assert applied["writes"] == expected


def test_pc_graph_results_keep_the_static_batch_size_in_a_graph():
  # pc:graph traces its VM for any batch size, and its results came back
  # [None] inside a caller's graph: a tf.while_loop whose variable they
  # were rejected the shape change.
  @tf.function(autograph=False)
  def twice(n):
    assert fib(n, backend="pc:graph").shape == (4,)
    return tf.while_loop(lambda i, v: i < 2,
                         lambda i, v: (i + 1, fib(v, backend="pc:graph")),
                         (0, n))[1]
  np.testing.assert_array_equal(twice(tf.constant([3, 6, 1, 5])),
                                [1, 21, 1, 5])


_SCALE = tf.constant(3.)          # a model parameter, as TFP stores one
_DATA = tf.range(5000, dtype=tf.float32)   # data too large to copy


@tab.batched_primitive
def _scaled_model(x):
  return x * tf.math.log(_SCALE) + tf.reduce_sum(_DATA) * 0.


_scaled_steps = repeated(_scaled_model)


def test_a_model_computes_from_its_small_eager_tensors_once():
  # A batched primitive (the user's model) that reads eager tensors: under
  # pc:xla the small ones are constants of the VM's computation, so XLA
  # computes what depends on them alone (log(3) here) when it compiles,
  # not at every VM step in the conditional of the block that calls the
  # model; the large one stays an argument of the computation.
  x = np.array([1., 2., 3.], np.float32)
  n = np.array([0, 1, 3], np.int32)
  want = [v * np.log(3.) ** k for v, k in zip(x, n)]
  np.testing.assert_allclose(_scaled_steps(x, n, backend="pc:xla"), want,
                             rtol=1e-6)
  runtime = pipeline.runtime(_scaled_steps,
                             _scaled_steps._last_types,  # pylint: disable=protected-access
                             "pc:xla")
  args = [tf.constant(x), tf.constant(n)]
  compiled = runtime.compiled_for(args)
  hlo = compiled.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
  assert " log(" not in hlo
  captured = compiled.get_concrete_function(*args).captured_inputs
  assert any(c is _DATA for c in captured)
  assert not any(c is _SCALE for c in captured)
  np.testing.assert_allclose(_scaled_steps(x, n, backend="pc:graph"), want,
                             rtol=1e-6)
