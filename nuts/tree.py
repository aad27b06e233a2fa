"""The No-U-Turn Sampler for ONE chain, batched over chains by tfp_autobatch.

Read this beside Hoffman & Gelman (2014), Algorithm 3 ("efficient NUTS"),
with two modernisations from Betancourt (2017, "A conceptual introduction to
Hamiltonian Monte Carlo", appendix A), as Stan and `tfp.mcmc.NoUTurnSampler`
use them:

* Multinomial trajectory sampling instead of slice sampling. Every state z of
  the trajectory has weight w(z) = exp(H0 - H(z)). Inside a subtree the sample
  is drawn in proportion to the weights (merging two halves, keep the second
  half's sample with probability w2 / (w1 + w2)). At the top level, when the
  trajectory doubles, the new subtree's sample replaces the current one with
  probability min(1, w_new / w_old) ("biased progressive sampling"), which
  favours states far from the start.
* The generalized U-turn criterion with the identity metric: a (sub)trajectory
  from z- to z+ with summed momenta rho has turned when rho.p- <= 0 or
  rho.p+ <= 0. As Stan (2.26+) does, each merge of two subtrees also checks the
  two "across the seam" criteria (the left subtree extended by the first
  state of the right one, and the right subtree extended by the last state of
  the left one), which catches U-turns that fall between the halves.
  (`tfp.mcmc.NoUTurnSampler` 0.25 does not check the seams, so its
  trajectories stop a little later, a few percent more leapfrogs.)

A subtree that diverges (H - H0 > max_energy_diff, 1000 by default as in
`tfp.mcmc`, or a non-finite energy) or turns is
invalid: the trajectory stops and none of its states can be sampled. The
acceptance statistic (for step-size adaptation) is the mean over every
leaf computed of min(1, exp(H0 - H)) (over every leapfrog step, as in
Stan, when a leaf is one; at each leaf's last state, as in
`tfp.mcmc.NoUTurnSampler`, when it is `unrolled_leapfrog_steps`).

Everything in here is written for one chain: `q`, `p`, `grad` and `step` are
[d] vectors (the chain's state parts flattened and concatenated, and the step
size per coordinate). `make_program` closes over the target and the settings
and returns the `@tab.batch` function the kernel calls on the batch of chains.
"""
import collections

import tensorflow as tf

import tfp_autobatch as tab
from nuts import random as nuts_random

DEFAULT_MAX_ENERGY_DIFF = 1000.0

# Random draws are keyed by (chain seed words, kind, trajectory, ...): the
# kind comes first, so that draws of different kinds can never share a key
# (with the kind third, the direction and top-level acceptance draws of
# doubling 1 were momentum coordinate 1's two Box-Muller uniforms, which
# biased that coordinate).
_MOMENTUM, _DIRECTION, _TOP_ACCEPT, _MERGE = 1, 2, 3, 4

Subtree = collections.namedtuple("Subtree", [
    "q_outer", "p_outer", "grad_outer",  # the end the trajectory grows from
    "p_inner",                           # the other end's momentum
    "q_sample", "p_sample", "logp_sample", "grad_sample",
    "log_weight",     # log sum over its states of exp(H0 - H)
    "rho",            # sum of its states' momenta
    "ok",             # neither diverged nor made a U-turn inside
    "accept_sum",     # sum of min(1, exp(H0 - H)) over its leapfrog steps
    "num_leapfrogs",
    "divergent",
])

Trajectory = collections.namedtuple("Trajectory", [
    "q", "logp", "grad",       # the sampled next state of the chain
    "energy",                  # logp - |p|^2 / 2 at the sampled state
                               # (-H: `tfp.mcmc.NoUTurnSampler`'s sign)
    "accept_sum", "num_leapfrogs",
    "is_accepted",             # the sample is not the starting state
    "divergent", "reach_max_depth", "depth",
])

StepResult = collections.namedtuple("StepResult", [
    "q", "logp", "grad", "energy",
    "log_accept_ratio",   # log of the acceptance statistic, averaged over
                          # the trajectories
    "num_leapfrogs",      # summed over trajectories
    "is_accepted",        # of the last trajectory
    "divergent",          # in any trajectory
    "reach_max_depth",    # in any trajectory
    "trajectory_q",       # [num_trajectories, d]: each trajectory's
                          # sampled state, in order (the last is `q`)
])


# -- single-chain helpers (plain TF; vectorised over chains by pfor) ----------

