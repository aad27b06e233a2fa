"""The public API: decorators, backends, errors, statistics."""
import collections
import copy
import functools
import pickle
import threading

import numpy as np
import pytest
import tensorflow as tf

import tfp_autobatch as tab
from example_programs import count_loop

LOCAL_BACKENDS = [b for b in tab.BACKENDS if b.startswith("local:")]


@tab.batch
def fib(n):
  if n <= 1:
    return n
  return fib(n - 1) + fib(n - 2)


def test_fib_default_backend_and_per_call_backend():
  x = np.array([3, 7, 4, 5])
  np.testing.assert_array_equal(fib(x), [2, 13, 3, 5])
  for backend in tab.BACKENDS:
    np.testing.assert_array_equal(fib(x, backend=backend), [2, 13, 3, 5])


def test_default_backend_scope_is_used_and_restored():
  x = np.array([3, 4])
  with tab.default_backend("local:eager"):
    fib(x)
    first = fib.last_stats
  fib(x, backend="local:eager")
  assert first.steps == fib.last_stats.steps
  with pytest.raises(tab.UnknownBackendError):
    with tab.default_backend("gpu:magic"):
      pass


def test_unknown_backend_lists_valid_ones():
  with pytest.raises(tab.UnknownBackendError) as info:
    fib(np.array([1]), backend="nope")
  for name in tab.BACKENDS:
    assert name in str(info.value)


def test_decorator_with_arguments():
  @tab.batch(max_stack_depth=3, backend="local:eager")
  def depth(n):
    if n == 0:
      return n
    return depth(n - 1)
  np.testing.assert_array_equal(depth(np.array([0, 2])), [0, 0])
  with pytest.raises(tab.StackOverflowError, match="max_stack_depth=3"):
    depth(np.array([0, 5]))


@pytest.mark.parametrize("backend", LOCAL_BACKENDS)
def test_empty_batch_gives_empty_results_of_the_right_type(backend):
  Pair = collections.namedtuple("Pair", "a b")

  @tab.batch
  def f(p):
    return Pair(p.a * 2.0, tf.reduce_sum(p.b))
  out = f(Pair(np.zeros([0, 3], np.float32), np.zeros([0, 2], np.int64)),
          backend=backend)
  assert isinstance(out, Pair)
  assert out.a.shape == (0, 3) and out.a.dtype == tf.float32
  assert out.b.shape == (0,) and out.b.dtype == tf.int64


def test_statistics_after_a_call():
  fib(np.array([1, 6, 6, 6]), backend="local:eager")
  stats = fib.last_stats
  assert stats.batch_size == 4
  assert stats.steps == sum(stats.block_executions.values())
  assert 0 < stats.utilization <= 1
  assert stats.max_stack_depth == 6   # fib(6) -> ... -> fib(1)


def test_per_example_reduction_reduces_one_example_only():
  @tab.batch
  def norm(v):
    return tf.reduce_sum(v * v)
  v = np.arange(6, dtype=np.float32).reshape(2, 3)
  np.testing.assert_allclose(norm(v), [5.0, 50.0])


def test_closure_values_are_shared_by_all_examples():
  offset = np.array([10.0, 20.0], np.float32)
  scale = tf.constant(3.0)

  @tab.batch
  def f(x):
    return x * scale + offset
  np.testing.assert_allclose(f(np.array([[1.0, 1.0], [2.0, 0.0]], np.float32)),
                             [[13.0, 23.0], [16.0, 20.0]])


@tab.batched_primitive
def _batched_sum(x):
  assert x.shape.rank == 2, "called on the batch, not one example"
  return tf.reduce_sum(x, axis=1)


def test_batched_primitive_runs_on_the_batch():
  @tab.batch
  def f(x):
    s = _batched_sum(x)
    if s > 3:
      s = _batched_sum(x * 2.0)
    return s
  x = np.array([[1.0, 1.0], [2.0, 2.0]], np.float32)
  np.testing.assert_allclose(f(x), [2.0, 8.0])
  np.testing.assert_allclose(f.reference(x), [2.0, 8.0])


def test_batched_primitive_calls_names_the_blocks_that_call_them():
  @tab.batch
  def f(x):
    s = _batched_sum(x) + _batched_sum(x * 3.0)
    if s > 3:
      s = _batched_sum(x * 2.0)
    return s
  f(np.array([[1.0, 1.0], [2.0, 2.0]], np.float32), backend="local:eager")
  calls = f.batched_primitive_calls()
  assert sorted(calls.values()) == [1, 2]
  program = f.ir(level=1)
  labels = {f"{fn.name}/{b.label}" for fn in program.functions
            for b in fn.blocks}
  assert set(calls) < labels


