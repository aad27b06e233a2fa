"""Checks that the user's target runs as the batched NUTS program calls
it: on any number of chains, each chain's log density from its own state,
or on all of them where it has parameters per chain (`chain_parameters`),
and, for `pc:xla`, compiled by XLA with the rest of the step
(`check_target_compiles`). Each turns what would fail deep in
the VM, or give wrong answers, into an error about the target."""
import re

import tensorflow as tf

from nuts import shared_programs

__all__ = ["chain_parameters", "start_values", "check_target_compiles",
           "unsupported_operations_error"]


# Why a target called on all the chains at once needs their number.
_CHAIN_COUNT_UNKNOWN = (
    "and the number of chains is unknown where the kernel is traced: this "
    "kernel calls such a target on all the chains at once, which needs "
    "their number. Give your tf.function's state a static chain shape")


def chain_parameters(target, parts, structure, chain_rank):
  """Whether the target must be called on all the chains at once: it has
  parameters per chain (given one chain it returns more than one value:
  a parameter with a chain dimension broadcasts the chain to it), or it
  fails on one chain (a tf.function whose input_signature fixes the
  number of chains). The batched program then calls it on every chain,
  in the chains' order, as tfp.mcmc.NoUTurnSampler does, and not on the
  chains still running alone, which would hand each chain another
  chain's parameters (see `shared_programs`). Either needs the number of
  chains where the kernel is traced, else a ValueError. Where the one
  chain's result has a shape known only when the graph runs, says False
  and adds a graph assertion that it has one value (none under XLA)."""
  if not chain_rank:
    return False
  # With no chains (a batch of size 0, which sample_chain runs as
  # tfp.mcmc.NoUTurnSampler does) there is no chain to call it on: given
  # the empty batch, the target rightly returns no value.
  num_chains = parts[0].shape[:chain_rank].num_elements()
  if num_chains == 0:
    return False
  one = [tf.reshape(p, tf.concat([[-1], tf.shape(p)[chain_rank:]], 0))[:1]
         for p in parts]
  try:
    logp_one = shared_programs.call_target(target, one, structure)
  except (TypeError, ValueError, tf.errors.InvalidArgumentError) as e:
    # E.g. a tf.function whose input_signature fixes the chain count.
    if num_chains is None:
      raise ValueError(
          "target_log_prob_fn failed on one chain's state (shapes "
          f"{[x.shape.as_list() for x in one]}), {_CHAIN_COUNT_UNKNOWN}, "
          "or let the target take any number of chains (a tf.function "
          "input_signature leaving the chain dimension None). It raised: "
          f"{e}") from e
    return True
  # [] is a squeezed [1]: a target ending in `tf.squeeze`, as TFP's
  # examples write, is alike on one chain (the program reshapes each call's
  # log density to its rows); a target with a parameter per chain
  # broadcasts it to more values than one.
  if logp_one.shape in ([1], []):
    return False
  if logp_one.shape.is_fully_defined() and (num_chains is not None
                                            or logp_one.shape != [0]):
    if num_chains is None:
      raise ValueError(
          "target_log_prob_fn has parameters per chain or takes a fixed "
          "number of chains (given one chain it returned shape "
          f"{logp_one.shape.as_list()}), {_CHAIN_COUNT_UNKNOWN}")
    return True
  tf.debugging.assert_equal(
      tf.size(logp_one),
      tf.minimum(tf.reduce_prod(tf.shape(parts[0])[:chain_rank]), 1),
      message="target_log_prob_fn returned more than one value given one "
      "chain, a shape known only when the graph runs: a target with "
      "parameters per chain needs shapes known where the kernel is traced")
  return False


def start_values(target, parts, structure):
  """`(log density, gradients, chain parameters)` of the chains' starting
  state, with `chain_parameters`' answer from the same trace of the
  target where it can: for one static chain dimension the target is
  called on the chains and a copy of the first chain, and a result with
  one value per row (chains + 1) says the target has no parameters per
  chain (one would not broadcast to a chain more), where asking
  `chain_parameters` traces the target once more (seconds on some
  Inference Gym models). Otherwise (in a replica of a distribution
  strategy, or that call fails, returns another shape, or computes on the
  state with a tensor of a shape known only when the graph runs, where a
  mismatch shows only then), the target is called on the chains
  alone and the third value is None: ask `chain_parameters`."""
  n = parts[0].shape[:1].num_elements() if parts[0].shape.rank else None
  # Not in a replica of a tf.distribute strategy: a target that reduces
  # across replicas would reach their barrier once more on some replicas
  # than on others, and they would wait for each other for ever.
  in_replica = (tf.distribute.has_strategy()
                and not tf.distribute.in_cross_replica_context())
  if (n and not in_replica
      and all(p.shape.rank and p.shape[0] == n for p in parts)):
    with_copy = [tf.concat([p, p[:1]], 0) for p in parts]
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    made_before = 0 if graph is None else len(graph.get_operations())
    try:
      with tf.GradientTape() as tape:
        tape.watch(with_copy)
        logp = shared_programs.call_target(target, with_copy, structure)
      checked = _broadcasts_checked(graph, made_before, with_copy)
      grads = shared_programs.gradients(tape, logp, with_copy)
    except (TypeError, ValueError, NotImplementedError,
            tf.errors.InvalidArgumentError):
      # E.g. a parameter per chain, or a fixed number of chains, failing
      # as the target's code fails on unmatched shapes: the call on the
      # chains alone below raises whatever is the target's own error.
      pass
    else:
      if logp.shape == [n + 1] and checked:
        return logp[:n], [g[:n] for g in grads], False
  logp, grads = shared_programs.value_and_grads(target, parts, structure)
  return logp, grads, None


