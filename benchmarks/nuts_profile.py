r"""Where one NUTS transition's time goes: XLA's kernels, VM block by block.

    python -m benchmarks.nuts_profile --problem=correlated_gaussian \
        --batch_size=64 \
        --output=benchmarks/results/nuts_profile_gaussian_64.json

`benchmarks.nuts_vm_steps` says what a transition costs in VM steps and
time; this one says where the time goes. It takes the same fixed
transition on `pc:xla` (same state and seed every call), times it, then
runs it `--repeats` more times under TensorFlow's profiler and reads back
every XLA kernel the compiled step ran. The profile carries the optimised
HLO module that made the kernels, so each kernel is named by its HLO
instruction (opcode, shape; a dot's contracting dimensions) and charged
to where that instruction sits:

- a VM block: the instruction comes from that block's ops (the blocks are
  IR-2's, `kernel.batched_program(...).ir(level=2)`; the VM names each
  block's ops by its index, see `HloIndex`);
- "VM loop": in the VM's loops but outside the blocks: applying a block's
  register and stack writes, the schedule, the run counters;
- "around the VM": the kernel's code before and after the batched program
  (flattening the state, the chains' seeds, the results).

Kernel times are summed over threads: XLA splits some kernels across the
intra-op thread pool and runs some beside others, so the sum can exceed the
transition's wall time (`transition_ms`, the median of `--repeats` calls
timed without the profiler). Compare kernels and blocks with each other.
The profiler's own bookkeeping slows the profiled calls
(`profiled_transition_ms`, their mean) and adds most to the smallest
kernels.
"""
import collections
import os
import re
import tempfile
import time

from absl import flags
import numpy as np
import tensorflow as tf
# TensorFlow's profiler and XLA protocol buffers: the profile's layout
# (XSpace) and the HLO module it carries. Imported here only.
from tensorflow.compiler.xla import xla_data_pb2
from tensorflow.compiler.xla.service import hlo_pb2
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from benchmarks import nuts as nuts_bench
from benchmarks import nuts_vm_steps
from tfp_autobatch.ir import ir2
from tfp_autobatch.runtime import pc_vm

VM_LOOP = "VM loop"
AROUND_VM = "around the VM"
# Instructions whose kernels only run others (their events span their
# callees' kernels, which are counted themselves).
_CONTAINERS = ("conditional", "while", "call")
_BLOCK_NAME = re.compile(rf"(?:^|/){pc_vm.BLOCK_SCOPE}(\d+)/")


class HloIndex:
  """Where each instruction of an optimised HLO module of the VM sits: in
  which VM block, in the VM's loop outside the blocks, or elsewhere.

  The VM puts block i's TensorFlow ops in the name scope
  `pc_vm.BLOCK_SCOPE + i`, and XLA keeps their names in its instructions'
  metadata. An instruction without a block's name is charged to the block
  of the nearest instruction that calls it with one (a fusion, a
  conditional), else to the block of the dispatch branch it sits in (the
  copies XLA adds to a branch), else to the VM's loop if it is in it.
  """

  def __init__(self, module):
    self.instructions = {}    # name -> (HloInstructionProto, computation id)
    self._caller = {}         # computation id -> (instruction, branch index)
    blocks_in = collections.defaultdict(set)   # computation id -> blocks
    for computation in module.computations:
      for ins in computation.instructions:
        self.instructions[ins.name] = (ins, computation.id)
        for i, callee in enumerate(ins.called_computation_ids):
          branch = i if ins.opcode == "conditional" else None
          self._caller.setdefault(callee, (ins, branch))
        block = _block_of(ins)
        if block is not None:
          blocks_in[computation.id].add(block)
    self._computation_of = {ins.id: c for ins, c in
                            self.instructions.values()}
    # A dispatch branch: a computation whose named instructions are all
    # one block's.
    self._branch_block = {c: next(iter(b)) for c, b in blocks_in.items()
                          if len(b) == 1 and c in self._caller
                          and self._caller[c][1] is not None}
    # The VM's loop: the outermost while around a block's instruction.
    self.loop = None          # a module without the VM
    for ins, _ in self.instructions.values():
      if _block_of(ins) is not None:
        whiles = [c for c, _ in self._callers(ins.name)
                  if c.opcode == "while"]
        self.loop = whiles[-1] if whiles else None
        break

  def _callers(self, name):
    """`[(instruction, branch index or None)]` from `name`'s computation up
    to the entry computation, innermost first."""
    chain = []
    computation = self.instructions[name][1]
    while computation in self._caller:
      ins, branch = self._caller[computation]
      chain.append((ins, branch))
      computation = self._computation_of[ins.id]
    return chain

  def place(self, name):
    """`(block index or None, inside the VM loop)` of instruction `name`."""
    ins, computation = self.instructions[name]
    chain = self._callers(name)
    block = next((b for b in map(_block_of, [ins] + [c for c, _ in chain])
                  if b is not None), None)
    if block is None:
      computations = [computation] + [self._computation_of[c.id]
                                      for c, _ in chain]
      block = next((self._branch_block[c] for c in computations
                    if c in self._branch_block), None)
    return block, self.loop is not None and any(c.id == self.loop.id
                                                for c, _ in chain)

  def describe(self, name):
    """The instruction's opcode and result shape, e.g. `dot f32[100, 8]
    (lhs contracting [0], rhs contracting [0])`."""
    ins = self.instructions[name][0]
    what = ins.opcode
    if ins.opcode == "fusion" and ins.fusion_kind:
      what += f"({ins.fusion_kind})"
    text = f"{what} {_shape(ins.shape)}"
    if ins.opcode == "dot":
      numbers = ins.dot_dimension_numbers
      text += (f" (lhs contracting {list(numbers.lhs_contracting_dimensions)},"
               f" rhs contracting {list(numbers.rhs_contracting_dimensions)})")
    return text


