"""A subscript's index out of range is an error on every backend.

`v[i]` and `m[i, j]` with per-example indices become gathers, which
TensorFlow raises on and XLA clamps; the frontend's subscripts check their
indices themselves (`operators/subscripts.py`), so `pc:xla` and
`local:eager_xla` raise too, never returning a clamped row.
"""
import inspect

import numpy as np
import pytest
import tensorflow as tf

import nuts.tree
import example_programs
import tfp_autobatch as tab
from tfp_autobatch import api
from tfp_autobatch import pipeline
from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.operators import single_example
from tfp_autobatch.operators import subscripts
from tfp_autobatch.runtime import local_static
from tfp_autobatch.runtime import vectorize

TABLE = tf.constant([10.0, 20.0, 30.0])
INT_TABLE = tf.constant([10, 20, 30])
GRID = tf.constant([[1.0, 2.0], [3.0, 4.0]])


def _grids(n):
  """GRID for each of n examples, as a batch."""
  return np.stack([GRID.numpy()] * n)


def _line_of(fn, text):
  """The line of batched function `fn`'s file that holds `text` (once in
  `fn`)."""
  lines, first = inspect.getsourcelines(fn.python_function)
  found = [first + n for n, line in enumerate(lines) if text in line]
  assert len(found) == 1, (text, found)
  return found[0]


@tab.batch
def shifted(i):
  return TABLE[i - 3]


@tab.batch
def shifted_int(i):
  return INT_TABLE[i - 3]


@tab.batch
def grid_at(m, i, j):
  return m[i, j]


@tab.batch
def sum_first(n):
  """Loops up to a per-example bound: the subscript in the loop faults
  for n > 3."""
  total = 0.0
  k = 0
  while k < n:
    total += TABLE[k]
    k += 1
  return total


@tab.batch
def count_down_then_read(n, k):
  """Recursion down to 0, then a read at a per-example index."""
  if n <= 0:
    return TABLE[k]
  return count_down_then_read(n - 1, k) + 1.0


@tab.batch
def read_if_in_range(i):
  """Reads only where the index is in range: the members that skip the
  read hold junk indices, which must raise nothing (under XLA, a masked
  block computes the read on their rows too)."""
  x = -1.0
  if i < 3:
    x = TABLE[i]
  return x


@tab.batch
def find_first_above(v, threshold):
  """The loop's test block returns -1 past the end, its body merged into
  it under a guard (test_pc's find_first, with `v[i]`): the returning
  members' rows hold i == 5, out of range, where the guard is off."""
  i = 0
  while i < 5:
    if v[i] > threshold:
      return i
    i += 1
  return -1


@tab.batch
def clamped_by_xla(i):
  return tf.gather(TABLE, i)


SHIFTED_LINE = _line_of(shifted, "TABLE[i - 3]")


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_an_index_out_of_range_raises_naming_the_line(backend):
  with pytest.raises(tab.IndexOutOfRangeError,
                     match=rf"in function 'shifted' \(.*test_index_checks"
                     rf"\.py, line {SHIFTED_LINE}\): the index of "
                     r"`TABLE\[i - 3\]` is 4 for example 1 of the batch, out "
                     r"of range for axis 0 of size 3") as raised:
    shifted(np.array([5, 7, 3]), backend=backend)
  e = raised.value
  assert isinstance(e, IndexError)
  assert (e.function, e.lineno, e.source, e.index, e.axis, e.size,
          e.example) == ("shifted", SHIFTED_LINE, "TABLE[i - 3]", 4, 0, 3, 1)


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_indices_in_range_negative_ones_included_read_their_rows(backend):
  i = np.array([0, 1, 2, 3, 4, 5])   # TABLE[-3] ... TABLE[2]
  np.testing.assert_array_equal(shifted(i, backend=backend),
                                [10, 20, 30, 10, 20, 30])
  np.testing.assert_array_equal(
      grid_at(_grids(4), np.array([0, 1, -1, -2]), np.array([1, -2, -1, 0]),
              backend=backend), [2, 3, 4, 1])


@pytest.mark.parametrize("backend", tab.BACKENDS)
@pytest.mark.parametrize("index", [-4, 3])
def test_a_negative_index_past_the_start_raises_as_one_past_the_end(
    backend, index):
  with pytest.raises(tab.IndexOutOfRangeError,
                     match=rf"is {index} for example 0 .*\(valid indices "
                     "are -3 to 2"):
    shifted(np.array([index + 3, 4]), backend=backend)


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_the_axis_out_of_range_of_a_two_index_subscript_is_named(backend):
  with pytest.raises(tab.IndexOutOfRangeError,
                     match=r"`m\[i, j\]` is 2 for example 1 of the batch, "
                     "out of range for axis 1 of size 2"):
    grid_at(_grids(2), np.array([0, 1]), np.array([1, 2]), backend=backend)


