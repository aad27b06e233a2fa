"""Chain states and step sizes as `NoUTurnSampler` takes them: their
parts, the layout the NUTS program is built for, and the checks that
turn a state, log density or step size NUTS cannot use into a clear
error."""
import numpy as np
import tensorflow as tf

from nuts import state_structure

__all__ = ["as_parts", "with_static_shapes", "layout", "check_chain_rank", "check_log_density", "check_finite_start",
           "broadcast_step_size", "check_step_size"]


as_parts = state_structure.as_parts


def layout(parts, structure, kernel_results, metric=None,
           chain_parameters=False):
  """`(chain_ndims, layout)`: the chain dimensions (the rank of the
  results' `target_log_prob`) and the state layout the NUTS program is
  built for (per-chain part shapes, the state's `StateStructure`, the
  metric kind the program is built for: None for a diagonal one, which
  is a step size per coordinate, or "dense", see `nuts/momentum.py`, and
  None or, for a target with parameters per chain, the chain shape, on
  which the program calls it whole; see `shared_programs`)."""
  chain_ndims = check_chain_rank(kernel_results.target_log_prob)

  dtype = parts[0].dtype
  for p in parts:
    if p.dtype != dtype:
      raise TypeError("all state parts must share one float dtype, got "
                      f"{[q.dtype.name for q in parts]}")
  for i, p in enumerate(parts):
    if p.shape.rank is None or None in p.shape[chain_ndims:].as_list():
      raise ValueError(
          f"state part {i} has shape {p.shape}: its dimensions after the "
          f"{chain_ndims} chain dimension(s) (the per-chain event shape) "
          "must be known when the kernel is traced (the NUTS program is "
          "built for one event shape); give your tf.function's "
          "input_signature those dimensions, e.g. [None, 3]")
  event_shapes = tuple(tuple(int(d) for d in p.shape[chain_ndims:])
                       for p in parts)
  chain_shape = (tuple(int(d) for d in parts[0].shape[:chain_ndims])
                 if chain_parameters else None)
  return chain_ndims, (event_shapes, structure, metric, chain_shape)


def with_static_shapes(state, grads=None):
  """`state` with each part given the static shape it is known to have
  when run, where its own is unknown where traced: that of its gradient in
  `grads` (the kernel results' `grads_target_log_prob`, of the state's
  shape), else, for a `tf.compat.v1.placeholder_with_default` of unknown
  shape, its default's. The NUTS program is built for one event shape, as
  TFP's kernel needs none: this lets a state fed as in TFP's tests (a
  placeholder with a default, `shape=None`) run at the default's shape,
  checked when the graph runs (`tf.ensure_shape`: feeding another shape
  is an error there). `state` itself where nothing is learnt."""
  parts, structure = as_parts(state)
  if grads is not None and not isinstance(grads, (list, tuple)):
    grads = [grads]
  known = []
  for i, part in enumerate(parts):
    shape = part.shape
    if grads is not None and shape.is_compatible_with(grads[i].shape):
      shape = shape.merge_with(grads[i].shape)
    if not shape.is_fully_defined() and _placeholder_default(part) is not None:
      default = _placeholder_default(part).shape
      if shape.is_compatible_with(default):
        shape = shape.merge_with(default)
    known.append(part if shape == part.shape
                 else tf.ensure_shape(part, shape))
  if all(k is p for k, p in zip(known, parts)):
    return state
  return structure.pack(known)


def _placeholder_default(part):
  """The default of a `tf.compat.v1.placeholder_with_default` (through
  identities), or None for any other tensor."""
  op = getattr(part, "op", None) if not tf.executing_eagerly() else None
  while op is not None and op.type == "Identity":
    op = op.inputs[0].op
  if op is not None and op.type == "PlaceholderWithDefault":
    return op.inputs[0]
  return None


def check_chain_rank(logp):
  """The number of chain dimensions, the rank of the log density; raises
  a ValueError saying what to do where it is unknown."""
  if logp.shape.rank is None:
    raise ValueError(
        "the rank of target_log_prob_fn's result, the number of chain "
        "dimensions, is unknown where the kernel is traced (a state of "
        "unknown shape, such as tf.compat.v1.placeholder_with_default(x, "
        "shape=None)): the NUTS program is built for the per-chain shapes "
        "of the state; give the state its rank and event shape, e.g. "
        "placeholder_with_default(x, shape=[None, 3])")
  return logp.shape.rank


