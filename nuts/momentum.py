"""The momentum distribution (the mass matrix) of NUTS, taken as
`tfp.experimental.mcmc.PreconditionedNoUTurnSampler` takes it.

A momentum distribution is a zero-mean Gaussian over the state's structure,
p ~ N(0, M); the kinetic energy is -log_prob(p) and the velocity dq/dt is
M^-1 p, the distribution's precision A = M^-1 times p. The batched NUTS
program (`nuts/tree.py`) runs with the identity metric, so a metric enters
it as a linear change of the state's coordinates, exact for a Gaussian:

* Diagonal (A = diag(a)): identity-metric NUTS with the step size
  eps * sqrt(a) per coordinate is the same sampler (the momentum sqrt(a) p
  is standard normal, and each leapfrog moves q by eps * a * p). Nothing
  but the step-size input changes, so a new mass matrix never rebuilds
  or recompiles the program.
* Dense (A = L L^T, L lower triangular): identity-metric NUTS on y with
  q = L y. The program's state carries L's d*d entries after y's d
  coordinates, with step size 0 and no momentum there (`tree.trajectory`
  draws none where the step is 0), so that its gradient call can map y
  to q; again the matrix is an input, not a constant of the program. (A
  dense metric costs d*d numbers per chain in every state the program
  keeps: fine for tens of coordinates, heavy for thousands.) Per-part step
  sizes then act on y's coordinates.

The distribution's precision is read from the distribution itself: its
log density's gradient at ones (diagonal) or its Hessian (dense), for
each chain, so any TFP distribution of this kind works (a
`JointDistribution` over a structured state, `MultivariateNormal*`,
`Independent`/`Sample` of `Normal`s, `BatchBroadcast`, reshaped, with a
batch shape of the chains or none). Which of the two kinds a distribution
is is decided from its classes, statically (`kind`); anything not known to
be diagonal is treated as dense. `check_gaussian` checks that the
distribution is a zero-mean Gaussian with that precision (a momentum
distribution of another family would otherwise be sampled wrongly).

The kernel results carry the distribution as `momentum_distribution`, in
the form `tfp.experimental.mcmc.DiagonalMassMatrixAdaptation` reads and
rewrites (`as_carried`, `default_distribution`).
"""
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

__all__ = ["DIAGONAL", "DENSE", "DiagonalMomentum", "default_distribution",
           "as_carried", "kind", "diagonal_precision", "dense_factor",
           "check_gaussian"]

tfb = tfp.bijectors
tfd = tfp.distributions

DIAGONAL, DENSE = None, "dense"   # the program's metric kinds (layout)

_DIAGONAL_OPERATORS = (tf.linalg.LinearOperatorDiag,
                       tf.linalg.LinearOperatorIdentity,
                       tf.linalg.LinearOperatorScaledIdentity)


def _event_shape(part, chain_ndims):
  return part.shape[chain_ndims:].as_list()


def default_distribution(parts, chain_shape, chain_ndims):
  """The identity metric, a standard normal per state part: a
  `DiagonalMomentum` of ones, which stands for the form
  `DiagonalMassMatrixAdaptation` updates; where a part's event shape is
  known only when the graph runs, that form itself."""
  event_shapes = [_event_shape(p, chain_ndims) for p in parts]
  factors = [tf.ones(tf.concat([chain_shape, [int(np.prod(e))]], 0), p.dtype)
             for p, e in zip(parts, event_shapes) if None not in e]
  if len(factors) == len(parts):
    return DiagonalMomentum(factors, event_shapes)
  dists = []
  for p in parts:
    event_shape = _event_shape(p, chain_ndims)
    if None in event_shape:   # the kernel's step says what to do
      event_shape = tf.shape(p)[chain_ndims:]
    ones = tf.ones(tf.concat([chain_shape, [tf.reduce_prod(event_shape)]],
                             0), p.dtype)
    dists.append(_adaptable_part(ones, event_shape, chain_shape))
  return tfd.JointDistributionSequential(dists)