CUBE = tf.reshape(tf.range(24.0), [2, 3, 4])


@tab.batch
def cube_at(i, j):
  """Two indices into a table shared by all examples: its rows (length
  4) are what each example reads."""
  return CUBE[i, j - 1]


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_two_indices_into_a_shared_table_vectorise(backend, monkeypatch):
  # pfor has no batched GatherNd of a value shared by all rows: such a
  # subscript ran as a loop over the batch (strict mode: an error).
  monkeypatch.setenv("TFP_AUTOBATCH_STRICT_PFOR", "1")
  i, j = np.array([0, 1, -1, -2, 1]), np.array([1, 3, 0, -1, 2])
  np.testing.assert_array_equal(cube_at(i, j, backend=backend),
                                CUBE.numpy()[i, j - 1])
  with pytest.raises(tab.IndexOutOfRangeError,
                     match=r"`CUBE\[i, j - 1\]` is 3 for example 1 of the "
                     "batch, out of range for axis 1 of size 3"):
    cube_at(np.array([0, 1]), np.array([1, 4]), backend=backend)


NOTHING = tf.zeros([3, 0, 2])


@tab.batch
def read_nothing(i, j):
  return NOTHING[i, j]


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_an_axis_of_size_0_has_no_valid_index(backend):
  # TensorFlow's gather from an empty axis raised its own error, and XLA
  # failed to compile the VM.
  with pytest.raises(tab.IndexOutOfRangeError,
                     match=r"`NOTHING\[i, j\]` is 0 for example 0 of the "
                     r"batch, out of range for axis 1 of size 0 \(it has no "
                     "valid index"):
    read_nothing(np.array([1, 2]), np.array([0, 0]), backend=backend)


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_an_index_out_of_range_in_a_loop_or_after_recursion_raises(backend):
  np.testing.assert_array_equal(
      sum_first(np.array([0, 1, 3, 2]), backend=backend), [0, 10, 60, 30])
  with pytest.raises(tab.IndexOutOfRangeError,
                     match=rf"line {_line_of(sum_first, 'TABLE[k]')}\): the "
                     "index of `TABLE\\[k\\]` is 3 for example 2 of"):
    sum_first(np.array([0, 1, 4, 2]), backend=backend)
  n = np.array([2, 3])
  np.testing.assert_array_equal(
      count_down_then_read(n, np.array([1, -1]), backend=backend), [22, 33])
  line = _line_of(count_down_then_read, "TABLE[k]")
  with pytest.raises(tab.IndexOutOfRangeError,
                     match=rf"line {line}\): the index of `TABLE\[k\]` is 5 "
                     "for example 1"):
    count_down_then_read(n, np.array([1, 5]), backend=backend)


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_junk_indices_of_members_that_skip_the_subscript_raise_nothing(
    backend):
  i = np.array([0, 1000, 2, 7, -3])
  np.testing.assert_array_equal(read_if_in_range(i, backend=backend),
                                [10, -1, 30, -1, 10])
  v = np.array([[0.1, 0.2, -0.3, 0.5, 0.9], [2, 0, 0, 0, 0],
                [0, 0, 0, 0, 3]], np.float32)
  np.testing.assert_array_equal(
      find_first_above(v, np.array([1.2, 1.0, 1.0], np.float32),
                       backend=backend), [-1, 0, 4])


@pytest.mark.parametrize("strategy", ["gather", "mask"])
def test_both_local_strategies_check_their_members_only(strategy):
  def run(i):
    args, arg_types, n = api._prepare(read_if_in_range, (i,))  # pylint: disable=protected-access
    program = pipeline.typed_program(read_if_in_range, arg_types)
    return local_static.LocalStaticRuntime(
        program, vectorize.KernelCache(jit_compile=False), 64,
        strategy=strategy).run(args, n)
  np.testing.assert_array_equal(run(np.array([0, 9, 2])), [10, -1, 30])
  with pytest.raises(tab.IndexOutOfRangeError, match="is -4 for example 1"):
    run(np.array([0, -4, 2]))


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_an_empty_batch_reads_nothing(backend):
  assert shifted(np.zeros([0], np.int64), backend=backend).shape == [0]


