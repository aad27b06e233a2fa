"""The batched NUTS program of a target, built once and shared by kernels.

    nuts_program(target, layout, settings) -> (nuts_steps, logp_and_grad)

`nuts_steps` is `tree.make_program` over `logp_and_grad`, a
`@tab.batched_primitive` that calls the target on a batch of flat chain
states. It depends on the target, the state layout (the per-chain shapes of
the state parts, and whether the state is a list) and the tree settings
(`NoUTurnSampler._tree_settings()`) alone: the step size, the seed and the
backend are arguments of each call, and the dtype is the call's. Kernels
that agree on all three therefore run one program, whose conversion, traced
VMs and XLA compilations are made once: a notebook cell that builds
`NoUTurnSampler(target, ...)` again, a driver that builds a kernel per
stage, a `tf.function` that builds one per trace.

The target is the same object (identity, not equality). The cache holds it
weakly: each program's closure reaches its target through a weak reference,
so the cache keeps neither the target nor what it captures alive, and when
the target is freed its programs are dropped. A kernel holds its target and
its programs, so a program is kept as long as a kernel that runs it or its
target lives. A target that cannot be weakly referenced (a
`method_descriptor` such as `str.upper`, an object of a class whose
`__slots__` leave out `__weakref__`) is not shared: each call builds it a
program of its own, which holds it strongly. A Python method bound to an
object is a new object at each attribute access: kernels built from
`model.log_prob` twice share, as the same function bound to the same
object (the cache holds that object weakly, and the program binds the
function to it afresh at each trace).
"""
import collections
import functools
import types
import weakref

import numpy as np
import tensorflow as tf

import tfp_autobatch as tab
from nuts import momentum
from nuts import tree

__all__ = ["nuts_program", "shared_value", "call_target", "value_and_grads",
           "gradients", "chain_index_column"]

_Shared = collections.namedtuple("_Shared", [
    "target_ref",   # weakref.ref to the target (a method's: its object)
    "values",       # key -> what `shared_value` made: ("program", layout,
                    # settings) -> (nuts_steps, logp_and_grad), and the
                    # kernel's shared compiled step and XLA checks
])

# (id(target), None) or, for a bound method, (id(its object), its function)
# -> _Shared, for the targets alive (an entry is removed by its weak
# reference's callback when the target, or the method's object, is freed).
_SHARED = {}


def call_target(target, parts, structure):
  """The target's log density of the state parts, packed into the state's
  `StateStructure` (the only place the target is called: the kernel tells
  the user's errors by this frame)."""
  return structure.call(target, parts)


def value_and_grads(target, parts, structure):
  """`(log density, [gradient per part])`, gradients from a tape."""
  with tf.GradientTape() as tape:
    tape.watch(parts)
    logp = call_target(target, parts, structure)
  return logp, gradients(tape, logp, parts)


def gradients(tape, logp, parts):
  """The gradients of `logp` for `parts` from `tape`, which watched them
  through the target's call; a ValueError for a part it does not depend
  on."""
  grads = tape.gradient(logp, parts)
  for i, g in enumerate(grads):
    if g is None:
      raise ValueError(
          "Encountered `None` gradient: target_log_prob_fn's log density "
          f"does not depend on state part {i} differentiably (it is not "
          "used, or behind tf.stop_gradient or an integer cast); every "
          "state part must enter the log density")
  return grads


def nuts_program(target, layout, settings):
  """The batched NUTS program for `target` on states of `layout`, built
  with the tree settings `settings` (`tree.make_program`'s arguments after
  the gradient): the one built before for this very target, layout and
  settings, if any."""
  return shared_value(
      target, ("program", layout, tuple(settings)),
      lambda call: _build(call, layout, settings))


def shared_value(target, key, make):
  """What `make(call)` returned for `target` under `key` the first time
  it was asked for, made then. `call()` returns the target, or None once
  it is freed: the value must reach the target through `call` alone, or
  hold it. A target that cannot be weakly referenced shares nothing: its
  value is made anew, with a `call` that holds it."""
  owner, function = _owner_and_method(target)
  try:
    shared = _shared(owner, function)
  except TypeError:   # cannot be weakly referenced: not shared
    return make(lambda: target)
  if key not in shared.values:
    if function is None:
      call = shared.target_ref
    else:   # the method bound afresh to its object, which is held weakly
      call = functools.partial(_bound, shared.target_ref, function)
    shared.values[key] = make(call)
  return shared.values[key]


def _owner_and_method(target):
  """`(object, function)` for a Python method bound to an object, whose
  every attribute access (`model.log_prob`) makes a new method object:
  two such are the same target if they bind one function to one object.
  `(target, None)` for any other target, the same only as itself."""
  if isinstance(target, types.MethodType):
    return target.__self__, target.__func__
  return target, None


def _bound(owner_ref, function):
  """`function` bound to the object `owner_ref` refers to, or None once
  that object is freed (see `_alive`)."""
  owner = owner_ref()
  return None if owner is None else types.MethodType(function, owner)


def _shared(owner, function=None):
  """The cache entry of the target `owner` (or of the method `function`
  bound to the object `owner`), made if it has none. (An id is looked up,
  and the entry's object compared: ids are reused once objects die.)"""
  key = (id(owner), function)
  shared = _SHARED.get(key)
  if shared is None or shared.target_ref() is not owner:
    ref = weakref.ref(owner, functools.partial(_forget, key))
    shared = _SHARED[key] = _Shared(ref, {})
  return shared