def _adaptable_part(factor, event_shape, chain_shape):
  """One part of the form `DiagonalMassMatrixAdaptation` updates: a
  `BatchBroadcast` over the chains of a reshaped
  `MultivariateNormalPrecisionFactorLinearOperator` with the diagonal
  precision factor `factor` ([chains..., n])."""
  # `loc` given: a loc of None is made at each reconstruction of the
  # distribution (a Fill in the caller's graph at every step).
  normal = tfp.experimental.distributions.MultivariateNormalPrecisionFactorLinearOperator(  # pylint: disable=line-too-long
      loc=tf.zeros_like(factor),
      precision_factor=tf.linalg.LinearOperatorDiag(factor),
      precision=tf.linalg.LinearOperatorDiag(tf.square(factor)))
  return tfd.BatchBroadcast(
      tfd.TransformedDistribution(
          normal, bijector=tfb.Reshape(event_shape_out=event_shape)),
      with_shape=chain_shape)


class DiagonalMomentum(tf.__internal__.CompositeTensor):
  """A diagonal momentum distribution, as the kernel results carry the
  default (identity) metric: per state part, the precision factor f
  ([chains..., n], the flattened part; precision f**2) and the part's
  event shape.

  It stands for the `JointDistributionSequential` that
  `as_distribution()` builds, the form `DiagonalMassMatrixAdaptation`
  reads and rewrites (its `model` and `copy`), and the distribution's
  public methods (`log_prob`, `sample`, `variance`, `dtype`, ...) are
  that distribution's. Carried as itself, not as that distribution,
  because a `tf.function` that takes or returns kernel results rebuilds
  every composite tensor in them from its tensors at each call: TFP's
  distribution runs a constructor per nested distribution, bijector and
  linear operator at each call, which for a cheap model cost more than
  the NUTS steps of the call; this one is rebuilt from its tensors
  alone.
  """

  def __init__(self, precision_factors, event_shapes):
    self.precision_factors = list(precision_factors)
    self.event_shapes = tuple(tuple(e) for e in event_shapes)

  @property
  def _type_spec(self):
    return _DiagonalMomentumSpec(
        tuple(tf.TensorSpec.from_tensor(f) for f in self.precision_factors),
        self.event_shapes)

  def precisions(self, parts):
    """Each part's diagonal precision, shaped like the parts."""
    return [_precision_like(factor, len(event_shape), part)
            for factor, event_shape, part in zip(
                self.precision_factors, self.event_shapes, parts)]

  @property
  def model(self):
    """The parts of `as_distribution()`."""
    return [_adaptable_part(f, list(e), tf.shape(f)[:-1])
            for f, e in zip(self.precision_factors, self.event_shapes)]

  def as_distribution(self):
    """The TFP distribution this one stands for."""
    return tfd.JointDistributionSequential(self.model)

  def copy(self, **overrides):
    """`as_distribution().copy(...)`, as a `DiagonalMomentum` where it is
    one: a new `model` in the same form with diagonal precision factors,
    as `DiagonalMassMatrixAdaptation` writes when its estimation ends (so
    that the results keep one type across its steps, as `tf.while_loop`
    and its `choose` of old and new results need); else the TFP
    distribution."""
    if set(overrides) == {"model"}:
      read = [_diagonal_factor(part) for part in overrides["model"]]
      if (len(read) == len(self.precision_factors)
          and all(r is not None for r in read)):
        return DiagonalMomentum([factor for factor, _ in read],
                                self.event_shapes)
    return self.as_distribution().copy(**overrides)

  def __getattr__(self, name):
    # The distribution's public interface; never TensorFlow's probes of
    # private attributes.
    if name.startswith("_"):
      raise AttributeError(name)
    return getattr(self.as_distribution(), name)

  def __repr__(self):
    return (f"<DiagonalMomentum: {len(self.precision_factors)} part(s), "
            f"event shapes {list(self.event_shapes)}>")


def _diagonal_factor(part):
  """`(factor, event rank)` of a part in the form `_adaptable_part`
  builds: its diagonal precision factor [chains..., n] and the rank of the
  state part it is reshaped to; else None."""
  normal, reshape = _unwrap_part(part)
  if (reshape is not None
      and isinstance(normal, tfp.experimental.distributions
                     .MultivariateNormalPrecisionFactorLinearOperator)
      and isinstance(normal.precision_factor, tf.linalg.LinearOperatorDiag)):
    return (normal.precision_factor.diag_part(),
            tf.size(reshape.parameters["event_shape_out"]))
  return None


def _precision_like(factor, event_rank, part):
  """The diagonal precision f**2 of a flat factor f [chains..., n] (or
  [n]), shaped like the state part of event rank `event_rank`."""
  shape = tf.shape(part)
  flat_shape = tf.concat([shape[:tf.rank(part) - event_rank],
                          tf.shape(factor)[-1:]], 0)
  return tf.reshape(tf.broadcast_to(tf.square(factor), flat_shape), shape)