def test_the_reference_interpreter_raises_the_same_error():
  with pytest.raises(tab.IndexOutOfRangeError,
                     match=rf"line {SHIFTED_LINE}\): the index of "
                     r"`TABLE\[i - 3\]` is 4, out of range"):
    shifted.reference(np.array([5, 7]))


def test_an_int64_index_past_int32_is_reported_as_such():
  with pytest.raises(tab.IndexOutOfRangeError,
                     match="is at least 2147483647 for example 0"):
    shifted(np.array([2**40]), backend="pc:xla")


@pytest.mark.parametrize("backend", ["pc:graph", "pc:xla"])
def test_inside_a_user_graph_the_graph_fails_naming_the_line(backend):
  @tf.function
  def user(i):
    return shifted(i, backend=backend)

  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=rf"index is out of range:\] \[in function "
                     rf"\\'shifted\\' \(.*, line {SHIFTED_LINE}\), "
                     r"`TABLE\[i - 3\]`, axis 0 of size 3\] \[example\] "
                     r"\[1\] \[index\] \[4\]"):
    user(tf.constant([5, 7, 3]))
  np.testing.assert_array_equal(user(tf.constant([5, 4, 3])), [30, 20, 10])


@pytest.mark.parametrize("backend", ["pc:graph", "pc:xla"])
def test_inside_a_user_xla_function_the_faulted_members_are_poisoned(
    backend):
  @tf.function(jit_compile=True)
  def user(i):
    return shifted(i, backend=backend), shifted_int(i, backend=backend)

  floats, ints = user(tf.constant([5, 7, 3]))
  np.testing.assert_array_equal(floats, [30, np.nan, 10])
  np.testing.assert_array_equal(ints, [30, np.iinfo(np.int32).min, 10])


def test_a_gather_written_by_the_user_keeps_xla_semantics():
  # Only the subscripts the frontend rewrote are checked (README).
  np.testing.assert_array_equal(
      clamped_by_xla(np.array([0, 5]), backend="pc:xla"), [10, 30])
  with pytest.raises(tf.errors.InvalidArgumentError):
    clamped_by_xla(np.array([0, 5]), backend="pc:graph")


def _sites(fn):
  program = pipeline.convert_program(fn)
  return [site for f in program.functions for b in f.blocks for op in b.ops
          if hasattr(op, "code") for site in op.code.subscripts]


def test_only_subscripts_that_may_gather_are_checked():
  def reads(v, i, d):
    a = v[i] + v[0] + v[-1] + v[i:][0] + d["w"] + GRID[1, -1]
    return a + GRID[0, i] + GRID[i][i + 1]

  fn = tab.batch(reads)
  assert [s.source for s in _sites(fn)] == [
      "v[i]", "GRID[0, i]", "GRID[i][i + 1]", "GRID[i]"]
  # The IR prints the user's subscripts; the code it runs numbers them.
  assert "getitem(v, i)" in str(fn.ir())


def test_only_code_with_checked_subscripts_returns_fault_records():
  assert not _sites(example_programs.fib)
  [test] = pipeline.convert_program(example_programs.fib).entry.blocks[0].ops
  assert len(single_example.single_example_fn(test, [types_lib.TensorType(
      tf.bool, ())])(tf.constant(3))) == 1
  [read] = pipeline.convert_program(shifted).entry.blocks[0].ops
  run = single_example.single_example_fn(read, [types_lib.TensorType(
      tf.float32, ())])
  value, fault = run(tf.constant(5))
  assert value == 30 and fault.numpy().tolist() == [0, 0]
  _, fault = run(tf.constant(7))
  e = subscripts.error(fault.numpy())
  assert (e.source, e.index, e.axis, e.size) == ("TABLE[i - 3]", 4, 0, 3)


def test_the_nuts_program_has_no_checked_subscripts():
  # Its blocks keep their cost: no fault records, no checks.
  functions = nuts.tree.make_program(lambda q: q, max_tree_depth=3,
                                     unrolled_leapfrog_steps=1,
                                     num_trajectories=1)
  assert not _sites(functions[0])


def test_fault_records_keep_the_first_fault():
  a = tf.constant([[0, 0], [3, 5]])
  b = tf.constant([[4, 7], [4, 7]])
  np.testing.assert_array_equal(subscripts.first_fault(a, b),
                                [[4, 7], [3, 5]])