def _block_of(instruction):
  """The VM block whose op made `instruction` (by its TensorFlow op name),
  or None."""
  found = _BLOCK_NAME.search(instruction.metadata.op_name)
  return int(found.group(1)) if found else None


def _shape(shape):
  if shape.tuple_shapes:
    return "(" + ", ".join(_shape(s) for s in shape.tuple_shapes) + ")"
  dtype = xla_data_pb2.PrimitiveType.Name(shape.element_type).lower()
  return f"{dtype}{list(shape.dimensions)}"


def read_profile(logdir):
  """The XSpace the profiler wrote under `logdir` (the newest)."""
  paths = []
  for root, _, files in os.walk(logdir):
    paths += [os.path.join(root, f) for f in files
              if f.endswith(".xplane.pb")]
  if not paths:
    raise RuntimeError(f"the profiler wrote no .xplane.pb under {logdir}")
  space = xplane_pb2.XSpace()
  with open(max(paths, key=os.path.getmtime), "rb") as f:
    space.ParseFromString(f.read())
  return space


def hlo_modules(space):
  """{program id: HloModuleProto} of the XLA programs the profile ran."""
  modules = {}
  for plane in space.planes:
    for program_id, event in plane.event_metadata.items():
      for stat in event.stats:
        if plane.stat_metadata[stat.metadata_id].name == "Hlo Proto":
          proto = hlo_pb2.HloProto()
          proto.ParseFromString(stat.bytes_value)
          modules[program_id] = proto.hlo_module
  return modules


def kernel_events(space):
  """`[(program id, HLO instruction name, seconds)]`: every XLA kernel
  event of the profile."""
  events = []
  for plane in space.planes:
    names = {k: m.name for k, m in plane.stat_metadata.items()}
    for line in plane.lines:
      for event in line.events:
        stats = {names.get(s.metadata_id): s for s in event.stats}
        if "hlo_op" not in stats or "program_id" not in stats:
          continue
        op = stats["hlo_op"]
        name = names.get(op.ref_value) if op.ref_value else op.str_value
        program = stats["program_id"]
        program_id = program.int64_value or program.uint64_value
        events.append((program_id, name, event.duration_ps * 1e-12))
  return events


def attribute(space, block_labels, repeats):
  """Kernel time per transition, by kernel and by place (see the module
  docstring). `block_labels` are the VM's blocks, by block index (IR-2's
  order)."""
  events = kernel_events(space)
  ran = {program_id for program_id, _, _ in events}
  indexes = {pid: HloIndex(module)
             for pid, module in hlo_modules(space).items() if pid in ran}
  if not any(index.loop is not None for index in indexes.values()):
    raise RuntimeError(
        "no XLA program in the profile has the VM's loop (instructions named "
        f"{pc_vm.BLOCK_SCOPE}<i> in a while loop): nothing to charge to the "
        "VM's blocks")
  seconds = collections.Counter()
  calls = collections.Counter()
  places = {}
  for program_id, name, duration in events:
    index = indexes.get(program_id)
    if index is None or name not in index.instructions:
      continue
    if index.instructions[name][0].opcode in _CONTAINERS:
      continue
    key = (program_id, name)
    if key not in places:
      block, in_loop = index.place(name)
      places[key] = (block_labels[block] if block is not None
                     else VM_LOOP if in_loop else AROUND_VM)
    seconds[key] += duration
    calls[key] += 1
  kernels = [{
      "name": name, "place": places[(pid, name)],
      "hlo": indexes[pid].describe(name),
      "calls_per_transition": calls[(pid, name)] / repeats,
      "us_per_transition": seconds[(pid, name)] / repeats * 1e6,
      "us_per_call": seconds[(pid, name)] / calls[(pid, name)] * 1e6,
  } for pid, name in seconds]
  kernels.sort(key=lambda k: -k["us_per_transition"])
  return kernels