def _dot(a, b):
  return tf.reduce_sum(a * b)


def kinetic_energy(p):
  return 0.5 * _dot(p, p)


def no_u_turn(rho, p_begin, p_end):
  """Generalized criterion: the trajectory is still moving apart."""
  return tf.logical_and(_dot(rho, p_begin) > 0, _dot(rho, p_end) > 0)


def no_u_turn_merge(rho1, p1_inner, p1_outer, rho2, p2_inner, p2_outer):
  """Criteria for a trajectory made of subtree 1 then subtree 2 (in build
  order: 2 continues 1 outward). The seam checks are symmetric in time, so
  they read the same for either direction of integration."""
  whole = no_u_turn(rho1 + rho2, p1_inner, p2_outer)
  seam1 = no_u_turn(rho1 + p2_inner, p1_inner, p2_inner)
  seam2 = no_u_turn(rho2 + p1_outer, p1_outer, p2_outer)
  return tf.logical_and(whole, tf.logical_and(seam1, seam2))


def leaf_statistics(logp, p, h0, max_energy_diff):
  """(log weight, acceptance statistic, divergent) of a new state: it
  diverged if its energy exceeds the start's by more than
  `max_energy_diff` or is not finite."""
  h = -logp + kinetic_energy(p)
  delta = h0 - h
  finite = tf.math.is_finite(delta)
  divergent = tf.logical_not(tf.logical_and(finite, -delta <= max_energy_diff))
  log_weight = tf.where(finite, delta, tf.constant(-float("inf"), delta.dtype))
  accept = tf.where(finite, tf.exp(tf.minimum(delta, 0.)), tf.zeros_like(delta))
  return log_weight, accept, divergent


def log_add_exp(a, b):
  big = tf.maximum(a, b)
  big_finite = tf.where(tf.math.is_finite(big), big, tf.zeros_like(big))
  return big_finite + tf.math.log(tf.exp(a - big_finite) + tf.exp(b - big_finite))


def accept_new(seed, words, log_weight_new, log_weight_old):
  """True with probability min(1, exp(new - old))."""
  u = nuts_random.uniform(seed, words, log_weight_new.dtype)
  return tf.math.log(u) < log_weight_new - log_weight_old


def choose(cond, a, b):
  return tf.nest.map_structure(lambda x, y: tf.where(cond, x, y), a, b)


def half_size(depth):
  return tf.bitwise.left_shift(tf.constant(1, tf.int32), depth - 1)


def draw_momentum(seed, traj, q):
  return nuts_random.normal(seed, [_MOMENTUM, traj], tf.size(q), q.dtype)


def go_forward(seed, traj, depth):
  return nuts_random.uniform(seed, [_DIRECTION, traj, depth]) < 0.5


