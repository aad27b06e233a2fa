"""Builds colab/nuts_tutorial.ipynb (unexecuted).

    python colab/tools/build_nuts_tutorial.py
    python colab/tools/execute_notebook.py colab/nuts_tutorial.ipynb
"""
from nbformat.v4 import new_markdown_cell as md, new_code_cell as code

from notebook_cells import install_cell, write_notebook

# `nuts.to_inference_data` and `nuts.summary` work with ArviZ 0.x and 1.x;
# the plots below are written in ArviZ 0.x's plotting API.
ARVIZ = "arviz>=0.21"

cells = [
md("""# A drop-in recursive NUTS kernel for `tfp.mcmc`

`nuts.NoUTurnSampler` is the No-U-Turn Sampler written for **one** chain as
plain recursive Python (`build_tree` calls itself, as in Hoffman & Gelman
2014) and batched over chains by `tfp_autobatch`. It is a
`tfp.mcmc.TransitionKernel` that takes `tfp.mcmc.NoUTurnSampler`'s
arguments (by keyword beyond the first three; it adds
`num_trajectories_per_step` and `backend`) and returns the same kernel
results, so it composes with `TransformedTransitionKernel`, step-size
adaptation and `sample_chain`.

This notebook fits a hierarchical model written as a `JointDistribution`
with `nuts.windowed_adaptive_nuts`, the turnkey sampler (Stan's warm-up, a
progress bar, ArviZ output and a one-call summary); then swaps one line in
a hand-built `tfp.mcmc` pipeline to compare ours with TFP's NUTS, and
measures gradients per second against the number of chains for both
kernels."""),
install_cell([ARVIZ]),
code("""import time
import warnings
import numpy as np
import pandas as pd
import tensorflow as tf
import tensorflow_probability as tfp
import matplotlib.pyplot as plt
warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")
import arviz as az
import nuts

tfd, tfb = tfp.distributions, tfp.bijectors
# Sizes: SMALL (set by the tests) only makes the runs shorter.
CHAINS = 2 if SMALL else 4
NUM_BURNIN, NUM_RESULTS = (40, 40) if SMALL else (500, 500)
MAX_TREE_DEPTH = 10
CHAIN_COUNTS = [8] if SMALL else [4, 32, 256]
TIMED_STEPS = 3 if SMALL else 10"""),
md("""## 1. A hierarchical model with constrained scales

Radon-style data, simulated here with a fixed seed: the log radon level of
houses in a few counties, measured in the basement (`floor = 0`) or on the
first floor (`floor = 1`). Some counties have many houses, some very few, so
the county intercepts borrow strength from each other through the
hierarchy:

$$\\mu_a \\sim N(0, 5),\\quad \\sigma_a \\sim N^+(1),\\quad
z_j \\sim N(0, 1),\\quad a_j = \\mu_a + \\sigma_a z_j,$$
$$b \\sim N(0, 5),\\quad \\sigma_y \\sim N^+(1),\\quad
y_i \\sim N(a_{\\mathrm{county}_i} + b\\,\\mathrm{floor}_i,\\ \\sigma_y).$$

The intercepts are non-centred ($z_j$ is sampled, $a_j$ derived), which
keeps the geometry friendly to HMC."""),
code("""rng = np.random.default_rng(2020)
NUM_COUNTIES, NUM_HOUSES = 8, 200
county = rng.choice(NUM_COUNTIES, NUM_HOUSES, p=rng.dirichlet(np.ones(NUM_COUNTIES)))
floor = rng.binomial(1, 0.3, NUM_HOUSES).astype(np.float32)
true_a = 1.5 + 0.4 * rng.standard_normal(NUM_COUNTIES)
log_radon = (true_a[county] - 0.7 * floor
             + 0.6 * rng.standard_normal(NUM_HOUSES)).astype(np.float32)
print("houses per county:", np.bincount(county, minlength=NUM_COUNTIES))"""),
md("""The log density is written for a batch of chains: every parameter has
the chains as its leading dimensions, so `...` indexing broadcasts over them
(both kernels call it on a batch). The two scales must stay positive, so the
sampler works on an unconstrained space through `Softplus` bijectors."""),
code("""PARAMETERS = ["mu_a", "sigma_a", "z", "b", "sigma_y"]

def target_log_prob(mu_a, sigma_a, z, b, sigma_y):
    a = mu_a[..., None] + sigma_a[..., None] * z                  # [chains, counties]
    mean = tf.gather(a, county, axis=-1) + b[..., None] * floor   # [chains, houses]
    return (tfd.Normal(0., 5.).log_prob(mu_a)
            + tfd.HalfNormal(1.).log_prob(sigma_a)
            + tf.reduce_sum(tfd.Normal(0., 1.).log_prob(z), -1)
            + tfd.Normal(0., 5.).log_prob(b)
            + tfd.HalfNormal(1.).log_prob(sigma_y)
            + tf.reduce_sum(tfd.Normal(mean, sigma_y[..., None]).log_prob(log_radon), -1))

bijectors = [tfb.Identity(), tfb.Softplus(), tfb.Identity(), tfb.Identity(), tfb.Softplus()]

def initial_state(chains, seed=0):
    \"\"\"Overdispersed starting points, so that R-hat can detect poor mixing.\"\"\"
    r = np.random.default_rng(seed)
    f = lambda *shape: r.standard_normal([chains, *shape]).astype(np.float32)
    u = lambda: r.uniform(0.5, 2., chains).astype(np.float32)
    return [f(), u(), f(NUM_COUNTIES), f(), u()]

print(target_log_prob(*initial_state(3)))"""),
md("""The same model as a `JointDistribution`: the priors and the likelihood
as distributions, from which the turnkey sampler takes the log density,
the constraints (`sigma_a`, `sigma_y` > 0) and the starting points."""),
code("""model = tfd.JointDistributionNamed(dict(
    mu_a=tfd.Normal(0., 5.),
    sigma_a=tfd.HalfNormal(1.),
    z=tfd.Sample(tfd.Normal(0., 1.), NUM_COUNTIES),
    b=tfd.Normal(0., 5.),
    sigma_y=tfd.HalfNormal(1.),
    log_radon=lambda mu_a, sigma_a, z, b, sigma_y: tfd.Independent(tfd.Normal(
        tf.gather(mu_a[..., None] + sigma_a[..., None] * z, county, axis=-1)
        + b[..., None] * floor, sigma_y[..., None]), reinterpreted_batch_ndims=1)))"""),
md("""## 2. The turnkey sampler: `windowed_adaptive_nuts`

`nuts.windowed_adaptive_nuts` takes the arguments of
`tfp.experimental.mcmc.windowed_adaptive_nuts` (the observed values are
pinned by keyword), so switching between TFP's and ours is the import.
It runs Stan's warm-up: chains start uniformly in (-2, 2) on the
unconstrained scale, a first window adapts the step size only, doubling
windows estimate a diagonal mass matrix (the posterior variances), and a
last window adapts the step size to it. Nothing is tuned by hand.

Steps run in compiled chunks, so the progress bar shows warm-up and
sampling apart, and interrupting the kernel (Ctrl-C) stops between chunks
and returns the draws made so far, with a `nuts.SamplingInterrupted`
warning."""),
code("""start = time.perf_counter()
draws, trace = nuts.windowed_adaptive_nuts(
    NUM_RESULTS, model, n_chains=CHAINS, num_adaptation_steps=NUM_BURNIN,
    progress_bar=True, seed=(1, 2), log_radon=log_radon)
print(f"{time.perf_counter() - start:.0f} s, XLA compilation included")"""),
md("""`nuts.to_inference_data` makes an ArviZ `InferenceData` of the draws,
with chains as ArviZ's `chain` dimension and the sample statistics under
ArviZ's names (`diverging`, `tree_depth`, `energy`, `step_size`,
`n_steps`, `acceptance_rate`, `lp`). `nuts.summary` gives, in one call,
R-hat, bulk and tail ESS and the divergent transitions."""),
code("""idata_windowed = nuts.to_inference_data(draws, trace)
print(idata_windowed.sample_stats)
nuts.summary(idata_windowed, var_names=["mu_a", "sigma_a", "b", "sigma_y"])"""),
code("""az.plot_trace(idata_windowed, var_names=["mu_a", "sigma_a", "b", "sigma_y"],
              compact=True, figsize=(10, 7))
plt.tight_layout(); plt.show()"""),
md("""## 3. Kernel by kernel: everything but the NUTS kernel

Step-size adaptation (dual averaging during 80% of the burn-in) around a
`TransformedTransitionKernel` around NUTS, run by `tfp.mcmc.sample_chain`
inside one XLA-compiled `tf.function`. The function takes the NUTS kernel as
its only argument."""),
code("""def trace_fn(_, results):
    nuts_results = results.inner_results.inner_results   # adaptation -> transform -> NUTS
    return {"step_size": results.new_step_size,
            "n_steps": nuts_results.leapfrogs_taken,
            "diverging": nuts_results.has_divergence,
            "acceptance_rate": tf.exp(tf.minimum(nuts_results.log_accept_ratio, 0.))}

def sample(nuts_kernel, seed=(1, 2)):
    kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
        tfp.mcmc.TransformedTransitionKernel(nuts_kernel, bijectors),
        num_adaptation_steps=int(0.8 * NUM_BURNIN))
    run = tf.function(lambda: tfp.mcmc.sample_chain(
        NUM_RESULTS, initial_state(CHAINS), kernel=kernel, num_burnin_steps=NUM_BURNIN,
        trace_fn=trace_fn, seed=seed), jit_compile=True)
    start = time.perf_counter()
    draws, trace = run()
    print(f"{NUM_BURNIN + NUM_RESULTS} steps of {CHAINS} chains in "
          f"{time.perf_counter() - start:.0f} s (XLA compilation included); "
          f"{int(np.sum(trace['diverging']))} divergences in the kept draws")
    return draws, trace"""),
md("""## 4. TFP's NUTS, then ours: one line changes"""),
code("""tfp_draws, tfp_trace = sample(
    tfp.mcmc.NoUTurnSampler(target_log_prob, step_size=0.1, max_tree_depth=MAX_TREE_DEPTH))"""),
code("""our_draws, our_trace = sample(
    nuts.NoUTurnSampler(target_log_prob, step_size=0.1, max_tree_depth=MAX_TREE_DEPTH))"""),
md("""## 5. Diagnostics with ArviZ

`nuts.to_inference_data` also takes `sample_chain`'s draws (here a list,
named by `PARAMETERS`) and a trace whose keys are ArviZ's names. We add
the county intercepts $a_j$ as a derived quantity."""),
code("""def to_inference_data(draws, trace):
    idata = nuts.to_inference_data(dict(zip(PARAMETERS, draws)), trace)
    p = idata.posterior
    idata.posterior["a"] = p["mu_a"] + p["sigma_a"] * p["z"]
    return idata

idata = {"tfp.mcmc.NoUTurnSampler": to_inference_data(tfp_draws, tfp_trace),
         "nuts.NoUTurnSampler": to_inference_data(our_draws, our_trace)}
for name, trace in [("tfp.mcmc", tfp_trace), ("ours", our_trace)]:
    print(f"{name:9s} adapted step size {float(trace['step_size'][-1]):.3f}, "
          f"mean leapfrog steps per draw {np.mean(trace['n_steps']):.1f}, "
          f"mean acceptance {np.mean(trace['acceptance_rate']):.2f}")
az.summary(idata["nuts.NoUTurnSampler"], var_names=["mu_a", "sigma_a", "b", "sigma_y", "a"])"""),
md("""R-hat near 1 says the chains, started far apart, agree; `ess_bulk` and
`ess_tail` are the effective numbers of independent draws for the centre
and the tails of each marginal. The trace plot shows each chain's marginal
density and its draws in order:"""),
code("""az.plot_trace(idata["nuts.NoUTurnSampler"], var_names=["mu_a", "sigma_a", "b", "sigma_y"],
              compact=True, figsize=(10, 7))
plt.tight_layout(); plt.show()"""),
md("""## 6. The two posteriors side by side

Same model, same data, two independent NUTS implementations. The last
column is the difference of the means in units of its Monte Carlo standard
error: values of a few units or less are what chance alone gives."""),
code("""summaries = {name: az.summary(d, var_names=["mu_a", "sigma_a", "b", "sigma_y", "a"])
             for name, d in idata.items()}
(t, o) = summaries.values()
comparison = pd.DataFrame({
    "tfp mean": t["mean"], "tfp sd": t["sd"], "ours mean": o["mean"], "ours sd": o["sd"],
    "difference / mcse": (o["mean"] - t["mean"]) / np.hypot(o["mcse_mean"], t["mcse_mean"])})
comparison.round(3)"""),
code("""az.plot_forest(list(idata.values()), model_names=list(idata), combined=True,
               var_names=["mu_a", "sigma_a", "b", "sigma_y", "a"], figsize=(8, 6))
plt.title("94% HDI of each parameter"); plt.show()"""),
code("""az.plot_posterior(idata["nuts.NoUTurnSampler"], var_names=["sigma_a", "b", "sigma_y"],
                  ref_val={"b": [{"ref_val": -0.7}], "sigma_y": [{"ref_val": 0.6}]},
                  figsize=(12, 3))
plt.show()"""),
md("""The reference lines are the values the data were simulated with.

## 7. Many chains: gradients per second

Running many chains at once is where batching pays off. We time a few
`sample_chain` steps (fixed step size, the one ours adapted; starting states
drawn from the posterior above) for each number of chains, after a warm-up
call that traces and compiles, and keep the fastest of three calls.
*Gradients per second* counts the useful gradient evaluations: the sum of
every chain's `leapfrogs_taken`, divided by the seconds the call took."""),
code("""step_size = float(our_trace["step_size"][-1])
pool = [np.reshape(x, (-1,) + x.shape[2:]) for x in map(np.asarray, our_draws)]   # every (draw, chain)

def gradients_per_second(nuts_kernel, chains, seed=(3, 4)):
    start_at = np.random.default_rng(chains).integers(0, len(pool[0]), chains)
    init = [tf.gather(x, start_at) for x in pool]
    kernel = tfp.mcmc.TransformedTransitionKernel(nuts_kernel, bijectors)
    run = tf.function(lambda: tfp.mcmc.sample_chain(
        TIMED_STEPS, init, kernel=kernel, seed=seed,
        trace_fn=lambda _, r: r.inner_results.leapfrogs_taken), jit_compile=True)
    run()                                      # warm-up: trace and compile
    seconds = []
    for _ in range(3):                         # the same seed: the same work each time
        start = time.perf_counter()
        _, leapfrogs = run()
        seconds.append(time.perf_counter() - start)
    return float(tf.reduce_sum(leapfrogs)) / min(seconds)

tf.get_logger().setLevel("ERROR")   # one tf.function per kernel and chain count is on purpose
rates = {name: [] for name in idata}
for chains in CHAIN_COUNTS:
    for name, kernel_class in [("tfp.mcmc.NoUTurnSampler", tfp.mcmc.NoUTurnSampler),
                               ("nuts.NoUTurnSampler", nuts.NoUTurnSampler)]:
        kernel = kernel_class(target_log_prob, step_size=step_size, max_tree_depth=MAX_TREE_DEPTH)
        rates[name].append(gradients_per_second(kernel, chains))
table = pd.DataFrame(rates, index=pd.Index(CHAIN_COUNTS, name="chains"))
table["ours / tfp"] = table["nuts.NoUTurnSampler"] / table["tfp.mcmc.NoUTurnSampler"]
table.round(2)"""),
code("""for name, r in rates.items():
    plt.loglog(CHAIN_COUNTS, r, "o-", label=name)
plt.xlabel("chains"); plt.ylabel("gradients / second"); plt.legend()
plt.title("NUTS on the radon-style model, XLA on this machine's CPU"); plt.show()"""),
md("""Both kernels evaluate the log density and its gradient on the whole
batch of active chains at once, so throughput grows with the number of
chains until the hardware saturates. They differ in how a step is run:
TFP's kernel is a hand-batched iterative tree builder, one `while` loop
iteration per leapfrog step, and computes every chain's row until the
step's longest trajectory ends. Ours is the recursive single-chain program
run by `tfp_autobatch`'s program-counter virtual machine: a VM step runs
one group of basic blocks (a subtree of one or two leaves is one step,
the recursion's calls and returns cost steps of their own), and each
gradient call computes the rows of the chains that reach it only. So the
VM's own steps are its overhead, which shows most with few chains and a
cheap model, and the chains left waiting for the longest trajectory are
TFP's, which shows most with many chains. The last column is this
machine's run; the README's benchmarks measure both kernels, and TFP's
reference autobatched NUTS, on the paper's models. What ours also buys is
the program: NUTS as the paper writes it, recursion included, batched
without hand-written masking. See the README for the kernel's arguments
and what it adds (`num_trajectories_per_step` trajectory fusion,
`gradient_utilization`)."""),
md("""## 8. Where the gradients go: stragglers and trajectory fusion

Chains take trajectories of different lengths, so in a batched step a few
*stragglers* keep walking after the others have finished. Each gradient
call then runs for only those few chains. Run eagerly, our kernel keeps
the run statistics of its last step (`last_run_stats`). Among them,
`batched_primitive_members` is a histogram `{chains: calls}`: how many
chains each gradient call was made for.

With `num_trajectories_per_step=10` (trajectory fusion), one `one_step`
advances every chain by ten trajectories in one batched program. A chain
that finishes a short trajectory starts its next one instead of waiting,
so a larger share of the calls serves every chain.
`gradient_utilization` (useful over computed gradients) is in the kernel
results."""),
code("""chains = 8 if SMALL else 64
start_at = np.random.default_rng(7).integers(0, len(pool[0]), chains)
init = [tf.gather(x, start_at) for x in pool]
for k in (1, 10):
    ours = nuts.NoUTurnSampler(target_log_prob, step_size=step_size,
                               max_tree_depth=MAX_TREE_DEPTH, num_trajectories_per_step=k)
    kernel = tfp.mcmc.TransformedTransitionKernel(ours, bijectors)
    _, results = kernel.one_step(init, kernel.bootstrap_results(init), seed=(5, 6))  # eager
    calls = ours.last_run_stats.batched_primitive_members   # {chains: calls}
    def count(keep):
        return sum(n for members, n in calls.items() if members and keep(members))
    print(f"{k:2d} trajectories a step: {count(lambda m: True)} gradient calls: "
          f"{count(lambda m: m == chains)} for all {chains} chains, "
          f"{count(lambda m: chains / 2 <= m < chains)} for half of them or more, "
          f"{count(lambda m: 4 <= m < chains / 2)} for fewer, "
          f"{count(lambda m: m < 4)} for 1-3; gradient utilisation "
          f"{float(results.inner_results.gradient_utilization):.2f}")"""),
md("""Unfused, the step waits on its longest trajectory: after its first
calls, most calls run for a part of the batch. Fused, a chain that
finishes a trajectory starts its next one, so more calls run for every
chain, more of each call's rows do useful work and the utilisation rises.
Calls for a handful of chains are not gone: they come at the end, while
the last chains finish their tenth trajectory, and ten trajectories give
the longest of them more chances to be long, so there can be more of them
than unfused. They compute few rows, so they weigh little in the
utilisation.

Under `pc:xla` a call made for a few chains runs on a few rows: they are
gathered into the smallest of 64, 32, ..., 1 rows that holds them. Such
a call is cheap, but it still pays the model's fixed cost per call, so
fusion pays most where the model is expensive. The README's benchmarks
count these calls for the paper's logistic regression
(`python -m benchmarks.nuts_vm_steps`)."""),
]

if __name__ == "__main__":
  print("wrote", write_notebook(cells, "nuts_tutorial.ipynb"))
