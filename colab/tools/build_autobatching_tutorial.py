"""Builds colab/autobatching_tutorial.ipynb (unexecuted).

    python colab/tools/build_autobatching_tutorial.py
    python colab/tools/execute_notebook.py colab/autobatching_tutorial.ipynb
"""
from nbformat.v4 import new_markdown_cell as md, new_code_cell as code

from notebook_cells import install_cell, write_notebook

cells = [
md("""# Autobatching control-intensive programs with `tfp_autobatch`

Write a function for **one** example in plain Python — recursion, `while`,
`if`, early `return` — decorate it with `@tab.batch`, and call it on a batch.
This notebook goes from zero to a batched recursive program, shows the two
intermediate representations of Radul et al. (MLSys 2020), compares the
backends and measures throughput."""),
install_cell(),
code("""import time
import numpy as np
import tensorflow as tf
import matplotlib.pyplot as plt
import tfp_autobatch as tab
print("backends:", tab.BACKENDS)"""),
md("""## 1. A recursive function, written for one example

`fib` below is ordinary Python. `@tab.batch` makes it callable on a batch:
the leading dimension of every argument is the batch."""),
code("""@tab.batch
def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)

n = np.array([3, 7, 4, 5, 10], np.int32)
print(fib(n).numpy())"""),
md("""It returns exactly what running the function on each example and
stacking the results would. `run_unbatched` runs the plain Python function
on one example, so we can check:"""),
code("""per_example = [int(fib.run_unbatched(tf.constant(k))) for k in n]
print(per_example)
assert per_example == list(fib(n).numpy())"""),
md("""## 2. A data-dependent loop

Each member of the batch runs its own number of iterations: the Collatz
sequence of 27 takes 111 steps, that of 1 none."""),
code("""@tab.batch
def collatz(n):
    steps = 0
    while n != 1:
        if n % 2 == 0:
            n = n // 2
        else:
            n = 3 * n + 1
        steps += 1
    return steps

x = np.array([1, 7, 27, 97], np.int32)
print(collatz(x).numpy())
assert list(collatz(x).numpy()) == [int(collatz.run_unbatched(tf.constant(k))) for k in x]"""),
md("""## 3. IR-1: functions of basic blocks (paper Fig. 2)

The frontend turns the Python source into basic blocks of single-example
`primitive`s (your straight-line code), `call`s of batched functions, and
`jump`/`branch`/`return` terminators. Types are inferred from the inputs."""),
code("""print(fib.ir())"""),
md("""The **local static** strategy (paper Algorithm 1) interprets this
directly: a program counter per member, each step running the earliest block
any member waits at for just the members waiting there, with recursion on
the Python stack (Fig. 1).

## 4. IR-2: one program with explicit stacks (paper Fig. 4)

The **program-counter** strategy (Algorithm 2) merges all functions into one
program and replaces `call` by `push`/`pop` of the variables live across the
call and a jump to the callee that pushes the return address. The runtime
keeps the stacks itself (Fig. 3), so the whole batched program runs as one
TensorFlow graph or XLA computation, and members at different recursion
depths run the same block together. Variables that never cross a VM step are
`temporaries`; those no call can clobber are `registers` without a stack.

Below, passes beyond the paper's have already run: the callee's first
block (`n <= 1`) is copied into each call site, so the call ends in a
`pushbranch` straight to `then1` or `endif3` instead of a jump to `entry`,
and each call's continuation is its own block (`endif3.1`, `endif3.1.2`).
`docs/internals.md` in the repository describes every pass."""),
code("""print(fib.ir(level=2))"""),
md("""A non-recursive program needs no variable stacks at all. The blocks
`body2` and `endloop3` of IR-1 are copied into the blocks that jump to
them, so a member whose loop ends returns from the block it is in
(`return if not ...`) and the others branch on: three blocks where IR-1
has five."""),
code("""print(collatz.ir(level=2))"""),
md("""## 5. Choosing a backend

Per call with `backend=`, or for a scope with `tab.default_backend`."""),
code("""for backend in ["local:eager", "local:eager_xla", "pc:graph", "pc:xla"]:
    print(backend, fib(n, backend=backend).numpy())
with tab.default_backend("pc:graph"):
    print("scoped:", collatz(x).numpy())"""),
md("""## 6. Run statistics

After a call, `last_stats` says how many blocks (VM steps) ran and how full
the batch was at each: *utilisation* is the mean fraction of members that
were active in an executed block."""),
code("""for backend in ["local:eager_xla", "pc:xla"]:
    fib(np.arange(1, 13, dtype=np.int32), backend=backend)
    print(backend, fib.last_stats)"""),
md("""Both strategies take about as many steps here; the program-counter
runtime batches members across recursion depths (a member in its third
recursive call and one in its fifth run `endif3` together), and each of its
steps is a cheap piece of one compiled XLA loop, where the local runtime
returns to Python between blocks.

## 7. Stack overflow is an error, never a wrong answer"""),
code("""@tab.batch(max_stack_depth=5)
def depth(n):
    if n == 0:
        return n
    return depth(n - 1)

print(depth(np.array([1, 3], np.int32)).numpy())
try:
    depth(np.array([1, 30], np.int32))
except tab.StackOverflowError as e:
    print("StackOverflowError:", e)"""),
md("""## 8. Throughput against batch size

Examples per second after warm-up (the first call converts and compiles)."""),
code("""sizes = [1, 4, 16, 64] if SMALL else [1, 4, 16, 64, 256, 1024]
rng = np.random.default_rng(0)
rates = {}
for backend in ["pc:xla", "local:eager_xla"]:
    rates[backend] = []
    for b in sizes:
        xs = rng.integers(5, 12, b).astype(np.int32)
        fib(xs, backend=backend)                      # warm-up
        start = time.perf_counter()
        fib(xs, backend=backend)
        rates[backend].append(b / (time.perf_counter() - start))
for backend, r in rates.items():
    plt.loglog(sizes, r, "o-", label=backend)
plt.xlabel("batch size"); plt.ylabel("fib examples / second"); plt.legend()
plt.title("fib(n), n in [5, 12)"); plt.show()"""),
md("""Batching amortises per-step overhead over the batch: throughput grows
with the batch size until the hardware saturates. See `benchmarks/` and the
README for full measurements against TensorFlow Probability's reference
implementation."""),
]

if __name__ == "__main__":
  print("wrote", write_notebook(cells, "autobatching_tutorial.ipynb"))