@tab.batched_primitive
def _through_numpy(x):
  return tf.ensure_shape(
      tf.numpy_function(lambda a: a, [x], x.dtype, stateful=False),
      x.shape)


def test_an_operation_xla_lacks_is_a_clear_error_where_xla_compiles():
  """pc:xla compiles the whole VM with XLA: an operation XLA has no kernel
  for failed at the first run with XLA's error about a VM block. It is
  found in the trace first, and named with the line that made it."""
  @tab.batch
  def f(x):
    s = _through_numpy(x)
    if s > 3:
      s = s * 2.0
    return s
  x = np.array([1.0, 4.0], np.float32)
  with pytest.raises(tab.XlaUnsupportedError,
                     match=r"pc:xla compiles .* no kernel for "
                     r"PyFuncStateless \(made at .*test_api.py, line \d+, "
                     r"in _through_numpy\)\. Use backend='pc:graph'"):
    f(x, backend="pc:xla")
  np.testing.assert_allclose(f(x, backend="pc:graph"), [1.0, 8.0])
  # pc:graph inside the caller's XLA compilation: the same, and the advice
  # is to call it outside.
  with pytest.raises(tab.XlaUnsupportedError,
                     match=r"pc:graph inside tf.function\(jit_compile=True\)"
                     r".*Use it outside jit_compile"):
    tf.function(lambda v: f(v, backend="pc:graph"), jit_compile=True)(x)


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_an_output_signature_spares_type_inference_a_trace(backend):
  """Given an output_signature, type inference takes a batched primitive's
  output types from it: the function is traced once less (for an
  expensive target, seconds of a first call)."""
  traces = []
  def summed(x):
    traces.append(x.shape[0])
    return tf.reduce_sum(x, axis=1), x * 2.0
  undeclared = tab.batched_primitive(summed)
  declared = tab.batched_primitive(
      summed, output_signature=lambda x: (tf.TensorSpec([None], x.dtype), x))
  fixed = tab.batched_primitive(summed, output_signature=(
      tf.TensorSpec([None], tf.float32), tf.TensorSpec([None, 2], tf.float32)))
  x = np.array([[1.0, 1.0], [2.0, 2.0]], np.float32)
  def program(primitive):
    @tab.batch
    def f(x):
      s, y = primitive(x)
      if s > 3:
        s = s + tf.reduce_sum(y)
      return s
    return f
  counts = []
  for primitive in (undeclared, declared, fixed):
    del traces[:]
    np.testing.assert_allclose(program(primitive)(x, backend=backend),
                               [2.0, 12.0])
    counts.append(traces.count(None))   # traces for any batch size
  assert counts[1:] == [counts[0] - 1] * 2


def test_a_wrong_output_signature_is_a_clear_error():
  x = np.array([[1.0, 1.0], [2.0, 2.0]], np.float32)
  for signature, says in [
      (tf.TensorSpec([None, 2], tf.float32), r"returned float32\[\] per "
       r"example where its output_signature gives float32\[2\]"),
      (tf.TensorSpec([None], tf.float64), "returned float32"),
      (tf.TensorSpec([2], tf.float32), "leading .batch. dimension is None"),
      (3, "each output is a tf.TensorSpec"),
      ((tf.TensorSpec([None], tf.float32),) * 2, "structure other than"),
  ]:
    @tab.batched_primitive(output_signature=signature)
    def summed(x):
      return tf.reduce_sum(x, axis=1)
    @tab.batch
    def f(x):
      return summed(x)
    with pytest.raises(tab.TypeInferenceError, match=says):
      f(x, backend="pc:graph")


def test_a_declared_batched_primitive_that_fails_is_a_type_inference_error():
  # Traced first by the runtime, not by type inference: it fails the same.
  @tab.batched_primitive(output_signature=lambda x: x)
  def needs_python_bool(x):
    if tf.reduce_sum(x) > 0:   # a tensor as a Python bool, in a graph
      return x
    return -x
  @tab.batch
  def f(x):
    return needs_python_bool(x)
  with pytest.raises(tab.TypeInferenceError, match="needs_python_bool"):
    f(np.ones([2, 3], np.float32), backend="pc:xla")


def test_tape_may_record_is_true_only_under_a_tape():
  assert not tab.tape_may_record()
  with tf.GradientTape():
    assert tab.tape_may_record()
  assert not tab.tape_may_record()


