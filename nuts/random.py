"""A per-chain, counter-based random number generator from integer ops.

`tf.random.stateless_*` cannot be vectorised by pfor when each batch member
has its own seed (pfor has no converter for `StatelessRandomGetKeyCounter`
on TF 2.21), so NUTS draws its randomness
from a hash of (seed words, counter words): every draw is a pure function of
its key, elementwise integer arithmetic only, which pfor and XLA vectorise.

The mixer is Chris Wellons' `lowbias32` (xor-shift-multiply, 32-bit, an
avalanche bias ~1.7e-4 ... good enough for Monte Carlo, checked statistically
in tests/test_nuts.py). A key (w_0, ..., w_n) of 32-bit words is absorbed one
word at a time: h <- mix(h ^ mix(w_i + i * golden)). Uniforms use all 32 bits
of the hash, computed in float64, strictly inside (0, 1) (a float32 uniform
is that value rounded, so it may round to 1); normals come from Box-Muller on
two independent uniforms, in the precision of the draw.

Seeds are explicit and stateless: the same key gives the same draw.

A seed is a vector of words, or a chain key (`chain_key`): the hash of a
chain's three seed words, taken once, that gives the same draws as those
words. NUTS keys every draw of a step by the chain's seed words, so the
kernel hashes them once per step and the draws absorb their own words only
(3 of a momentum draw's 6, 5 of a merge's 8): fewer integer ops to trace,
vectorise and compile.
"""
import math

import tensorflow as tf

_GOLDEN = 0x9E3779B9
_TWO_POW_M32 = 2.0 ** -32


def _u32(x):
  """int32/uint32/int64 tensor or Python int -> uint32 (bit pattern kept)."""
  if isinstance(x, int):
    return tf.constant(x & 0xFFFFFFFF, tf.uint32)
  x = tf.convert_to_tensor(x)
  if x.dtype == tf.uint32:
    return x
  if x.dtype == tf.int32:
    return tf.cast(x, tf.uint32)   # two's complement wrap (Bitcast has no pfor)
  return tf.cast(tf.bitwise.bitwise_and(tf.cast(x, tf.int64), 0xFFFFFFFF),
                 tf.uint32)


_MIX32_STEPS = ((16, 0x7FEB352D), (15, 0x846CA68B))
_MIX32_LAST_SHIFT = 16


def mix32(x, constants=None):
  """lowbias32: a bijective 32-bit integer mixer (of a uint32 tensor, or
  of a Python int, mixed in Python: a key's constant words cost the trace
  no ops). `constants`: its `mix32_constants()`, made once for several
  mixes (each costs the trace an op)."""
  if isinstance(x, int):
    x &= 0xFFFFFFFF
    for shift, factor in _MIX32_STEPS:
      x = ((x ^ (x >> shift)) * factor) & 0xFFFFFFFF
    return x ^ (x >> _MIX32_LAST_SHIFT)
  steps, last_shift = constants or mix32_constants()
  for shift, factor in steps:
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, shift)) * factor
  return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, last_shift))


def mix32_constants():
  """The uint32 constants `mix32` of a tensor takes, as tensors."""
  def u32(c):
    return tf.constant(c, tf.uint32)
  return ([(u32(shift), u32(factor)) for shift, factor in _MIX32_STEPS],
          u32(_MIX32_LAST_SHIFT))


_INITIAL = 0x6A09E667
KEY_WORDS = 3   # the seed words a chain key stands for


def hash_words(words, state=None, position=0):
  """Hashes a list of 32-bit words (tensors broadcast together) to uint32:
  absorbed into `state`, the hash of `position` words before them (by
  default none)."""
  # Words that are Python ints are hashed in Python, and so is the state
  # until the first tensor word.
  h = _INITIAL if state is None else _u32(state)
  constants = None
  for i, w in enumerate(words, start=position):
    offset = (i + 1) * _GOLDEN & 0xFFFFFFFF
    if isinstance(w, int) and isinstance(h, int):
      h = mix32(h ^ mix32(w + offset))
      continue
    constants = constants or mix32_constants()
    w = (mix32(w + offset) if isinstance(w, int) else
         mix32(_u32(w) + tf.constant(offset, tf.uint32), constants))
    h = mix32(tf.bitwise.bitwise_xor(_u32(h), _u32(w)), constants)
  return _u32(h)


def chain_key(seed_words):
  """`[..., KEY_WORDS]` int32 seed words -> `[...]` int32 chain keys: a
  seed that draws what the words draw, hashing them no more."""
  seed_words = tf.convert_to_tensor(seed_words)
  h = hash_words([seed_words[..., i] for i in range(KEY_WORDS)])
  return tf.cast(h, tf.int32)   # the bit pattern (Bitcast has no pfor)


def uniform(seed, words, dtype=tf.float64):
  """Uniform in (0, 1) keyed by `seed` (a [k] int32 vector of words, or a
  scalar `chain_key`) and `words`."""
  seed = tf.convert_to_tensor(seed)
  if seed.shape.rank == 0:
    h = hash_words(list(words), state=seed, position=KEY_WORDS)
  else:
    h = hash_words([seed[i] for i in range(int(seed.shape[-1]))]
                   + list(words))
  u = (tf.cast(h, tf.float64) + 0.5) * _TWO_POW_M32
  return tf.cast(u, dtype)


def normal(seed, words, size, dtype=tf.float64):
  """`size` iid standard normals (a [size] vector) keyed by seed and words.

  Box-Muller runs in the draw's own precision (float32 below float64):
  a float64 logarithm and cosine cost a CPU several times their float32
  versions, and accelerators far more. A float32 draw is the float64 draw
  to float32 precision. (With float64 math the momentum draw's block was a
  visible share of NUTS's time on the 100-d Gaussian at 64 chains:
  `python -m benchmarks.nuts_profile`.)
  """
  compute = tf.float64 if dtype == tf.float64 else tf.float32
  lanes = tf.range(size, dtype=tf.int32)
  u1 = uniform(seed, list(words) + [2 * lanes], compute)
  u2 = uniform(seed, list(words) + [2 * lanes + 1], compute)
  z = tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(2.0 * math.pi * u2)
  return tf.cast(z, dtype)
