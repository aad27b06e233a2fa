"""A plain NumPy single-chain NUTS, used only by tests.

Same algorithm as `nuts/tree.py` (multinomial sampling, biased progressive
sampling at the top level, generalized U-turn criterion with seam checks) and
the same random draws (the hash of `nuts/random.py` re-done in NumPy), so the
batched kernel can be compared chain by chain to floating-point tolerance.
Written for clarity, not speed.
"""
import math

import numpy as np

from nuts.tree import DEFAULT_MAX_ENERGY_DIFF, _MOMENTUM, _DIRECTION, _TOP_ACCEPT, _MERGE

_M = 0xFFFFFFFF


def _mix32(x):
  x = int(x) & _M
  x ^= x >> 16
  x = (x * 0x7FEB352D) & _M
  x ^= x >> 15
  x = (x * 0x846CA68B) & _M
  x ^= x >> 16
  return x


def _hash(words):
  h = 0x6A09E667
  for i, w in enumerate(words):
    w = (int(w) + ((i + 1) * 0x9E3779B9 & _M)) & _M
    h = _mix32(h ^ _mix32(w))
  return h


def uniform(seed, words):
  return (_hash(list(seed) + list(words)) + 0.5) * 2.0 ** -32


def normal(seed, words, size):
  z = np.empty(size)
  for i in range(size):
    u1 = uniform(seed, list(words) + [2 * i])
    u2 = uniform(seed, list(words) + [2 * i + 1])
    z[i] = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
  return z


def _no_u_turn(rho, p_begin, p_end):
  return rho @ p_begin > 0 and rho @ p_end > 0


def _no_u_turn_merge(rho1, p1_inner, p1_outer, rho2, p2_inner, p2_outer):
  return (_no_u_turn(rho1 + rho2, p1_inner, p2_outer)
          and _no_u_turn(rho1 + p2_inner, p1_inner, p2_inner)
          and _no_u_turn(rho2 + p1_outer, p1_outer, p2_outer))


def _log_add_exp(a, b):
  return np.logaddexp(a, b)


class Sampler:
  """One chain. `logp_and_grad(q) -> (float, [d] array)` on a [d] array."""

  def __init__(self, logp_and_grad, max_tree_depth=10,
               unrolled_leapfrog_steps=1,
               max_energy_diff=DEFAULT_MAX_ENERGY_DIFF):
    self.logp_and_grad = logp_and_grad
    self.max_energy_diff = max_energy_diff
    self.max_tree_depth = max_tree_depth
    self.unrolled = unrolled_leapfrog_steps

  def leaf(self, q, p, g, eps, h0):
    for _ in range(self.unrolled):
      p = p + 0.5 * eps * g
      q = q + eps * p
      logp, g = self.logp_and_grad(q)
      p = p + 0.5 * eps * g
    delta = h0 - (-logp + 0.5 * p @ p)
    finite = np.isfinite(delta)
    divergent = not (finite and -delta <= self.max_energy_diff)
    return dict(q_outer=q, p_outer=p, g_outer=g, p_inner=p, q_s=q, p_s=p,
                logp_s=logp, g_s=g, log_w=delta if finite else -np.inf,
                rho=p, ok=not divergent,
                accept=min(1.0, math.exp(min(delta, 0.))) if finite else 0.,
                n=self.unrolled, divergent=divergent)

  def build_tree(self, q, p, g, eps, depth, h0, seed, traj, doubling, start):
    if depth == 0:
      return self.leaf(q, p, g, eps, h0)
    first = self.build_tree(q, p, g, eps, depth - 1, h0, seed, traj,
                            doubling, start)
    if not first["ok"]:
      return first
    second = self.build_tree(first["q_outer"], first["p_outer"],
                             first["g_outer"], eps, depth - 1, h0, seed, traj,
                             doubling, start + 2 ** (depth - 1))
    accept = first["accept"] + second["accept"]
    n = first["n"] + second["n"]
    if not second["ok"]:
      return dict(second, accept=accept, n=n)
    log_w = _log_add_exp(first["log_w"], second["log_w"])
    u = uniform(seed, [_MERGE, traj, doubling, depth, start])
    chosen = second if math.log(u) < second["log_w"] - log_w else first
    ok = _no_u_turn_merge(first["rho"], first["p_inner"], first["p_outer"],
                          second["rho"], second["p_inner"], second["p_outer"])
    return dict(q_outer=second["q_outer"], p_outer=second["p_outer"],
                g_outer=second["g_outer"], p_inner=first["p_inner"],
                q_s=chosen["q_s"], p_s=chosen["p_s"], logp_s=chosen["logp_s"],
                g_s=chosen["g_s"], log_w=log_w, rho=first["rho"] + second["rho"],
                ok=ok, accept=accept, n=n, divergent=second["divergent"])

  def trajectory(self, q, logp, g, step, seed, traj):
    """One transition; returns (q, logp, grad, stats dict)."""
    p = normal(seed, [_MOMENTUM, traj], q.size)
    h0 = -logp + 0.5 * p @ p
    left = right = (q, p, g)
    sample = (q, p, logp, g)
    log_w, rho = 0.0, p
    accept, n, moved, divergent, going, depth = 0.0, 0, False, False, True, 0
    while going and depth < self.max_tree_depth:
      forward = uniform(seed, [_DIRECTION, traj, depth]) < 0.5
      start_q, start_p, start_g = right if forward else left
      tree = self.build_tree(start_q, start_p, start_g,
                             step if forward else -step, depth, h0, seed,
                             traj, depth, 0)
      accept += tree["accept"]
      n += tree["n"]
      divergent = divergent or tree["divergent"]
      going = tree["ok"]
      if going:
        u = uniform(seed, [_TOP_ACCEPT, traj, depth])
        if math.log(u) < tree["log_w"] - log_w:
          sample = (tree["q_s"], tree["p_s"], tree["logp_s"], tree["g_s"])
          moved = True
        if forward:
          going = _no_u_turn_merge(rho, left[1], right[1], tree["rho"],
                                   tree["p_inner"], tree["p_outer"])
          right = (tree["q_outer"], tree["p_outer"], tree["g_outer"])
        else:
          going = _no_u_turn_merge(rho, right[1], left[1], tree["rho"],
                                   tree["p_inner"], tree["p_outer"])
          left = (tree["q_outer"], tree["p_outer"], tree["g_outer"])
        log_w = _log_add_exp(log_w, tree["log_w"])
        rho = rho + tree["rho"]
      depth += 1
    q_s, p_s, logp_s, g_s = sample
    stats = dict(energy=logp_s - 0.5 * p_s @ p_s,
                 accept=accept / max(n // self.unrolled, 1), num_leapfrogs=n,
                 is_accepted=moved, divergent=divergent,
                 reach_max_depth=going and depth >= self.max_tree_depth)
    return q_s, logp_s, g_s, stats

  def steps(self, q, step, seed, num_trajectories=1):
    """`num_trajectories` transitions from q (as one fused `one_step`)."""
    logp, g = self.logp_and_grad(q)
    all_stats = []
    for t in range(num_trajectories):
      q, logp, g, stats = self.trajectory(q, logp, g, step, seed, t)
      all_stats.append(stats)
    return q, logp, g, all_stats