@pytest.mark.parametrize("reduce", [
    tf.reduce_sum,                                # the batch summed away
    lambda x: tf.reduce_sum(x, 0),                # over the batch axis
    lambda x: (tf.reduce_sum(x, -1), 2.0),        # a Python number
])
def test_batched_primitive_that_drops_the_batch_is_a_clear_error(reduce):
  # It failed in a gather deep in the VM ("Shape must be at least rank 1").
  @tab.batched_primitive
  def reduced(x):
    return reduce(x)

  @tab.batch
  def f(x):
    return reduced(x)
  with pytest.raises(tab.TypeInferenceError,
                     match="keeps the batch as its leading dimension"):
    f(np.ones([3, 2], np.float32), backend="pc:graph")


def _sums_batched(x):
  return _batched_sum(x)


def _calls_fib(n):
  return fib(n) + 1


def _relu(v):
  return max(v, 0.0)   # Python's max of a tensor: only in a batch body


@pytest.mark.parametrize("helper, x, error, match", [
    # A batched primitive or function called from a helper used to fail
    # deep in type inference (the function: "needs a leading batch
    # dimension").
    (_sums_batched, np.ones([2, 2], np.float32), tab.AutobatchError,
     "call it directly"),
    (_calls_fib, np.array([3, 4]), tab.ConversionError,
     r"batched function fib was called from single-example code.*call it "
     r"directly"),
    # TensorFlow's own message says to use eager execution or tf.function,
    # which does not apply inside a batched function.
    (_relu, np.array([1., -1.]), tab.TypeInferenceError,
     r"Not a matter of eager execution.*move them into the body"),
])
@pytest.mark.parametrize("backend", ["local:eager", "pc:graph"])
def test_a_helper_doing_what_only_a_batch_body_can_is_a_clear_error(
    helper, x, error, match, backend):
  @tab.batch
  def f(x):
    return helper(x)
  with pytest.raises(error, match=match):
    f(x, backend=backend)


@pytest.mark.parametrize("python_cast, tf_cast", [
    ("int", "tf.int32"), ("float", "tf.float32")])
def test_python_number_casts_of_values_point_to_tf_cast(python_cast,
                                                        tf_cast):
  @tab.batch
  def f(x):
    return x + {"int": int, "float": float}[python_cast](x)
  with pytest.raises(tab.TypeInferenceError,
                     match=rf"instead of {python_cast}\(x\) write "
                     rf"tf.cast\(x, {tf_cast}\)"):
    f(np.array([1.5, 2.5], np.float32), backend="local:eager")


def test_default_arguments_are_rejected_whatever_the_count():
  # Leaving the defaulted argument out gave only "takes 2 batch arguments".
  @tab.batch
  def scale(x, k=3):
    return x * k
  for args in [(np.ones([2]),), (np.ones([2]), np.ones([2]))]:
    with pytest.raises(tab.ConversionError, match="default arguments"):
      scale(*args)


def test_local_backends_refuse_to_be_traced():
  @tf.function
  def g(x):
    return fib(x, backend="local:eager")
  with pytest.raises(tab.AutobatchError, match="pc:graph"):
    g(tf.constant([1, 2]))


def test_scalar_argument_is_a_clear_error():
  with pytest.raises(TypeError, match="closure"):
    fib(3)


def test_mismatched_batch_sizes_are_a_clear_error():
  @tab.batch
  def add(a, b):
    return a + b
  with pytest.raises(ValueError, match="different batch sizes"):
    add(np.ones([2]), np.ones([3]))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_batch_sizes_unknown_at_trace_time_are_checked_when_run(jit_compile):
  # Under an input_signature of [None], batch sizes that differ used to
  # give a silently wrong answer on pc:graph (a row dropped, or under XLA
  # a missing row read as its neighbour).
  @tab.batch
  def doubled(a, b):
    i = 0
    while i < b:
      a = a * 2.0
      i += 1
    return a

  @tf.function(jit_compile=jit_compile, input_signature=[
      tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.int32)])
  def g(a, b):
    return doubled(a, b, backend="pc:graph")

  np.testing.assert_allclose(g(tf.constant([1., 3.]), tf.constant([1, 2])),
                             [2., 12.])
  # Eagerly an assertion names the problem; under XLA, which drops
  # assertions, the reshape to the first argument's size fails.
  # Either argument the longer: with the first longer, the VM used to
  # start before the assertion and fail with an index error from inside.
  match = "Reshape|reshape" if jit_compile else "different batch sizes"
  with pytest.raises(tf.errors.InvalidArgumentError, match=match):
    g(tf.constant([1., 2., 3.]), tf.constant([1, 2, 3, 4]))
  with pytest.raises(tf.errors.InvalidArgumentError, match=match):
    g(tf.constant([1., 2., 3., 4.]), tf.constant([1, 2, 3]))

  # One size known: the unknown one is checked against it.
  @tf.function(jit_compile=jit_compile,
               input_signature=[tf.TensorSpec([None], tf.float32)])
  def h(a):
    return doubled(a, tf.constant([1, 2, 3]), backend="pc:graph")

  np.testing.assert_allclose(h(tf.constant([1., 1., 1.])), [2., 4., 8.])
  with pytest.raises(tf.errors.InvalidArgumentError):
    h(tf.constant([1., 1.]))


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_wrong_number_of_arguments_is_a_clear_error(backend):
  # The local backends used to ignore an extra argument and run.
  @tab.batch
  def add(a, b):
    return a + b
  x = np.array([3, 7])
  with pytest.raises(TypeError, match=r"takes 2 batch arguments \(a, b\), got 3"):
    add(x, x, x, backend=backend)
  with pytest.raises(TypeError, match=r"takes 2 batch arguments \(a, b\), got 1"):
    add(x, backend=backend)