def _forget(key, ref, entries=_SHARED):
  """The weak reference's callback: its target died; drop its programs.
  (`entries` is bound here: at interpreter exit the module's globals are
  cleared before the last targets die.)"""
  shared = entries.get(key)
  if shared is not None and shared.target_ref is ref:
    del entries[key]


def chain_index_column(num_chains, dtype):
  """`[num_chains, 1]`: each chain's index plus one, the coordinate the
  program carries for a target with parameters per chain (see `_build`)."""
  return tf.cast(tf.range(1, num_chains + 1), dtype)[:, tf.newaxis]


def _build(target_ref, layout, settings):
  """A new program, whose gradient calls `target_ref()`. For a dense
  metric (`nuts/momentum.py`) the program's state is y then the d*d
  entries of L, and the target is called at q = L y, its gradient
  returned for y (L^T times q's) and as zeros for L.

  A target with parameters per chain (the layout's chain shape) must get
  each chain's state at that chain's place, where the program calls the
  gradient on whichever chains reach a leaf together. The state then ends
  in one more coordinate, the chain's index plus one
  (`chain_index_column`), which never moves (its step is 0), and each
  call puts its rows at their chains' places in the whole chain shape,
  calls the target on every chain, as tfp.mcmc.NoUTurnSampler does, and
  takes its rows back. The other places hold the call's first row (a
  state the target takes). A row whose index is not a chain's (a VM
  register never written, zeros: hence the plus one) goes nowhere."""
  event_shapes, structure, metric, chain_shape = layout
  sizes = [int(np.prod(s)) for s in event_shapes]
  dim = sum(sizes)

  def target_at(flat_q):
    parts = [tf.reshape(x, [-1] + list(s)) for x, s in
             zip(tf.split(flat_q, sizes, axis=-1), event_shapes)]
    logp, grads = value_and_grads(_alive(target_ref), parts, structure)
    flat_g = tf.concat([tf.reshape(g, [-1, k]) for g, k in
                        zip(grads, sizes)], axis=-1)
    return tf.reshape(logp, [-1]), flat_g

  def target_at_chains(flat_q, index):
    num_chains = int(np.prod(chain_shape))
    chain = tf.cast(tf.round(index), tf.int32) - 1
    # Rows that are no chain's go to one more place, dropped after.
    chain = tf.where((chain >= 0) & (chain < num_chains), chain, num_chains)
    first = tf.concat([flat_q, tf.zeros([1, dim], flat_q.dtype)], 0)[:1]
    whole = tf.tensor_scatter_nd_update(
        tf.tile(first, [num_chains + 1, 1]), chain[:, tf.newaxis], flat_q)
    parts = [tf.reshape(x, list(chain_shape) + list(s)) for x, s in
             zip(tf.split(whole[:num_chains], sizes, axis=-1), event_shapes)]
    logp, grads = value_and_grads(_alive(target_ref), parts, structure)
    logp = tf.concat([tf.reshape(logp, [num_chains]),
                      tf.zeros([1], logp.dtype)], 0)
    flat_g = tf.concat([tf.reshape(g, [num_chains, k]) for g, k in
                        zip(grads, sizes)], axis=-1)
    flat_g = tf.concat([flat_g, tf.zeros([1, dim], flat_g.dtype)], 0)
    return tf.gather(logp, chain), tf.gather(flat_g, chain)

  def on_metric(flat_q, call):
    """`call`'s log density and gradient at the program's state."""
    if metric == momentum.DENSE:
      y, factor = flat_q[:, :dim], flat_q[:, dim:]
      lower = tf.reshape(factor, [-1, dim, dim])
      logp, g_q = call(tf.linalg.matvec(lower, y))
      return logp, tf.concat([tf.linalg.matvec(lower, g_q, adjoint_a=True),
                              tf.zeros_like(factor)], axis=-1)
    return call(flat_q)

  # Its log density and gradient have the state's dtype (the kernel
  # checks the target's; `NoUTurnSampler.bootstrap_results`), so type
  # inference need not trace the target for them: a trace less in a
  # first call, seconds for some Inference Gym models.
  @tab.batched_primitive(output_signature=lambda flat_q: (
      tf.TensorSpec([None], flat_q.dtype), flat_q))
  def logp_and_grad(flat_q):
    single = flat_q.shape.rank == 1   # run_unbatched passes one chain
    if single:
      flat_q = flat_q[tf.newaxis]
    if chain_shape is None:
      logp, flat_g = on_metric(flat_q, target_at)
    else:
      index = flat_q[:, -1]
      logp, flat_g = on_metric(flat_q[:, :-1],
                               lambda q: target_at_chains(q, index))
      flat_g = tf.pad(flat_g, [[0, 0], [0, 1]])
    if single:
      return logp[0], flat_g[0]
    return logp, flat_g

  return tree.make_program(logp_and_grad, *settings), logp_and_grad


def _alive(target_ref):
  target = target_ref()
  if target is None:
    # Only a program kept apart from every kernel and from its target, then
    # traced again (a new dtype, backend or batch size), gets here.
    raise RuntimeError(
        "the target_log_prob_fn of this NUTS program was freed; run the "
        "program through a nuts.NoUTurnSampler, which keeps its target")
  return target
