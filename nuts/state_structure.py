"""The structure of a chain state, and how the target is called on it.

A state is one tensor, or any nest of tensors (`tf.nest`): a list or tuple
of them (`JointDistributionSequential`), a dict (`JointDistributionNamed`),
a namedtuple or `StructTuple` (`JointDistributionCoroutine`), or nests of
these. The NUTS program sees the flat list of parts (`tf.nest.flatten`'s
order); `StateStructure` packs them back into the user's structure and calls
the target as `tfp.mcmc` kernels call it: `target(*state)` for a list or
tuple (a namedtuple too), `target(state)` for anything else (a single
tensor, a dict). A JointDistribution's `unnormalized_log_prob` (or
`log_prob`) takes both forms, so it is a target as it is.
"""
import tensorflow as tf

__all__ = ["StateStructure", "as_parts"]


def _key(template):
  """A hashable description of a nest's structure (types, keys, fields)."""
  if isinstance(template, dict):
    return (type(template),
            tuple((k, _key(template[k])) for k in sorted(template)))
  if isinstance(template, (list, tuple)):
    return (type(template), tuple(_key(v) for v in template))
  return None


class StateStructure:
  """The nest structure of a chain state: equal (and hashed alike) for
  states of the same structure, so that it can key the NUTS program."""

  def __init__(self, state):
    self._template = tf.nest.map_structure(lambda _: None, state)
    self._key = _key(self._template)

  @property
  def is_single(self):
    """Whether the state is one tensor (not a nest)."""
    return not tf.nest.is_nested(self._template)

  @property
  def num_parts(self):
    return len(tf.nest.flatten(self._template))

  def pack(self, parts):
    """The flat list of parts in the state's structure."""
    if self.is_single:
      return parts[0]
    return tf.nest.pack_sequence_as(self._template, list(parts))

  def call(self, target, parts):
    """`target`'s value at the state made of `parts`, called as
    `tfp.mcmc`'s kernels call a target: unpacked for a list or tuple."""
    state = self.pack(parts)
    if isinstance(state, (list, tuple)):
      return target(*state)
    return target(state)

  def __eq__(self, other):
    return isinstance(other, StateStructure) and self._key == other._key

  def __hash__(self):
    return hash(self._key)

  def __repr__(self):
    return f"StateStructure({self._template!r})"


def as_parts(state):
  """`(parts, structure)`: the state's parts as a flat list of tensors,
  and its `StateStructure`."""
  structure = StateStructure(state)
  parts = []
  for s in tf.nest.flatten(state):
    try:
      parts.append(tf.convert_to_tensor(s))
    except (TypeError, ValueError) as e:
      raise TypeError(
          "a NUTS state is a tensor or a nest (list, tuple, dict, "
          "namedtuple) of tensors; could not convert the part "
          f"{s!r} of {state!r}: {e}") from e
  for p in parts:
    if not p.dtype.is_floating:
      raise TypeError(f"NUTS states must be floating point, got {p.dtype.name}")
  return parts, structure
