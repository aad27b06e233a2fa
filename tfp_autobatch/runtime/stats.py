"""Statistics of one batched run."""
import dataclasses
import threading
import weakref

import tensorflow as tf

# The attribute of a graph that keeps alive the values `PerThread` holds
# of that graph. Not a graph collection: a `tf.function` traced inside the
# graph copies the graph's collections into its own, and a function that
# outlives the graph (a module-level `tf.function`, a runtime's cached
# trace) kept the graph alive through them.
_HELD_BY_GRAPH = "_tfp_autobatch_per_thread_values"


class _Held:
  """A value kept alive by the graph its tensors belong to."""

  def __init__(self, value):
    self.value = value


def _graph_of(value):
  """The graph of the first symbolic tensor in `value`, or None."""
  for x in tf.nest.flatten(value):
    if tf.is_symbolic_tensor(x):
      return x.graph
  return None


class PerThread:
  """An attribute with a value per thread (None until set in that thread).

  A batched function and its runtimes are shared by the threads that call
  it; each thread reads the statistics of its own last run (one value for
  all mixed the counts of runs in two threads).

  A value holding a traced graph's tensors is held only as long as that
  graph lives (None afterwards): the statistics of a call traced inside a
  `tf.function` must not keep the function's graph alive."""

  def __set_name__(self, owner, name):
    self.name = name

  def __get__(self, obj, owner=None):
    if obj is None:
      return self
    value = getattr(self._values(obj), self.name, None)
    if isinstance(value, weakref.ref):
      held = value()
      return None if held is None else held.value
    return value

  def __set__(self, obj, value):
    # (A `RunStats` holds no tensors: what every eager call sets.)
    graph = (None if value is None or isinstance(value, RunStats)
             else _graph_of(value))
    if graph is not None:
      held = _Held(value)
      if getattr(graph, _HELD_BY_GRAPH, None) is None:
        setattr(graph, _HELD_BY_GRAPH, [])
      getattr(graph, _HELD_BY_GRAPH).append(held)
      value = weakref.ref(held)
    setattr(self._values(obj), self.name, value)

  ATTRIBUTE = "_per_thread_values"   # their holder's name on the object

  @classmethod
  def _values(cls, obj):
    values = obj.__dict__.get(cls.ATTRIBUTE)
    if values is None:
      values = obj.__dict__.setdefault(cls.ATTRIBUTE, threading.local())
    return values


@dataclasses.dataclass
class RunStats:
  """What a batched call did.

  steps: blocks executed (VM steps for the program-counter runtime).
  block_executions: executions per block label ("function/label").
  active_members: summed over executed blocks, the members that ran it.
  batch_size: members in the call.
  max_stack_depth: deepest recursion reached (the stack high-water mark).
  batched_primitive_rows: rows the `@batched_primitive` calls computed,
    summed over calls (the program-counter runtime; None where not
    counted). A call computes its members gathered: exactly their rows
    under pc:graph and pc:eager; under XLA the smallest of Z, Z/2, ..., 1
    rows (rounded up; with 3Z/4, 3Z/8, ... too for a primitive with
    `fine_buckets`, outside a gradient) that holds them, and all Z rows at
    a batch of at most `batched_primitive_calls.ALL_ROWS_UP_TO`, so there
    it lies between the members and the batch size.
  batched_primitive_members: how many members each `@batched_primitive`
    call was made for, as a histogram `{members: calls}` (the
    program-counter runtime; None where not counted). A guarded call that
    none of the block's members passed counts under 0 (it computes
    nothing). Calls made for few members cost more than their share:
    under XLA they run on the smallest bucket that holds them, and each
    call pays the model's fixed costs whatever its rows.
  """
  batch_size: int = 0
  steps: int = 0
  block_executions: dict = dataclasses.field(default_factory=dict)
  active_members: int = 0
  max_stack_depth: int = 0
  batched_primitive_rows: object = None
  batched_primitive_members: object = None

  def record_block(self, label, members):
    self.steps += 1
    self.active_members += members
    self.block_executions[label] = self.block_executions.get(label, 0) + 1

  @classmethod
  def of_tensors(cls, counts, batch_size):
    """The `RunStats` of a call's counts by field name: its
    `last_stats_tensors` (a traced call's counts, as tensors: see
    `tab.batch`) evaluated eagerly, so that a `tf.function` that returns
    them gives its caller the statistics of the call inside it, or the
    same counts as NumPy values."""
    def value(x):   # (not tf.is_tensor, slow on a NumPy value, every call)
      return x.numpy() if hasattr(x, "numpy") else x
    members = value(counts["batched_primitive_members"])
    return cls(
        batch_size=int(batch_size), steps=int(value(counts["steps"])),
        block_executions={label: int(value(n)) for label, n in
                          counts["block_executions"].items() if value(n)},
        active_members=int(value(counts["active_members"])),
        max_stack_depth=int(value(counts["max_stack_depth"])),
        batched_primitive_rows=int(value(counts["batched_primitive_rows"])),
        batched_primitive_members={k: int(n) for k, n in enumerate(members)
                                   if n})

  @property
  def mean_active(self):
    return self.active_members / self.steps if self.steps else 0.0

  @property
  def batched_primitive_calls(self):
    """`@batched_primitive` calls that computed something (had members);
    None where not counted."""
    if self.batched_primitive_members is None:
      return None
    return sum(n for k, n in self.batched_primitive_members.items() if k)

  @property
  def utilization(self):
    """Mean fraction of the batch active in each executed block."""
    if not self.steps or not self.batch_size:
      return 0.0
    return self.active_members / (self.steps * self.batch_size)

  def __str__(self):
    return (f"RunStats(batch_size={self.batch_size}, steps={self.steps}, "
            f"mean_active={self.mean_active:.1f}, "
            f"utilization={self.utilization:.3f}, "
            f"max_stack_depth={self.max_stack_depth})")