def test_a_python_list_argument_is_a_clear_error():
  with pytest.raises(TypeError, match=r"np.array"):
    fib([3, 7])


def test_python_numbers_inside_a_structure_are_a_clear_error():
  # A list inside a tuple used to be flattened into scalars: "got a scalar
  # tensor".
  @tab.batch
  def first(pair):
    return pair[0]
  with pytest.raises(TypeError, match=r"scalar 3 inside a structure"):
    first(([3, 7], np.array([1, 2])))


def test_tf_function_of_a_partial_with_a_backend():
  # tf.function reads the signature; `backend` was missing from it, so
  # binding it in a functools.partial failed.
  run = tf.function(functools.partial(fib, backend="pc:graph"))
  np.testing.assert_array_equal(run(tf.constant([3, 7])), [2, 13])


def test_unknown_rank_inside_tf_function_is_a_clear_error():
  @tf.function(input_signature=[tf.TensorSpec(None, tf.int32)])
  def g(x):
    return fib(x, backend="pc:graph")
  with pytest.raises(ValueError, match=r"unknown rank.*\[None\]"):
    g.get_concrete_function()


@pytest.mark.parametrize("backend", ["local:eager", "pc:graph"])
def test_dict_argument_is_a_batch_per_key(backend):
  @tab.batch
  def scaled(d):
    if d["x"] > 0:
      return d["x"] * d["k"]
    return -d["x"]
  out = scaled({"x": np.array([2.0, -3.0]), "k": np.array([10.0, 10.0])},
               backend=backend)
  np.testing.assert_allclose(out, [20.0, 3.0])


def test_run_unbatched_runs_plain_python():
  assert int(fib.run_unbatched(tf.constant(7))) == 13


def _draw(seed, k):
  return tf.random.stateless_uniform([], tf.stack([seed, k]), alg="philox")


def _noisy_count():
  """A fresh program (its traces are cached) of per-example stateless
  draws, which pfor has no vectorisation for."""
  @tab.batch
  def noisy_count(seed, n):
    total = tf.constant(0.0)
    while n > 0:
      total = total + _draw(seed, n)
      n = n - 1
    return total
  return noisy_count


def _noisy_count_expected(seeds, counts, jit_compile):
  """The draws one example at a time (XLA's stateless draws are not TF's,
  so compiled alike)."""
  draw = tf.function(_draw, jit_compile=jit_compile)
  return [sum(float(draw(tf.constant(s), tf.constant(k)))
              for k in range(1, c + 1)) for s, c in zip(seeds, counts)]


def test_code_pfor_cannot_vectorise_is_an_error_in_strict_mode(monkeypatch):
  monkeypatch.setenv("TFP_AUTOBATCH_STRICT_PFOR", "1")
  for backend in ("pc:graph", "local:eager"):
    with pytest.raises(tab.AutobatchError, match="cannot vectorise"):
      _noisy_count()(np.array([3, 5]), np.array([2, 1]), backend=backend)


