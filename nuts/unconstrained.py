"""A pinned `JointDistribution` as NUTS samples it: flat unconstrained parts.

`windowed_adaptive_nuts` runs the kernel on a list of state parts, one per
free variable of the pinned model, each mapped to the real line by the
model's default event-space bijector and reshaped to `[chains..., size]`.
A flat list keeps the kernel's state one simple structure whatever the
model's (dict, namedtuple, nested), and gives every part one event
dimension, so that a diagonal mass matrix and per-part step sizes are
vectors that broadcast the same way for every part.
"""
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

tfb = tfp.bijectors
tfd = tfp.distributions

__all__ = ["UnconstrainedModel", "pin"]


def pin(joint_dist, pins):
  """`joint_dist` conditioned on `pins`; without pins the model itself
  (pinned already, or with no observed variables), as TFP's sampler takes
  it."""
  if not isinstance(joint_dist, tfd.JointDistribution) and not hasattr(
      joint_dist, "experimental_default_event_space_bijector"):
    raise TypeError(
        "windowed_adaptive_nuts needs a tfd.JointDistribution (or one "
        f"pinned with experimental_pin), got {type(joint_dist).__name__}")
  if pins:
    return joint_dist.experimental_pin(**pins)
  return joint_dist


class UnconstrainedModel:
  """The pinned model's free variables as flat unconstrained parts.

  Attributes:
    pinned: the pinned joint distribution.
    bijector: a `tfb.Bijector` whose forward maps a state in the model's
      structure (constrained) to the list of flat unconstrained parts, and
      whose inverse maps such parts back (what TFP's `trace_fn` receives).
    sizes: the number of unconstrained coordinates of each part.
    dtype: the parts' float dtype.
  """

  def __init__(self, pinned):
    self.pinned = pinned
    self.structure = pinned.dtype
    leaves = tf.nest.flatten(self.structure)
    if len({tf.as_dtype(d) for d in leaves}) != 1:
      raise TypeError("windowed_adaptive_nuts samples the free variables "
                      "in one float dtype; the model's are "
                      f"{[tf.as_dtype(d).name for d in leaves]}")
    self.dtype = tf.as_dtype(leaves[0])
    if not self.dtype.is_floating:
      raise TypeError("NUTS needs real-valued free variables; the model's "
                      f"are {self.dtype.name}: pin the discrete ones")
    constraining = pinned.experimental_default_event_space_bijector()
    event_shapes = [tf.TensorShape(s) for s in _shapes(
        constraining.inverse_event_shape(pinned.event_shape), len(leaves))]
    for s in event_shapes:
      if not s.is_fully_defined():
        raise ValueError("windowed_adaptive_nuts needs the model's event "
                         f"shapes known when it is traced, got {s}")
    self.event_shapes = event_shapes
    self.sizes = [int(np.prod(s.as_list())) for s in event_shapes]
    indices = tf.nest.pack_sequence_as(self.structure, list(range(
        len(leaves))))
    self.bijector = tfb.Chain([
        tfb.JointMap([tfb.Reshape([k], s.as_list())
                      for k, s in zip(self.sizes, event_shapes)]),
        tfb.Restructure(list(range(len(leaves))), indices),
        tfb.Invert(constraining),
    ])

  @property
  def num_parts(self):
    return len(self.sizes)

  def target_log_prob(self, *parts):
    """The pinned model's unnormalised log density over flat unconstrained
    parts, with the Jacobian of the constraining map."""
    # Fresh tensors: the bijectors cache what they returned, and the log
    # density of a state `to_unconstrained` gave would be read from that
    # cache, without a gradient.
    parts = [tf.identity(x) for x in parts]
    return (self.pinned.unnormalized_log_prob(self.bijector.inverse(parts))
            + self.bijector.inverse_log_det_jacobian(
                parts, event_ndims=[1] * self.num_parts))

  def to_unconstrained(self, state):
    """The flat unconstrained parts of a state in the model's structure."""
    return list(self.bijector.forward(state))

  def to_constrained(self, parts):
    """A state in the model's structure from flat unconstrained parts."""
    return self.bijector.inverse(list(parts))

  def initial_state(self, n_chains, seed):
    """Stan's start: each chain uniform(-2, 2) on the unconstrained scale,
    drawn again where the log density is not finite."""
    proposal = tfp.experimental.mcmc.init_near_unconstrained_zero(
        self.pinned)
    constrained = tfp.experimental.mcmc.retry_init(
        proposal.sample, self.pinned.unnormalized_log_prob,
        sample_shape=n_chains, seed=seed)
    return [tf.identity(x) for x in self.to_unconstrained(constrained)]


def _shapes(structure, n):
  """The `n` TensorShapes of a structure of them (a TensorShape is a
  sequence to `tf.nest` in some versions, so it is flattened by hand)."""
  if isinstance(structure, tf.TensorShape):
    return [structure]
  if isinstance(structure, dict):
    items = [structure[k] for k in sorted(structure)]
  elif isinstance(structure, (list, tuple)):
    items = list(structure)
  else:
    return [tf.TensorShape(structure)]
  out = []
  for item in items:
    out.extend(_shapes(item, None))
  if n is not None and len(out) != n:
    raise ValueError(f"expected {n} event shapes, got {len(out)}")
  return out