def _broadcasts_checked(graph, made_before, state):
  """Whether the trace itself checked that the target's operations on the
  `state` tensors broadcast (eagerly, with no graph, it did): every input
  of every operation made in `graph` after its first `made_before` that
  depends on the state has a static shape. A dimension known only when
  the graph runs is taken to broadcast when traced, and fails when run."""
  if graph is None:
    return True
  on_state = {id(t) for t in state}
  for op in graph.get_operations()[made_before:]:
    if any(id(t) in on_state for t in op.inputs):
      if not all(t.shape.is_fully_defined() for t in op.inputs):
        return False
      on_state.update(id(t) for t in op.outputs)
  return True


def check_target_compiles(target, parts, structure, chain_ndims, layout,
                          checked):
  """Raises a ValueError if XLA cannot compile the target's log density
  and gradient as pc:xla runs them, where the number of chains is unknown
  when the step is traced. pc:xla compiles every step, the target with
  it, even in a plain tf.function or eagerly, where
  tfp.mcmc.NoUTurnSampler compiles nothing. It traces the target for
  each number of chains it calls it on (the gathered buckets, see
  `tfp_autobatch.runtime.batched_primitive_calls`), and once for any
  number when the chain count is unknown where the step is traced. There
  a target whose gradient needs, as a constant, a shape that depends on
  the number of chains (tfb.CorrelationCholesky's) fails, with XLA's
  error about the VM's blocks, thousands of lines long. Checked once per
  state layout by tracing the target alone, as the VM traces it, and
  lowering it to HLO; other failures (a target that captures the
  caller's graph tensors cannot be lowered alone) are left to the step
  itself. With the chain count known the step's own trace is looked
  through instead, for operations XLA lacks (`tab.XlaUnsupportedError`,
  which `unsupported_operations_error` turns into this error): a trace
  of the target less in the first call (seconds for some Inference Gym
  models). `checked`: what was checked (state layouts, dtypes), to which
  this adds. `parts`, `structure`, `chain_ndims` and `layout` are the
  state's, as `chain_states.layout` gives them with the target's chain
  parameters."""
  if layout[3] is not None or parts[0].shape[:chain_ndims].is_fully_defined():
    return
  key = (layout, parts[0].dtype)
  if key in checked:
    return
  specs = [tf.TensorSpec([None] + p.shape[chain_ndims:].as_list(), p.dtype)
           for p in parts]
  lowered = [tf.TensorSpec([1] + s.shape[1:].as_list(), s.dtype)
             for s in specs]
  as_traced = tf.function(
      lambda *xs: shared_programs.value_and_grads(target, list(xs), structure),
      input_signature=specs, autograph=False)
  compiled = tf.function(lambda *xs: as_traced(*xs), jit_compile=True,
                         autograph=False)
  try:
    # Traced here (init_scope pauses gradient tapes), lowered outside the
    # caller's graph: given specs, the lowering makes inputs with random
    # ops, which would otherwise run at every step.
    compiled.get_concrete_function(*lowered)
    with tf.init_scope():
      compiled.experimental_get_compiler_ir(*lowered)(stage="hlo")
  except Exception as e:  # pylint: disable=broad-except
    message = str(e)
    if "Detected unsupported operations" in message:
      raise _uses_operations_xla_lacks(
          re.findall(r"(\w+) \(No registered '", message)) from e
    if "Reading input as constant from a dynamic tensor" in message:
      raise _not_compilable(
          "needs, for its log density or gradient, a shape that depends "
          "on the number of chains as a constant, which XLA cannot have "
          "where the number of chains is unknown when the step is traced "
          "(give your tf.function's state a static chain count)") from e
  checked.add(key)


def unsupported_operations_error(error):
  """The ValueError for `error`, a `tab.XlaUnsupportedError` from the
  step's trace, if every operation it names was made by the target; else
  None."""
  if not error.ops or not all(_made_by_target(op) for op in error.ops):
    return None
  return _uses_operations_xla_lacks(op.type for op in error.ops)


def _made_by_target(op):
  """Whether `op` was made in a call of the target (its trace passes
  through `shared_programs.call_target`)."""
  code = shared_programs.call_target.__code__
  return any(frame.filename == code.co_filename and frame.name == code.co_name
             for frame in op.traceback)


def _uses_operations_xla_lacks(op_types):
  """The ValueError for a target with operations of `op_types`, which XLA
  has no kernel for (none named: XLA's message is chained below)."""
  return _not_compilable(
      "uses operations that XLA cannot compile "
      f"({', '.join(sorted(set(op_types))) or 'see the error below'})")


def _not_compilable(what):
  return ValueError(
      f"target_log_prob_fn {what}. backend='pc:xla', the default, "
      "compiles every NUTS step with XLA, the target with it, even "
      "where your tf.function does not ask for jit_compile "
      "(tfp.mcmc.NoUTurnSampler does not): pass backend='pc:graph', "
      "or write the target with operations XLA has")