def test_a_gather_straight_from_a_variable_says_to_read_it_first(
    monkeypatch):
  # pfor has no rule for ResourceGather: the error says what to write
  # instead, and that code vectorises.
  monkeypatch.setenv("TFP_AUTOBATCH_STRICT_PFOR", "1")
  table = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
  @tab.batch
  def straight(i):
    return tf.reduce_sum(tf.gather(table, i))
  @tab.batch
  def read_first(i):
    return tf.reduce_sum(tf.gather(table.read_value(), i))
  rows = np.array([1, 2, 5], np.int32)
  with pytest.raises(tab.AutobatchError, match=r"table\.read_value\(\)"):
    straight(rows, backend="pc:graph")
  np.testing.assert_allclose(read_first(rows, backend="pc:graph"),
                             [5., 9., 21.])


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_code_pfor_cannot_vectorise_runs_as_a_loop_with_a_warning(
    backend, monkeypatch, caplog):
  """Outside strict mode such code still gives every example its own
  answer (pfor loops over the rows), and the user is told where."""
  monkeypatch.setenv("TFP_AUTOBATCH_STRICT_PFOR", "0")
  seeds, counts = np.array([3, 5, 8], np.int32), np.array([2, 1, 3], np.int32)
  with caplog.at_level("WARNING"):
    got = _noisy_count()(seeds, counts, backend=backend)
  expected = _noisy_count_expected(seeds, counts,
                                   jit_compile=backend.endswith("xla"))
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  assert "falls back to a sequential loop" in caplog.text


@pytest.mark.parametrize("strict", ["0", "1"])
@pytest.mark.parametrize("backend", ["local:eager", "pc:xla"])
def test_code_whose_shapes_differ_by_example_is_a_clear_error(
    backend, strict, monkeypatch):
  # pfor cannot vectorise tf.boolean_mask, and its loop over the batch
  # failed with an obscure TensorListStack error (local:eager, pc:eager,
  # pc:graph) or, compiled by XLA, returned [5, 3, 4.5] for [4, 5, 4.5].
  monkeypatch.setenv("TFP_AUTOBATCH_STRICT_PFOR", strict)
  @tab.batch
  def positive_sum(v):
    return tf.reduce_sum(tf.boolean_mask(v, v > 0.0))
  v = np.array([[1., -2., 3.], [-1., 0., 5.], [2., 2., 0.5]], np.float32)
  with pytest.raises(tab.AutobatchError,
                     match=r"line \d+ .*shape depends on the example.*Where"):
    positive_sum(v, backend=backend)


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_values_with_no_elements(backend):
  # A per-example shape with a zero (here [0]) used to crash the local
  # backends where a block ran for some members only (scatter).
  @tab.batch
  def grow(v, n):
    while n > 0:
      v = v + 1.0
      n = n - 1
    return v, n
  v, n = grow(np.zeros((3, 0), np.float32), np.array([0, 2, 1], np.int32),
              backend=backend)
  assert v.shape == (3, 0)
  np.testing.assert_array_equal(n, [0, 0, 0])


@pytest.mark.parametrize("backend", LOCAL_BACKENDS)
def test_local_recursion_reaches_max_stack_depth(backend):
  # The local runtime and the reference interpreter recurse in Python: a
  # bound of 600 used to end in a bare RecursionError (Python's limit of
  # 1,000 frames) near depth 450, before the program's own bound.
  @tab.batch(max_stack_depth=600)
  def down(n):
    if n <= 0:
      return 0
    return down(n - 1) + 1
  np.testing.assert_array_equal(
      down(np.array([599, 3], np.int32), backend=backend), [599, 3])
  assert down.last_stats.max_stack_depth == 600
  np.testing.assert_array_equal(down.reference(np.array([599], np.int32)),
                                [599])
  with pytest.raises(tab.StackOverflowError, match="max_stack_depth=600"):
    down(np.array([600], np.int32), backend=backend)


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_stats_of_an_empty_batch(backend):
  fib(np.array([], np.int32), backend=backend)
  assert fib.last_stats.batch_size == 0
  assert fib.last_stats.max_stack_depth == 0


def test_ragged_and_sparse_arguments_are_a_clear_error():
  @tab.batch
  def total(x):
    return tf.reduce_sum(x)
  with pytest.raises(TypeError, match=r"RaggedTensor.*to_tensor"):
    total(tf.ragged.constant([[1, 2], [3]]))
  with pytest.raises(TypeError, match="SparseTensor"):
    total((tf.sparse.from_dense(tf.eye(2)),))


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_strings_run_where_there_is_no_xla(backend):
  @tab.batch
  def doubled(s):
    return s + s
  words = np.array([b"a", b"bb"])
  if backend in ("local:eager_xla", "pc:xla"):
    with pytest.raises(TypeError, match="XLA, which has no strings"):
      doubled(words, backend=backend)
  else:
    np.testing.assert_array_equal(doubled(words, backend=backend),
                                  [b"aa", b"bbbb"])