class _DiagonalMomentumSpec(tf.TypeSpec):
  """The `tf.TypeSpec` of a `DiagonalMomentum`."""

  value_type = property(lambda self: DiagonalMomentum)

  def __init__(self, factor_specs, event_shapes):
    self._factor_specs = tuple(factor_specs)
    self._event_shapes = tuple(tuple(e) for e in event_shapes)

  def _serialize(self):
    return (self._factor_specs, self._event_shapes)

  @property
  def _component_specs(self):
    return self._factor_specs

  def _to_components(self, value):
    return tuple(value.precision_factors)

  def _from_components(self, components):
    return DiagonalMomentum(components, self._event_shapes)


def as_carried(distribution, chain_shape):
  """The user's momentum distribution as the kernel results carry it, as
  `PreconditionedNoUTurnSampler`'s do: a distribution over one tensor
  becomes a `JointDistributionSequential` of one part, and the parts of a
  `JointDistributionSequential` are broadcast over the chains."""
  if not tf.nest.is_nested(structure_dtype(distribution)):
    distribution = tfd.JointDistributionSequential([distribution])
  if (type(distribution) is tfd.JointDistributionSequential   # pylint: disable=unidiomatic-typecheck
      and all(isinstance(d, tfd.Distribution) for d in distribution.model)
      and not all(isinstance(d, tfd.BatchBroadcast)
                  for d in distribution.model)):
    distribution = distribution.copy(model=[
        tfd.BatchBroadcast(d, with_shape=chain_shape)
        for d in distribution.model])
  return distribution


def _joint_model(dist, subclasses=False):
  """The parts of a `JointDistributionSequential`/`Named` whose model is a
  list or dict of distributions (a list or dict), else None: the one
  joint form every reader of the metric below looks into. Subclasses
  (the auto-batched joint distributions) count only with `subclasses`:
  their `dtype` and `log_prob` are their own."""
  joint_types = (tfd.JointDistributionSequential, tfd.JointDistributionNamed)
  if not (isinstance(dist, joint_types) if subclasses
          else type(dist) in joint_types):
    return None
  model = dist.model
  values = model.values() if isinstance(model, dict) else model
  if not all(isinstance(d, tfd.Distribution) for d in values):
    return None
  return model


def _unwrap_part(dist):
  """A part of the metric's usual form taken apart: the distribution
  under its `BatchBroadcast`, and the `Reshape` bijector it is seen
  through (None without one)."""
  if isinstance(dist, tfd.BatchBroadcast):
    dist = dist.distribution
  if (isinstance(dist, tfd.TransformedDistribution)
      and isinstance(dist.bijector, tfb.Reshape)):
    return dist.distribution, dist.bijector
  return dist, None


def _is_diagonal(dist):
  """Whether the classes of `dist` make its precision diagonal (False
  where they do not tell: such a distribution is taken as dense)."""
  if isinstance(dist, DiagonalMomentum):
    return True
  model = _joint_model(dist, subclasses=True)
  if model is not None:
    values = model.values() if isinstance(model, dict) else model
    return all(_is_diagonal(d) for d in values)
  if isinstance(dist, tfd.MultivariateNormalLinearOperator):
    return isinstance(dist.scale, _DIAGONAL_OPERATORS)
  if isinstance(dist, tfp.experimental.distributions
                .MultivariateNormalPrecisionFactorLinearOperator):
    return isinstance(dist.precision_factor, _DIAGONAL_OPERATORS)
  if isinstance(dist, (tfd.BatchBroadcast, tfd.Independent, tfd.Sample)):
    return _is_diagonal(dist.distribution)
  if isinstance(dist, tfd.TransformedDistribution):
    return (isinstance(dist.bijector, (tfb.Reshape, tfb.Identity))
            and _is_diagonal(dist.distribution))
  return isinstance(dist, tfd.Normal)


def kind(distribution):
  """`DIAGONAL` or `DENSE`: the metric kind the program is built for."""
  return DIAGONAL if _is_diagonal(distribution) else DENSE