def mean_accept(accept_sum, num_leapfrogs, leapfrogs_per_leaf):
  """The mean acceptance statistic of a trajectory: one statistic per
  leaf (at the leaf's last state, as in `tfp.mcmc.NoUTurnSampler`), so the
  sum is divided by the leaves, not the leapfrogs, when a leaf takes
  several (`unrolled_leapfrog_steps`)."""
  leaves = tf.maximum(num_leapfrogs // leapfrogs_per_leaf, 1)
  return accept_sum / tf.cast(leaves, accept_sum.dtype)


def merge_subtrees(first, second, seed, words):
  """The subtree made of `first` then `second` (a valid `first`; `second`
  grown from its outer end). `words` key the multinomial draw."""
  accept_sum = first.accept_sum + second.accept_sum
  num_leapfrogs = first.num_leapfrogs + second.num_leapfrogs
  # Multinomial sampling inside the subtree.
  log_weight = log_add_exp(first.log_weight, second.log_weight)
  take_second = accept_new(seed, words, second.log_weight, log_weight)
  q_s, p_s, logp_s, grad_s = choose(
      take_second,
      (second.q_sample, second.p_sample, second.logp_sample,
       second.grad_sample),
      (first.q_sample, first.p_sample, first.logp_sample, first.grad_sample))
  ok = no_u_turn_merge(first.rho, first.p_inner, first.p_outer,
                       second.rho, second.p_inner, second.p_outer)
  merged = Subtree(second.q_outer, second.p_outer, second.grad_outer,
                   first.p_inner, q_s, p_s, logp_s, grad_s, log_weight,
                   first.rho + second.rho, ok, accept_sum, num_leapfrogs,
                   second.divergent)
  # An invalid second half is returned as it is, with the counts of both.
  # (A select, not `if`: both results are cheap, and every branch costs
  # the batched program a step.)
  return choose(second.ok, merged, second._replace(
      accept_sum=accept_sum, num_leapfrogs=num_leapfrogs))


def make_program(logp_and_grad, max_tree_depth, unrolled_leapfrog_steps,
                 num_trajectories, max_energy_diff=DEFAULT_MAX_ENERGY_DIFF):
  """The batched NUTS program over a `@tab.batched_primitive` log-density.

  `logp_and_grad(q)` maps a batch of flat states [n, d] to ([n], [n, d]).
  Returns a `@tab.batch` function
  `nuts_steps(q, logp, grad, step, seed) -> StepResult` for one chain, where
  `step` is the per-coordinate step size [d] and `seed` the chain's 3 int32
  seed words or their `nuts.random.chain_key` (the same draws).
  """
  stack_depth = max_tree_depth + 8

  @tab.batch(max_stack_depth=stack_depth)
  def leaf(q, p, grad, eps, h0):
    """Hoffman & Gelman's base case: `unrolled_leapfrog_steps` leapfrogs."""
    for _ in range(unrolled_leapfrog_steps):
      p = p + 0.5 * eps * grad
      q = q + eps * p
      logp, grad = logp_and_grad(q)
      p = p + 0.5 * eps * grad
    log_weight, accept, divergent = leaf_statistics(logp, p, h0,
                                                    max_energy_diff)
    return Subtree(q, p, grad, p, q, p, logp, grad, log_weight, p,
                   tf.logical_not(divergent), accept,
                   tf.constant(unrolled_leapfrog_steps, tf.int32), divergent)

  @tab.batch(max_stack_depth=stack_depth)
  def build_tree(q, p, grad, eps, depth, h0, seed, traj, doubling, start):
    """A subtree of 2**depth leaves grown from (q, p) with signed step eps."""
    if depth <= 1:
      # The base case (depth 0: one leaf) and, written out, the recursive
      # case below with `leaf` for the halves (depth 1): a subtree of one
      # or two leaves takes the batched program one step, and the model
      # is called from two places only. Writing it out down to four leaves
      # halves the VM steps but barely changes time at one chain, slows
      # many chains (four gradient call sites) and compiles longer, so it
      # is not done (`python -m benchmarks.nuts_vm_steps`). Nor is
      # walking a subtree's left spine with a loop (the subtree of depth
      # k + 1 as the one of depth k merged with a sibling of depth k built
      # after it), which makes each merge and the next sibling's call one
      # block and also halves the VM steps: both of its blocks then carry
      # a merge, a call and its saves, and the larger register writes,
      # into which XLA fuses the merge's per-chain tests again for every
      # element, cost more than the steps saved from 16 chains on.
      first = leaf(q, p, grad, eps, h0)
      if depth == 0 or not first.ok:
        return first
      second = leaf(first.q_outer, first.p_outer, first.grad_outer, eps, h0)
    else:
      first = build_tree(q, p, grad, eps, depth - 1, h0, seed, traj,
                         doubling, start)
      if not first.ok:
        return first
      second = build_tree(first.q_outer, first.p_outer, first.grad_outer,
                          eps, depth - 1, h0, seed, traj, doubling,
                          start + half_size(depth))
    # One merge for both cases: traced and vectorised once (it is the
    # largest primitive of the program).
    return merge_subtrees(first, second, seed,
                          [_MERGE, traj, doubling, depth, start])

  @tab.batch(max_stack_depth=stack_depth)
  def trajectory(q, logp, grad, step, seed, traj):
    """One NUTS transition: doublings until a U-turn, divergence or max depth."""
    # No momentum where the step is 0: coordinates that carry a dense
    # metric's factor along (`nuts/momentum.py`), which must not move.
    p = tf.where(step > 0, draw_momentum(seed, traj, q), tf.zeros_like(q))
    h0 = -logp + kinetic_energy(p)
    q_left, p_left, grad_left = q, p, grad
    q_right, p_right, grad_right = q, p, grad
    q_s, p_s, logp_s, grad_s = q, p, logp, grad
    log_weight = tf.zeros_like(logp)
    rho = p
    accept_sum = tf.zeros_like(logp)
    num_leapfrogs = tf.constant(0, tf.int32)
    moved = tf.constant(False)
    divergent = tf.constant(False)
    going = tf.constant(True)
    depth = tf.constant(0, tf.int32)
    while going and depth < max_tree_depth:
      # Double the trajectory: grow a subtree of 2**depth leaves from its
      # left or right end, chosen uniformly.
      forward = go_forward(seed, traj, depth)
      q_edge, p_edge, grad_edge, eps = choose(
          forward, (q_right, p_right, grad_right, step),
          (q_left, p_left, grad_left, -step))
      tree = build_tree(q_edge, p_edge, grad_edge, eps, depth, h0, seed,
                        traj, depth, tf.constant(0, tf.int32))
      accept_sum = accept_sum + tree.accept_sum
      num_leapfrogs = num_leapfrogs + tree.num_leapfrogs
      divergent = divergent or tree.divergent
      # A valid subtree joins the trajectory; biased progressive sampling
      # takes its sample with probability min(1, w_new / w_old).
      take = tf.logical_and(tree.ok, accept_new(
          seed, [_TOP_ACCEPT, traj, depth], tree.log_weight, log_weight))
      q_s, p_s, logp_s, grad_s = choose(
          take, (tree.q_sample, tree.p_sample, tree.logp_sample,
                 tree.grad_sample), (q_s, p_s, logp_s, grad_s))
      moved = moved or take
      # The old trajectory is the first subtree in build order: its inner
      # end is the one away from the new subtree.
      p_inner, p_outer = choose(forward, (p_left, p_right), (p_right, p_left))
      going = tf.logical_and(tree.ok, no_u_turn_merge(
          rho, p_inner, p_outer, tree.rho, tree.p_inner, tree.p_outer))
      new_end = (tree.q_outer, tree.p_outer, tree.grad_outer)
      q_right, p_right, grad_right = choose(
          tf.logical_and(tree.ok, forward), new_end,
          (q_right, p_right, grad_right))
      q_left, p_left, grad_left = choose(
          tf.logical_and(tree.ok, tf.logical_not(forward)), new_end,
          (q_left, p_left, grad_left))
      log_weight = tf.where(tree.ok, log_add_exp(log_weight, tree.log_weight),
                            log_weight)
      rho = tf.where(tree.ok, rho + tree.rho, rho)
      depth = depth + 1
    reach_max_depth = going and depth >= max_tree_depth
    energy = logp_s - kinetic_energy(p_s)
    return Trajectory(q_s, logp_s, grad_s, energy, accept_sum, num_leapfrogs,
                      moved, divergent, reach_max_depth, depth)

  @tab.batch(max_stack_depth=stack_depth)
  def nuts_steps(q, logp, grad, step, seed):
    """`num_trajectories` NUTS transitions of one chain (trajectory fusion:
    a chain that finishes early starts its next trajectory at once)."""
    accept_mean_sum = tf.zeros_like(logp)
    num_leapfrogs = tf.constant(0, tf.int32)
    divergent = tf.constant(False)
    reach_max_depth = tf.constant(False)
    t = trajectory(q, logp, grad, step, seed, tf.constant(0, tf.int32))
    # Every trajectory's draw is kept (fusion must not thin the chain):
    # row i is written when trajectory i ends.
    rows = tf.range(num_trajectories)[:, tf.newaxis]
    trajectory_q = tf.where(rows == 0, t.q, tf.zeros_like(t.q))
    for i in range(1, num_trajectories):
      accept_mean_sum = accept_mean_sum + mean_accept(
          t.accept_sum, t.num_leapfrogs, unrolled_leapfrog_steps)
      num_leapfrogs = num_leapfrogs + t.num_leapfrogs
      divergent = divergent or t.divergent
      reach_max_depth = reach_max_depth or t.reach_max_depth
      t = trajectory(t.q, t.logp, t.grad, step, seed, i)
      trajectory_q = tf.where(rows == i, t.q, trajectory_q)
    accept_mean_sum = accept_mean_sum + mean_accept(
        t.accept_sum, t.num_leapfrogs, unrolled_leapfrog_steps)
    return StepResult(t.q, t.logp, t.grad, t.energy,
                      tf.math.log(accept_mean_sum / num_trajectories),
                      num_leapfrogs + t.num_leapfrogs, t.is_accepted,
                      divergent or t.divergent,
                      reach_max_depth or t.reach_max_depth, trajectory_q)

  return nuts_steps, trajectory, build_tree, leaf