def test_only_def_functions_can_be_batched():
  def add(a, x):
    return a + x
  with pytest.raises(TypeError, match="defined with `def`"):
    tab.batch(functools.partial(add, 5))

  class Model:
    @tab.batch
    def doubled(self, x):
      return x * 2
  # Through an instance it would be a method, whose `self` is no batch.
  with pytest.raises(TypeError, match="is a method"):
    Model().doubled(np.array([1., 2.]))
  # Looked up on the class it is the batched function itself.
  assert isinstance(Model.doubled, tab.BatchedFunction)


def test_batched_functions_pickle_by_reference_as_functions_do():
  # Pickling failed: the Python function it wraps was pickled by name, and
  # that name holds the batched function.
  count_loop(np.array([2, 3], np.int32))   # something compiled to leave out
  assert pickle.loads(pickle.dumps(count_loop)) is count_loop
  assert copy.deepcopy(count_loop) is count_loop

  def make():
    @tab.batch
    def shifted(x):
      return x + 1
    return shifted
  local = make()
  local(np.array([1, 2]))
  copied = copy.deepcopy(local)
  assert copied is not local
  np.testing.assert_array_equal(copied(np.array([1, 2])), [2, 3])
  with pytest.raises((AttributeError, pickle.PicklingError), match="local"):
    pickle.dumps(local)


@pytest.mark.parametrize("backend", ["local:eager", "pc:eager", "pc:graph"])
def test_threads_each_read_their_own_stats(backend):
  # One RunStats per runtime mixed two threads' counts (utilisation 1.9),
  # and pc:eager's runs crossed each other's traced blocks and crashed.
  batches = {"long": np.array([30, 30], np.int32),
             "short": np.array([1], np.int32)}
  count_loop(batches["short"], backend=backend)   # traced before the race
  start = threading.Barrier(2)
  seen = {}
  def call(name):
    start.wait()
    result = count_loop(batches[name], backend=backend)
    seen[name] = (result.numpy().tolist(), count_loop.last_stats)
  threads = [threading.Thread(target=call, args=(name,)) for name in batches]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert seen["long"][0] == [85, 85] and seen["short"][0] == [0]
  assert seen["long"][1].batch_size == 2
  assert seen["short"][1].batch_size == 1
  assert seen["short"][1].steps == 3
  assert seen["long"][1].active_members == 64


@pytest.mark.parametrize("backend", ["pc:graph", "pc:xla"])
def test_stats_tensors_do_not_keep_a_traced_graph_alive(backend):
  # `last_stats_tensors` (and the runtime's) held the traced call's tensors,
  # and with them the caller's whole graph, until the next call.
  import gc
  import weakref
  @tab.batch
  def down(n):
    while n > 0:
      n = n - 1
    return n
  fn = tf.function(lambda n: down(n, backend=backend))
  graph = fn.get_concrete_function(tf.constant([2, 3])).graph
  tensors = down.last_stats_tensors
  assert tensors["steps"].graph is graph   # readable while the graph lives
  graph = weakref.ref(graph)
  del fn, tensors
  gc.collect()
  assert graph() is None
  assert down.last_stats_tensors is None
  np.testing.assert_array_equal(down(np.array([1]), backend=backend), [0])
  assert down.last_stats.steps >= 1


def test_stats_tensors_do_not_keep_a_traced_graph_alive_through_a_function():
  # A tf.function traced inside the caller's graph after the call (here a
  # module-level one, which outlives that graph) copies the graph's
  # collections: the statistics held there kept the graph alive for good.
  import gc
  import weakref
  @tab.batch
  def down(n):
    while n > 0:
      n = n - 1
    return n
  @tf.function
  def helper(x):
    return x + 1
  fn = tf.function(lambda n: helper(down(n, backend="pc:graph")))
  graph = weakref.ref(fn.get_concrete_function(tf.constant([2, 3])).graph)
  del fn
  gc.collect()
  assert graph() is None
  assert helper(tf.constant(1)).numpy() == 2


def _count_down(n):
  if n <= 0:
    return n
  return _count_down_batched(n - 1)


_count_down_batched = tab.batch(_count_down)


def test_stats_after_a_failed_call_are_none():
  # They used to be the previous successful call's.
  shallow = _count_down_batched
  shallow.max_stack_depth = 3
  shallow(np.array([1]), backend="local:eager")
  assert shallow.last_stats is not None
  with pytest.raises(tab.StackOverflowError):
    shallow(np.array([10]), backend="local:eager")
  assert shallow.last_stats is None


