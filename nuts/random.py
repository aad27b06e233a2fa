"""A per-chain, counter-based random number generator from integer ops.

`tf.random.stateless_*` cannot be vectorised by pfor when each batch member
has its own seed (DESIGN.md, known pitfalls), so NUTS draws its randomness
from a hash of (seed words, counter words): every draw is a pure function of
its key, elementwise integer arithmetic only, which pfor and XLA vectorise.

The mixer is Chris Wellons' `lowbias32` (xor-shift-multiply, 32-bit, an
avalanche bias ~1.7e-4 ... good enough for Monte Carlo, checked statistically
in tests/test_nuts.py). A key (w_0, ..., w_n) of 32-bit words is absorbed one
word at a time: h <- mix(h ^ mix(w_i + i * golden)). Uniforms use all 32 bits
of the hash, computed in float64, strictly inside (0, 1); normals come from
Box-Muller on two independent uniforms.

Seeds are explicit and stateless: the same key gives the same draw.
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


def mix32(x):
  """lowbias32: a bijective 32-bit integer mixer."""
  x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(16, tf.uint32)))
  x = x * tf.constant(0x7FEB352D, tf.uint32)
  x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(15, tf.uint32)))
  x = x * tf.constant(0x846CA68B, tf.uint32)
  x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(16, tf.uint32)))
  return x


def hash_words(words):
  """Hashes a list of 32-bit words (tensors broadcast together) to uint32."""
  h = tf.constant(0x6A09E667, tf.uint32)
  for i, w in enumerate(words):
    w = _u32(w) + tf.constant((i + 1) * _GOLDEN & 0xFFFFFFFF, tf.uint32)
    h = mix32(tf.bitwise.bitwise_xor(h, mix32(w)))
  return h


def uniform(seed, words, dtype=tf.float64):
  """Uniform in (0, 1) keyed by `seed` (a [k] int32 vector) and `words`."""
  seed = tf.convert_to_tensor(seed)
  seed_words = [seed[i] for i in range(int(seed.shape[-1]))] if seed.shape.rank else [seed]
  h = hash_words(seed_words + list(words))
  u = (tf.cast(h, tf.float64) + 0.5) * _TWO_POW_M32
  return tf.cast(u, dtype)


def normal(seed, words, size, dtype=tf.float64):
  """`size` iid standard normals (a [size] vector) keyed by seed and words."""
  lanes = tf.range(size, dtype=tf.int32)
  u1 = uniform(seed, list(words) + [2 * lanes], tf.float64)
  u2 = uniform(seed, list(words) + [2 * lanes + 1], tf.float64)
  z = tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(2.0 * math.pi * u2)
  return tf.cast(z, dtype)