def check_log_density(logp, parts):
  """Raises a clear error for a log density NUTS cannot use: not one value
  per chain (its shape not a prefix of every part's), or of another dtype
  than the state (the energies are computed in the state's)."""
  if logp.dtype != parts[0].dtype:
    raise TypeError(
        f"target_log_prob_fn returns {logp.dtype.name} for a "
        f"{parts[0].dtype.name} state; NUTS computes its energies in the "
        "state's dtype: cast the log density to it, or start from a "
        f"{logp.dtype.name} state")
  for i, p in enumerate(parts):
    if (logp.shape.rank is not None and p.shape.rank is not None and
        (p.shape.rank < logp.shape.rank or
         not p.shape[:logp.shape.rank].is_compatible_with(logp.shape))):
      raise ValueError(
          f"target_log_prob_fn returns shape {logp.shape} for state part "
          f"{i} of shape {p.shape}: it must return one value per chain, "
          "the state's leading (chain) dimensions, summing over each "
          "part's event dimensions (e.g. tf.reduce_sum(..., -1) without "
          "keepdims)")


def check_finite_start(logp):
  """`logp`, checked: raises if the initial log-probability is NaN or -inf
  at any chain, naming the chains: eagerly a ValueError; traced, a graph
  assertion (InvalidArgumentError when it runs), which XLA drops under
  `jit_compile=True`, where nothing can raise. The returned log density
  depends on the assertion, so that it runs in a `tf.compat.v1` graph too,
  where nothing runs an op that no fetched tensor needs.

  Traced, the check reads the log density through a loop that never
  runs. XLA drops the assertion, but compiling it, TensorFlow first tries
  to evaluate what the assertion's guard and its indices depend on as
  compile-time constants: the whole target, on the host, in XLA's slow
  evaluator (costly for a model with a large data matrix, at every
  compilation of a bootstrap). A loop's results stop that evaluation, and
  XLA deletes a loop that runs zero times."""
  if not tf.executing_eagerly():
    # Flat, so that a log density of unknown rank (a state fed through
    # `placeholder_with_default` without a shape) is checked too.
    flat = tf.while_loop(lambda _: False, lambda x: x,
                         [tf.reshape(logp, [-1])])[0]
    finite = tf.math.is_finite(flat)
    check = tf.debugging.Assert(
        tf.reduce_all(finite),
        ["target_log_prob_fn is not finite at the initial state of the "
         "chains with these (flat) indices; start them inside the support:",
         tf.where(~finite), "values:",
         tf.boolean_mask(flat, ~finite)],
        summarize=10, name="check_finite_start")
    with tf.control_dependencies([check]):
      return tf.identity(logp)
  bad = ~np.isfinite(np.asarray(logp))
  if bad.any():
    chains = [tuple(int(i) for i in idx) if len(idx) != 1 else int(idx[0])
              for idx in np.argwhere(bad)]
    values = np.asarray(logp)[bad]
    raise ValueError(
        "target_log_prob_fn is not finite at the initial state of chain(s) "
        f"{chains[:10]}{' ...' if len(chains) > 10 else ''} (values "
        f"{values[:10].tolist()}); start those chains inside the support")
  return logp


def _step_parts(step_size, num_parts):
  if isinstance(step_size, (list, tuple)):
    if len(step_size) == 1:   # one for every part, as tfp.mcmc's kernels
      return list(step_size) * num_parts
    if len(step_size) != num_parts:
      raise ValueError(f"got {len(step_size)} step sizes for a state of "
                       f"{num_parts} parts")
    return list(step_size)
  return [step_size] * num_parts


def broadcast_step_size(step_size, parts, chain_ndims):
  """Step size per state part, broadcast to the part's full shape."""
  out = []
  for i, (s, p) in enumerate(zip(_step_parts(step_size, len(parts)), parts)):
    if isinstance(s, tf.Tensor) and s.dtype.is_floating and s.dtype != p.dtype:
      raise TypeError(f"step size for state part {i} has dtype "
                      f"{s.dtype.name}, the state {p.dtype.name}")
    s = tf.convert_to_tensor(s, p.dtype)
    if not _broadcastable(s.shape, p.shape):
      per_chain = (["chains"] * chain_ndims
                   + [1] * (p.shape.rank - chain_ndims))
      raise ValueError(
          f"step size of shape {s.shape} does not broadcast to state part "
          f"{i} of shape {p.shape}; use a scalar, one per part, or a shape "
          "that broadcasts to the part from the right, as tfp.mcmc's "
          f"kernels take it (per chain: [{', '.join(map(str, per_chain))}])")
    out.append(tf.broadcast_to(s, tf.shape(p)))
  return out


def _broadcastable(small, big):
  if small.rank is None or big.rank is None:
    return True
  if small.rank > big.rank:
    return False
  for a, b in zip(reversed(small.as_list()), reversed(big.as_list())):
    if a not in (1, None) and b is not None and a != b:
      return False
  return True


def check_step_size(step_size, parts, chain_ndims):
  for s in tf.nest.flatten(step_size):
    dtype = getattr(s, "dtype", None)
    if dtype is not None and not tf.as_dtype(dtype).is_floating:
      raise TypeError(f"step size must be floating point, got {dtype}")
    value = tf.get_static_value(s)   # None when known only at run time
    if value is not None and not np.all(np.asarray(value) > 0):
      raise ValueError(f"step sizes must be positive, got {value!r}")
  broadcast_step_size(step_size, parts, chain_ndims)