def structure_dtype(distribution):
  """`distribution.dtype`, read from the parts of a joint distribution
  whose model is a list or dict of distributions. A joint distribution's
  own `dtype` traces a sample in a scratch graph, which TFP's bijector cache
  then keeps alive with every tensor of the step's graph it captured (the
  target's data among them)."""
  if isinstance(distribution, DiagonalMomentum):
    return [f.dtype for f in distribution.precision_factors]
  model = _joint_model(distribution)
  if isinstance(model, dict):
    return {k: structure_dtype(d) for k, d in model.items()}
  if model is not None:
    return [structure_dtype(d) for d in model]
  return distribution.dtype


def _log_prob(distribution, parts):
  """The distribution's log density at the flat list of momentum parts,
  packed in the distribution's structure, up to a constant: its readers
  take its derivatives and differences only (see
  `_gaussian_log_prob_less_constant`)."""
  value = tf.nest.pack_sequence_as(structure_dtype(distribution),
                                   list(parts))
  return _log_prob_uncached(distribution, value)


def _log_prob_uncached(dist, value):
  """`dist.log_prob(value)`, with the wrappers of the metric's usual form
  (a joint distribution of batch-broadcast, reshaped Gaussians, as
  `DiagonalMassMatrixAdaptation` builds it) evaluated here. TFP's bijector
  cache, shared by all bijectors, holds each traced input strongly while
  its output lives; a reshape's output is a tensor of the step's graph, so
  the cache would keep the graph, and the target data it captures, alive
  after the kernel and the target are dropped."""
  if isinstance(dist, DiagonalMomentum):
    dist = dist.as_distribution()
  model = _joint_model(dist)
  if model is not None:
    keys = model if isinstance(model, dict) else range(len(model))
    return tf.add_n([_log_prob_uncached(model[k], value[k]) for k in keys])
  inner, reshape = _unwrap_part(dist)
  if reshape is None:
    if inner is not dist:   # a bare BatchBroadcast
      return _log_prob_uncached(inner, value)
    quadratic = _gaussian_log_prob_less_constant(dist, value)
    return dist.log_prob(value) if quadratic is None else quadratic
  out_rank = tf.size(reshape.parameters["event_shape_out"])
  batch_shape = tf.shape(value)[:tf.rank(value) - out_rank]
  flat = tf.reshape(value, tf.concat(
      [batch_shape, tf.cast(reshape.parameters["event_shape_in"], tf.int32)],
      0))
  # A reshape's log-determinant is zero.
  return _log_prob_uncached(inner, flat)


def _gaussian_log_prob_less_constant(dist, value):
  """For a Gaussian given by a linear operator (a precision factor F,
  precision F F^T, or a scale S, precision S^-T S^-1), its log density
  less its normalising constant: -|F^T (x - loc)|^2 / 2 or
  -|S^-1 (x - loc)|^2 / 2. The constant needs the operator's
  log-determinant, for which XLA has no kernel where the operator is a
  full matrix (LogMatrixDeterminant), and pc:xla compiles the metric's
  reading into every step. None for other distributions."""
  pfl = tfp.experimental.distributions.MultivariateNormalPrecisionFactorLinearOperator  # pylint: disable=line-too-long
  if isinstance(dist, pfl):
    loc = dist.loc
    centred = value if loc is None else value - loc
    z = dist.precision_factor.matvec(centred, adjoint=True)
  elif isinstance(dist, tfd.MultivariateNormalLinearOperator):
    loc = dist.loc
    centred = value if loc is None else value - loc
    z = dist.scale.solvevec(centred)
  else:
    return None
  return -0.5 * tf.reduce_sum(tf.square(z), -1)


def _check_structure(distribution, parts):
  num = len(tf.nest.flatten(structure_dtype(distribution)))
  if num != len(parts):
    raise ValueError(
        f"momentum_distribution has {num} part(s) for a state of "
        f"{len(parts)}: it must be a distribution over the state's "
        "structure (one tensor, or a JointDistribution with a part per "
        "state part)")


def _read_diagonal_precision(distribution, parts):
  """The diagonal precision read off the metric's usual form (a joint
  distribution of batch-broadcast, reshaped Gaussians with a diagonal
  precision factor f: precision f**2), or None for another form. Reading
  it needs no gradient tape inside the step, whose gradient XLA cannot
  compile when a caller's tape records the step."""
  if isinstance(distribution, DiagonalMomentum):
    return distribution.precisions(parts)
  if type(distribution) is not tfd.JointDistributionSequential:   # pylint: disable=unidiomatic-typecheck
    return None
  model = _joint_model(distribution)
  if model is None or len(model) != len(parts):
    return None
  read = [_diagonal_factor(dist) for dist in model]
  if any(r is None for r in read):
    return None
  return [_precision_like(factor, event_rank, part)
          for (factor, event_rank), part in zip(read, parts)]