@pytest.mark.parametrize("backend", ["local:eager", "pc:graph"])
def test_a_changed_max_stack_depth_is_honoured(backend):
  # Runtimes were cached without it: a backend already used kept the old
  # bound.
  f = _count_down_batched
  f.max_stack_depth = 4
  f(np.array([2]), backend=backend)
  f.max_stack_depth = 20
  np.testing.assert_array_equal(f(np.array([10]), backend=backend), [0])


def test_a_dropped_batched_function_is_freed():
  # Module-level caches kept every batched function ever called, with its
  # traces (about 6 MB each): a factory of closures grew without bound.
  import gc
  import weakref

  def make(k):
    @tab.batch
    def shifted(x):
      if x > k:
        return x
      return shifted(x + k)
    return shifted

  refs = []
  for k in (1, 2):
    fn = make(k)
    for backend in ("local:eager", "pc:graph"):
      np.testing.assert_array_equal(fn(np.array([1, 5]), backend=backend),
                                    [1 + k, 5])
    refs.append(weakref.ref(fn))
    del fn
  gc.collect()
  assert [r() for r in refs] == [None, None]


_SCALE = np.array([1., 1.], np.float32)


@tab.batch
def _scaled(x):
  return x * tf.reduce_sum(_SCALE)


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_globals_and_arrays_are_read_once_at_conversion(backend):
  # The converted code read the live module: after a global was rebound,
  # the answer depended on the backend and on whether it traced again for
  # a batch size, and an array of another shape crashed inside TF.
  global _SCALE
  saved = _SCALE.copy()
  try:
    np.testing.assert_allclose(_scaled(np.array([1., 2.], np.float32),
                                       backend=backend), [2., 4.])
    _SCALE[:] = 5.          # in place
    _SCALE = np.ones([3], np.float32) * 7.   # rebound, another shape
    for x in (np.array([1., 2.], np.float32),
              np.array([1., 2., 3.], np.float32)):   # a new batch size too
      np.testing.assert_allclose(_scaled(x, backend=backend), 2. * x)
  finally:
    _SCALE = saved


def test_a_variable_is_read_afresh():
  scale = tf.Variable(1.)
  @tab.batch
  def scaled(x):
    return x * scale
  x = np.array([1., 2.], np.float32)
  for backend in ("local:eager", "pc:graph"):
    scale.assign(1.)
    np.testing.assert_allclose(scaled(x, backend=backend), x)
    scale.assign(3.)
    np.testing.assert_allclose(scaled(x, backend=backend), 3. * x)


_ROW_SCALES = tf.Variable([1., 2., 3.], shape=tf.TensorShape([None]))


@tab.batched_primitive
def _rows_of_its_own(x):
  return tf.zeros_like(_ROW_SCALES) + tf.reduce_mean(x)


@tab.batch
def _calls_rows_of_its_own(x):
  if x > 1.5:
    return _rows_of_its_own(x)
  return x


@pytest.mark.parametrize("backend", tab.BACKENDS)
def test_a_batched_primitive_returning_other_rows_is_an_error(backend):
  # Its rows were handed to the members as they came (2.5 for both
  # members, from a [3] result for 2 rows): an answer, no error.
  # Where XLA drops the assertion, the reshape to the rows fails.
  # Two members of a batch of 8: pc:xla gathers them into 2 rows. (Up to
  # `ALL_ROWS_UP_TO` rows it calls the primitive on every row, where a
  # result with as many rows as the batch cannot be told from a right one.)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="different number of rows|reshape"):
    _calls_rows_of_its_own(
        np.array([1., 2., 1., 1., 3., 1., 1., 1.], np.float32),
        backend=backend)


def test_run_functions_eagerly_warns_once():
  # tf.vectorized_map, run eagerly, warned on every block run: 240 lines
  # for three small calls.
  import logging

  class Count(logging.Handler):
    def __init__(self):
      super().__init__()
      self.messages = []

    def emit(self, record):
      self.messages.append(record.getMessage())

  count = Count()
  tf.get_logger().addHandler(count)
  tf.config.run_functions_eagerly(True)
  try:
    for backend in ("local:eager", "pc:graph"):
      np.testing.assert_array_equal(
          count_loop(np.array([3, 1], np.int32), backend=backend), [3, 0])
  finally:
    tf.config.run_functions_eagerly(False)
    tf.get_logger().removeHandler(count)
  warned = [m for m in count.messages if "tf.function behavior" in m]
  assert len(warned) <= 1


def test_a_parameter_named_backend_is_a_batch():
  # Adding `backend` to the call's signature made decorating it fail.
  @tab.batch
  def shifted(x, backend):
    return x + backend
  np.testing.assert_array_equal(
      shifted(np.array([1, 2]), np.array([10, 20])), [11, 22])


