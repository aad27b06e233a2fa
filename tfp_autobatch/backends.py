"""The backends, named `strategy:execution`, and how to build their runtimes.

A strategy (local static, program counter) is written once; an execution mode
(eager, graph, XLA) is the `vectorize.KernelCache` or VM it is given. Adding a
backend is adding a line to `_FACTORIES`.

A factory takes the typed IR-1 program and the function that lowers it to
IR-2 (`pipeline.stack_program_of`), which the pc backends run: `pipeline`
builds runtimes from here, so this module takes the lowering as an argument
rather than importing `pipeline` back.
"""
from tfp_autobatch import errors
from tfp_autobatch.runtime import local_static
from tfp_autobatch.runtime import pc_vm
from tfp_autobatch.runtime import vectorize


def _local(jit_compile):
  def make(program, max_stack_depth, stack_program_of, differentiable):
    del stack_program_of, differentiable   # the local strategies run IR-1
    return local_static.LocalStaticRuntime(
        program, vectorize.KernelCache(jit_compile=jit_compile),
        max_stack_depth, strategy="gather", bucket=jit_compile)
  return make


def _pc(mode, schedule="primitives_last"):
  def make(program, max_stack_depth, stack_program_of, differentiable):
    return pc_vm.PcVmRuntime(
        stack_program_of(program), max_stack_depth, mode=mode,
        schedule=schedule,
        differentiable=differentiable if mode == "xla" else None)
  return make


_FACTORIES = {
    "local:eager": _local(jit_compile=False),
    "local:eager_xla": _local(jit_compile=True),
    "pc:eager": _pc("eager"),
    "pc:graph": _pc("graph"),
    "pc:xla": _pc("xla"),
}

BACKENDS = tuple(_FACTORIES)
EAGER_ONLY = ("local:eager", "local:eager_xla", "pc:eager")
COMPILED_BY_XLA = tuple(name for name in BACKENDS if name.endswith("xla"))
# Backends whose programs run both arms of small floating-point `if`s too
# (`passes/if_to_select.py`), since no gradient goes through them: `pc:xla`
# differentiates (eagerly) by running `GRADIENT_BACKEND`'s program instead
# (`runtime/xla_gradient.py`). `pc:graph` is not one, even inside
# `tf.function(jit_compile=True)`: its program is made before the call
# knows where it runs, and is the one it runs eagerly.
NEVER_DIFFERENTIATED = ("pc:xla",)
GRADIENT_BACKEND = "pc:graph"


def check_name(name):
  if name not in _FACTORIES:
    raise errors.UnknownBackendError(
        f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
  return name


def make_runtime(name, program, max_stack_depth, stack_program_of,
                 differentiable=None):
  """The runtime of backend `name` for typed IR-1 `program`;
  `stack_program_of(program)` is its IR-2 (see the module docstring).
  `differentiable()`, for `pc:xla`: the `GRADIENT_BACKEND` runtime of the
  same function and inputs, which its gradient runs."""
  return _FACTORIES[check_name(name)](program, max_stack_depth,
                                      stack_program_of, differentiable)