def profile(problem, chains, num_trajectories, warmup, repeats):
  """One record: the transition's time and its kernels by place."""
  transition = nuts_vm_steps.fixed_transition(problem, chains,
                                              num_trajectories)
  _, _, times = nuts_vm_steps.time_transitions(transition, warmup, repeats)
  with tempfile.TemporaryDirectory() as logdir:
    tf.profiler.experimental.start(logdir)
    try:
      start = time.perf_counter()
      for _ in range(repeats):
        transition.run()
      profiled = (time.perf_counter() - start) / repeats
    finally:
      tf.profiler.experimental.stop()
    space = read_profile(logdir)
  transition.run_eagerly()
  stats = transition.kernel.last_run_stats
  blocks = transition.kernel.batched_program(
      transition.state, transition.results).ir(level=2).blocks
  labels = [b.label for b in blocks]
  kernels = attribute(space, labels, repeats)
  per_place = collections.Counter()
  for k in kernels:
    per_place[k["place"]] += k["us_per_transition"]
  executions = dict(stats.block_executions, **{VM_LOOP: stats.steps})
  places = [{
      "place": place, "executions": executions.get(place),
      "us_per_transition": us,
      "us_per_execution": (us / executions[place]
                           if executions.get(place) else None),
  } for place, us in per_place.most_common()]
  return {
      "problem": problem.name, "batch_size": chains,
      "num_trajectories_per_step": num_trajectories,
      "num_dims": problem.num_dims, "warmup": warmup, "repeats": repeats,
      "vm_steps": stats.steps,
      "blocks": labels,
      "block_executions": stats.block_executions,
      "model_blocks": [b.label for b in blocks
                       if ir2.calls_batched_primitive(b)],
      "transition_ms": float(np.median(times)) * 1e3,
      "profiled_transition_ms": profiled * 1e3,
      "kernel_ms_per_transition": sum(per_place.values()) / 1e3,
      "places": places, "kernels": kernels,
  }


def report(record, top):
  """The record as text: places, then the costliest kernels."""
  lines = [
      f"{record['problem']} d={record['num_dims']} "
      f"chains={record['batch_size']} "
      f"k={record['num_trajectories_per_step']}: {record['vm_steps']} VM "
      f"steps, {record['transition_ms']:.2f} ms a transition (median of "
      f"{record['repeats']}; {record['profiled_transition_ms']:.2f} ms "
      f"profiled), {record['kernel_ms_per_transition']:.2f} ms of XLA "
      "kernels (summed over threads)",
      "",
      f"{'where':<28} {'runs':>6} {'us/transition':>14} {'us/run':>9}"]
  for p in record["places"]:
    runs = "" if p["executions"] is None else str(p["executions"])
    each = ("" if p["us_per_execution"] is None
            else f"{p['us_per_execution']:.1f}")
    lines.append(f"{p['place']:<28} {runs:>6} "
                 f"{p['us_per_transition']:>14.1f} {each:>9}")
  kernels = record["kernels"][:top]
  # Names in full (a name cut short loses its `.3`, and names another
  # kernel): the columns are as wide as the longest.
  name_width = max([30] + [len(k["name"]) for k in kernels])
  place_width = max([24] + [len(k["place"]) for k in kernels])
  lines += ["", f"{'kernel':<{name_width}} {'where':<{place_width}} "
                f"{'calls':>6} {'us/transition':>14} {'us/call':>8}  hlo"]
  for k in kernels:
    lines.append(f"{k['name']:<{name_width}} {k['place']:<{place_width}} "
                 f"{k['calls_per_transition']:>6.1f} "
                 f"{k['us_per_transition']:>14.1f} {k['us_per_call']:>8.1f}"
                 f"  {k['hlo']}")
  return "\n".join(lines)


# Command line. Flags are defined only when run as a program, so importing
# this module (as the tests do, beside other benchmarks) defines none.

def define_flags(flag_values=None):
  """Defines the flags on `flag_values` (default absl's); returns them."""
  fv = flags.FLAGS if flag_values is None else flag_values
  nuts_vm_steps.define_transition_flags(fv)
  flags.DEFINE_integer("batch_size", 64, "Number of chains.", flag_values=fv)
  flags.DEFINE_integer("repeats", 5,
                       "Transitions timed, then as many profiled.",
                       flag_values=fv)
  flags.DEFINE_integer("top", 25, "Kernels listed, the costliest first.",
                       flag_values=fv)
  flags.DEFINE_string("output", None, "JSON file for the profile.",
                      flag_values=fv)
  return fv


def run_from_flags(fv):
  """Profiles as the parsed flags `fv` say; prints the report, writes the
  JSON if asked, and returns the record."""
  record = profile(nuts_vm_steps.problem_from_flags(fv), fv.batch_size,
                   fv.num_trajectories_per_step, fv.warmup, fv.repeats)
  print(report(record, fv.top))
  if fv.output:
    nuts_vm_steps.write_results(fv.output, record=record)
  return record


if __name__ == "__main__":
  nuts_bench.run_program(define_flags, run_from_flags)