_SHADOWED = np.zeros([3])


def test_only_the_globals_a_function_reads_are_kept():
  # Every global whose name appeared (a parameter shadowing it included)
  # was copied, and the whole module's globals kept alive.
  import ast
  from tfp_autobatch.frontend import _source

  def reads_scale(_SHADOWED):
    return _SHADOWED * tf.reduce_sum(_SCALE)
  node, _ = _source.parse_function(reads_scale)
  _, scope = _source.frozen_scope(reads_scale, node)
  assert "_SCALE" in scope and "tf" in scope
  assert "_SHADOWED" not in scope and "np" not in scope
  assert isinstance(node, ast.FunctionDef)


def test_max_stack_depth_must_be_a_positive_int():
  def down(n):
    return n
  for bad in (2.5, "8", None, True):
    with pytest.raises(TypeError, match="max_stack_depth must be an int"):
      tab.batch(down, max_stack_depth=bad)
  with pytest.raises(ValueError, match=">= 1, got 0"):
    tab.batch(down, max_stack_depth=0)
  assert tab.batch(down, max_stack_depth=np.int64(8)).max_stack_depth == 8


class _Fib(tf.Module):

  def __init__(self, backend):
    super().__init__()
    self.backend = backend

  @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
  def __call__(self, n):
    return fib(n, backend=self.backend)


@pytest.mark.parametrize("backend", ["pc:graph", "pc:xla"])
def test_a_saved_model_runs_where_tfp_autobatch_is_not_imported(
    backend, tmp_path, fresh_python):
  # pc:xla's model failed to save: SavedModel traces each registered
  # gradient once, with no op, and the VM call's gradient read the op.
  tf.saved_model.save(_Fib(backend), str(tmp_path))
  script = ("import json, sys, tensorflow as tf\n"
            f"loaded = tf.saved_model.load({str(tmp_path)!r})\n"
            "with tf.GradientTape():   # a forward call under a tape\n"
            "  out = loaded(tf.constant([5, 7, 10]))\n"
            "print(json.dumps({'out': out.numpy().tolist(), "
            "'imported': 'tfp_autobatch' in sys.modules}))\n")
  assert fresh_python(script) == {"out": [5, 13, 55], "imported": False}


@tab.batch
def _affine(x, scale):
  return x * scale + 1.


def test_batches_passed_by_keyword_bind_as_in_python():
  x = np.array([1., 2.], np.float32)
  scale = np.array([3., 4.], np.float32)
  expected = [4., 9.]
  np.testing.assert_allclose(_affine(scale=scale, x=x), expected)
  np.testing.assert_allclose(_affine(x, scale=scale, backend="pc:graph"),
                             expected)
  with pytest.raises(TypeError, match="unexpected keyword argument 'y'"):
    _affine(x, y=scale)
  with pytest.raises(TypeError, match="multiple values for argument 'x'"):
    _affine(x, x=scale)
  with pytest.raises(TypeError, match="missing the batch argument 'scale'"):
    _affine(x=x)


def test_repeated_calls_of_one_shape_skip_the_checks_but_not_new_shapes(
    monkeypatch):
  # A loop calling a batched function on batches of one dtype and shape
  # checks and types them once; any other kind, dtype or shape is checked
  # and typed afresh, so its errors and result types stay right.
  from tfp_autobatch import api   # pylint: disable=import-outside-toplevel
  checked = []
  full = api._checked_and_typed   # pylint: disable=protected-access
  monkeypatch.setattr(api, "_checked_and_typed",
                      lambda fn, args: checked.append(1) or full(fn, args))

  @tab.batch
  def add(a, b):
    return a + b
  ints = np.array([1, 2, 3], np.int32)
  for _ in range(3):
    np.testing.assert_array_equal(add(ints, ints), [2, 4, 6])
  assert len(checked) == 1
  result = add(np.array([0.5, 1.0, 2.0]), np.array([1.0, 1.0, 1.0]))
  assert result.dtype == tf.float64 and len(checked) == 2
  np.testing.assert_array_equal(add(tf.constant(ints), tf.constant(ints)),
                                [2, 4, 6])
  assert len(checked) == 3
  with pytest.raises(ValueError, match="different batch sizes"):
    add(ints, np.ones([2], np.int32))
  with pytest.raises(TypeError, match="Python list"):
    add(ints, [1, 2, 3])
  with pytest.raises(ValueError, match="leading batch dimension"):
    add(np.zeros([], np.int32), ints)