def diagonal_precision(distribution, parts):
  """Each part's diagonal precision a (the inverse mass), per chain:
  minus the log density's gradient at ones, shaped like the parts."""
  _check_structure(distribution, parts)
  read = _read_diagonal_precision(distribution, parts)
  if read is not None:
    return read
  ones = [tf.ones_like(p) for p in parts]
  with tf.GradientTape() as tape:
    tape.watch(ones)
    logp = tf.reduce_sum(_log_prob(distribution, ones))
  return [-g for g in tape.gradient(logp, ones)]


def dense_factor(distribution, parts, chain_ndims):
  """L, [chains, d, d] lower triangular with L L^T the precision (inverse
  mass) of the flattened, concatenated state parts, per chain."""
  _check_structure(distribution, parts)
  chain_shape = tf.shape(parts[0])[:chain_ndims]
  sizes = [int(np.prod(_event_shape(p, chain_ndims))) for p in parts]
  x = tf.zeros(tf.stack([tf.reduce_prod(chain_shape), sum(sizes)]),
               parts[0].dtype)
  with tf.GradientTape() as outer:
    outer.watch(x)
    with tf.GradientTape() as inner:
      inner.watch(x)
      momenta = [tf.reshape(v, tf.concat([chain_shape, tf.shape(p)[
          chain_ndims:]], 0)) for v, p in zip(tf.split(x, sizes, -1), parts)]
      logp = tf.reduce_sum(_log_prob(distribution, momenta))
    grad = inner.gradient(logp, x)
  precision = -outer.batch_jacobian(grad, x)
  precision = 0.5 * (precision + tf.linalg.matrix_transpose(precision))
  return tf.linalg.cholesky(precision)


def check_gaussian(distribution, parts, chain_ndims):
  """Raises unless the distribution is a zero-mean Gaussian with the
  precision `kind` reads from it: its log density at a probe x and at -x,
  less its value at 0, must be -x^T A x / 2. Eagerly a ValueError, traced
  a graph assertion (none under XLA)."""
  _check_structure(distribution, parts)
  dtype = parts[0].dtype
  probe = [tf.cast(tf.random.stateless_normal(tf.shape(p), [7, 11]), dtype)
           for p in parts]
  if kind(distribution) is DIAGONAL:
    a = diagonal_precision(distribution, parts)
    quad = tf.add_n([tf.reduce_sum(tf.reshape(
        ai * x * x, tf.concat([tf.shape(x)[:chain_ndims], [-1]], 0)), -1)
                     for ai, x in zip(a, probe)])
  else:
    factor = dense_factor(distribution, parts, chain_ndims)
    flat = tf.concat([tf.reshape(x, tf.concat(
        [[tf.shape(factor)[0]], [-1]], 0)) for x in probe], -1)
    lx = tf.linalg.matvec(factor, flat, adjoint_a=True)
    quad = tf.reshape(tf.reduce_sum(lx * lx, -1),
                      tf.shape(parts[0])[:chain_ndims])
  zero = _log_prob(distribution, [tf.zeros_like(p) for p in parts])
  expected = -0.5 * quad
  tol = 1e-3 * (1. + tf.abs(expected)) if dtype == tf.float32 else (
      1e-8 * (1. + tf.abs(expected)))
  ok = tf.reduce_all([
      tf.reduce_all(tf.abs(_log_prob(distribution, xs) - zero - expected)
                    <= tol)
      for xs in (probe, [-x for x in probe])])
  message = ("momentum_distribution must be a zero-mean Gaussian (normal) "
             "distribution over the state, as the momenta of Hamiltonian "
             "Monte Carlo are; its log density is not -p^T A p / 2 plus a "
             "constant. For a diagonal mass matrix use e.g. "
             "tfd.Independent(tfd.Normal(0., scale)) or "
             "tfd.MultivariateNormalDiag(scale_diag=...), for a dense one "
             "tfd.MultivariateNormalTriL(scale_tril=...), one per part "
             "(tfd.JointDistributionSequential/Named for a structured state)")
  if tf.executing_eagerly():
    if not bool(ok):
      raise ValueError(message)
    return
  tf.debugging.Assert(ok, [message], name="check_momentum_distribution")
