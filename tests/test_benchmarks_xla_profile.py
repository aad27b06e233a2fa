"""benchmarks.xla_profile: the matrix products' operations that the
profiling programs (`benchmarks.nuts_profile`, `benchmarks.neural_profile`)
report beside their kernels."""
import tensorflow as tf

from benchmarks import xla_profile


def _optimized_module(fn, *args):
  serialized = tf.function(fn, jit_compile=True).experimental_get_compiler_ir(
      *args)(stage="optimized_hlo_serialized")
  module = xla_profile.hlo_pb2.HloModuleProto()   # its one import of XLA's protos
  module.ParseFromString(serialized)
  return module


def test_product_float_ops_counts_each_dot_and_nothing_else():
  """Two a multiply-add, whatever the dot's contracting dimensions; no
  operations for the elementwise and reduction kernels."""
  def fn(x, w, v):
    return (tf.nn.relu(tf.matmul(x, w)) + 1.0,
            tf.matmul(x, v, transpose_b=True), tf.reduce_sum(x))
  module = _optimized_module(fn, tf.ones([8, 16]), tf.ones([16, 32]),
                             tf.ones([24, 16]))
  index = xla_profile.HloIndex(module, ("vm_block_",))
  by_opcode = {}
  for name, (ins, _) in index.instructions.items():
    by_opcode.setdefault(ins.opcode, []).append(
        index.product_float_ops(name))
  assert sorted(by_opcode["dot"]) == [2 * 8 * 24 * 16, 2 * 8 * 32 * 16]
  assert not any(ops for opcode, found in by_opcode.items()
                 if opcode != "dot" for ops in found)


def test_matrix_products_sums_operations_and_time_of_product_kernels():
  kernels = [
      {"product_float_ops_per_call": 4e9, "calls_per_step": 2.0,
       "us_per_step": 100e3},
      {"product_float_ops_per_call": 1e9, "calls_per_step": 1.0,
       "us_per_step": 50e3},
      {"product_float_ops_per_call": 0, "calls_per_step": 10.0,
       "us_per_step": 500e3},
  ]
  products = xla_profile.matrix_products(kernels, "step")
  assert products["gflop_per_step"] == 9.0
  assert products["us_per_step"] == 150e3
  assert products["gflop_per_s"] == 60.0
  assert xla_profile.matrix_products(kernels[2:], "step")[
      "gflop_per_s"] is None


def test_report_states_the_products_when_there_are_any():
  def kernel(name, ops, us):
    return {"name": name, "place": "backward loop", "hlo": "dot f32[2, 2]",
            "calls_per_step": 1.0, "us_per_step": us, "us_per_call": us,
            "product_float_ops_per_call": ops}
  kernels = [kernel("MatMul.1", 2e9, 40e3), kernel("copy.1", 0, 10e3)]
  def record(kernels):
    return {"places": xla_profile.by_place(kernels, {}, per="step"),
            "kernels": kernels,
            "matrix_products": xla_profile.matrix_products(kernels, "step")}
  text = xla_profile.report("summary", record(kernels), 5, per="step")
  assert text.splitlines()[:2] == [
      "summary", "matrix products: 2.00 GFLOP a step, 40.0 ms of kernels, "
      "50.0 GFLOP/s"]
  no_products = xla_profile.report("summary", record(kernels[1:]), 5,
                                  per="step")
  assert "matrix products" not in no_products
