"""XLA kernels read back from a TensorFlow profile, and charged to the VM
block whose ops made them.

`benchmarks.nuts_profile` (a NUTS transition) and `benchmarks.neural_profile`
(a training step's forward call and reverse VM) share this. A VM names block
i's TensorFlow ops with a scope, `<scope><i>/` (`pc_vm.BLOCK_SCOPE` for the
VM's run; `reverse_vm.RECORDING_SCOPE` and `reverse_vm.BACKWARD_SCOPE` for
the reverse VM's recording run and backward steps). XLA keeps TensorFlow's
op names in its instructions' metadata, and the profile carries the
optimised HLO module each kernel came from, so every kernel can be placed:
in a block of one of the scopes, in that scope's loop outside its blocks,
or around them.
"""
import collections
import math
import os
import re
import tempfile
import time

import tensorflow as tf

# TensorFlow's profiler and XLA protocol buffers: the profile's layout
# (XSpace) and the HLO module it carries. Imported here only.
from tensorflow.compiler.xla import xla_data_pb2
from tensorflow.compiler.xla.service import hlo_pb2
from tensorflow.tsl.profiler.protobuf import xplane_pb2

# Instructions whose kernels only run others (their events span their
# callees' kernels, which are counted themselves).
CONTAINERS = ("conditional", "while", "call")


class HloIndex:
  """Where each instruction of an optimised HLO module sits: in which
  block of which scope, in a scope's loop outside its blocks, or
  elsewhere.

  An instruction without a block's name is charged to the block of the
  nearest instruction that calls it with one (a fusion, a conditional),
  else to the block of the conditional's branch it sits in (the copies XLA
  adds to a branch), else to the loop of a scope if it is in one. A
  scope's loop is the outermost while around the first instruction named
  with the scope.

  Args:
    module: an `HloModuleProto`.
    scopes: the name scopes, each followed by a block index, e.g.
      `("vm_block_",)`.
  """

  def __init__(self, module, scopes):
    self._pattern = re.compile(
        r"(?:^|/)(" + "|".join(map(re.escape, scopes)) + r")(\d+)/")
    self.instructions = {}    # name -> (HloInstructionProto, computation id)
    self._caller = {}         # computation id -> (instruction, branch index)
    self._in_computation = {c.id: list(c.instructions)
                            for c in module.computations}
    blocks_in = collections.defaultdict(set)   # computation id -> blocks
    for computation in module.computations:
      for ins in computation.instructions:
        self.instructions[ins.name] = (ins, computation.id)
        for i, callee in enumerate(ins.called_computation_ids):
          branch = i if ins.opcode == "conditional" else None
          self._caller.setdefault(callee, (ins, branch))
        block = self._block_of(ins)
        if block is not None:
          blocks_in[computation.id].add(block)
    self._computation_of = {ins.id: c for ins, c in
                            self.instructions.values()}
    self._by_id = {ins.id: ins for ins, _ in self.instructions.values()}
    # A conditional's branch whose named instructions are all one block's.
    self._branch_block = {c: next(iter(b)) for c, b in blocks_in.items()
                          if len(b) == 1 and c in self._caller
                          and self._caller[c][1] is not None}
    self.loops = {}   # scope -> the outermost while around its blocks
    for ins, _ in self.instructions.values():
      block = self._block_of(ins)
      if block is not None and block[0] not in self.loops:
        whiles = [c for c, _ in self._callers(ins.name)
                  if c.opcode == "while"]
        if whiles:
          self.loops[block[0]] = whiles[-1]

  def _block_of(self, instruction):
    """`(scope, block index)` of the op that made `instruction` (by its
    TensorFlow op name), or None."""
    found = self._pattern.search(instruction.metadata.op_name)
    return (found.group(1), int(found.group(2))) if found else None

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
    """`(scope, block index)` of instruction `name`: `(scope, None)` in
    the scope's loop outside its blocks, `(None, None)` elsewhere."""
    ins, computation = self.instructions[name]
    chain = self._callers(name)
    block = next((b for b in map(self._block_of, [ins] + [c for c, _ in chain])
                  if b is not None), None)
    if block is None:
      computations = [computation] + [self._computation_of[c.id]
                                      for c, _ in chain]
      block = next((self._branch_block[c] for c in computations
                    if c in self._branch_block), None)
    if block is not None:
      return block
    callers = {c.id for c, _ in chain}
    return next(((scope, None) for scope, loop in self.loops.items()
                 if loop.id in callers), (None, None))

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

  def product_float_ops(self, name):
    """The floating-point operations of instruction `name`'s matrix
    products, two a multiply-add: a dot's own, or the dots inside a fusion
    (or another instruction's callees); 0 for anything else."""
    return self._dot_float_ops(self.instructions[name][0])

  def _dot_float_ops(self, ins):
    if ins.opcode == "dot":
      lhs = self._by_id[ins.operand_ids[0]].shape.dimensions
      contracted = math.prod(
          lhs[d] for d in ins.dot_dimension_numbers.lhs_contracting_dimensions)
      return 2 * math.prod(ins.shape.dimensions) * contracted
    if ins.opcode in CONTAINERS:   # their callees are kernels of their own
      return 0
    return sum(self._dot_float_ops(inner)
               for callee in ins.called_computation_ids
               for inner in self._in_computation[callee])


def _shape(shape):
  if shape.tuple_shapes:
    return "(" + ", ".join(_shape(s) for s in shape.tuple_shapes) + ")"
  dtype = xla_data_pb2.PrimitiveType.Name(shape.element_type).lower()
  return f"{dtype}{list(shape.dimensions)}"


def profiled(run, repeats):
  """`(XSpace, mean seconds a call)` of `repeats` calls of `run()` under
  TensorFlow's profiler."""
  with tempfile.TemporaryDirectory() as logdir:
    tf.profiler.experimental.start(logdir)
    try:
      start = time.perf_counter()
      for _ in range(repeats):
        run()
      seconds = (time.perf_counter() - start) / repeats
    finally:
      tf.profiler.experimental.stop()
    return read_profile(logdir), seconds


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


def charged_kernels(space, scopes, label, repeats, per):
  """The kernels of `repeats` profiled runs (a NUTS transition, a training
  step: `per` names it in the keys), the costliest first, each with its
  place, `label(scope, block)` of `HloIndex.place`. Only the XLA programs
  with the loop of one of `scopes` count."""
  events = kernel_events(space)
  ran = {program_id for program_id, _, _ in events}
  indexes = {pid: HloIndex(module, scopes)
             for pid, module in hlo_modules(space).items() if pid in ran}
  indexes = {pid: index for pid, index in indexes.items() if index.loops}
  if not indexes:
    raise RuntimeError(
        "no XLA program in the profile has a VM's loop (instructions named "
        f"{' or '.join(scopes)}<i> in a while loop): nothing to charge to "
        "the VM's blocks")
  seconds = collections.Counter()
  calls = collections.Counter()
  places = {}
  for program_id, name, duration in events:
    index = indexes.get(program_id)
    if index is None or name not in index.instructions:
      continue
    if index.instructions[name][0].opcode in CONTAINERS:
      continue
    key = (program_id, name)
    if key not in places:
      places[key] = label(*index.place(name))
    seconds[key] += duration
    calls[key] += 1
  kernels = [{
      "name": name, "place": places[(pid, name)],
      "hlo": indexes[pid].describe(name),
      f"calls_per_{per}": calls[(pid, name)] / repeats,
      f"us_per_{per}": seconds[(pid, name)] / repeats * 1e6,
      "us_per_call": seconds[(pid, name)] / calls[(pid, name)] * 1e6,
      "product_float_ops_per_call": indexes[pid].product_float_ops(name),
  } for pid, name in seconds]
  kernels.sort(key=lambda k: -k[f"us_per_{per}"])
  return kernels


def by_place(kernels, executions, per):
  """The kernels' time summed by place, the costliest first, each with
  how many times it ran (`executions`, {place: runs}; None where not
  known) and its time a run."""
  seconds = collections.Counter()
  for k in kernels:
    seconds[k["place"]] += k[f"us_per_{per}"]
  return [{
      "place": place, "executions": executions.get(place),
      f"us_per_{per}": us,
      "us_per_execution": (us / executions[place]
                           if executions.get(place) else None),
  } for place, us in seconds.most_common()]


def tables(places, kernels, top, per):
  """Lines of text: the places (`by_place`), then the `top` costliest
  kernels."""
  per_column = f"us/{per}"
  place_width = max([28] + [len(p["place"]) for p in places])
  lines = [f"{'where':<{place_width}} {'runs':>6} {per_column:>14} "
           f"{'us/run':>9}"]
  for p in places:
    runs = "" if p["executions"] is None else str(p["executions"])
    each = ("" if p["us_per_execution"] is None
            else f"{p['us_per_execution']:.1f}")
    lines.append(f"{p['place']:<{place_width}} {runs:>6} "
                 f"{p[f'us_per_{per}']:>14.1f} {each:>9}")
  kernels = kernels[:top]
  # Names in full (a name cut short loses its `.3`, and names another
  # kernel): the columns are as wide as the longest.
  name_width = max([30] + [len(k["name"]) for k in kernels])
  place_width = max([24] + [len(k["place"]) for k in kernels])
  lines += ["", f"{'kernel':<{name_width}} {'where':<{place_width}} "
                f"{'calls':>6} {per_column:>14} {'us/call':>8}  hlo"]
  for k in kernels:
    lines.append(f"{k['name']:<{name_width}} {k['place']:<{place_width}} "
                 f"{k[f'calls_per_{per}']:>6.1f} "
                 f"{k[f'us_per_{per}']:>14.1f} {k['us_per_call']:>8.1f}"
                 f"  {k['hlo']}")
  return lines


def matrix_products(kernels, per):
  """The kernels' matrix products (`HloIndex.product_float_ops`):
  `{"gflop_per_<per>": ..., "us_per_<per>": ..., "gflop_per_s": ...}`,
  their operations and kernel time per `per`, and their rate (None
  without products)."""
  gflop = sum(k["product_float_ops_per_call"] * k[f"calls_per_{per}"]
              for k in kernels) / 1e9
  us = sum(k[f"us_per_{per}"] for k in kernels
           if k["product_float_ops_per_call"])
  return {f"gflop_per_{per}": gflop, f"us_per_{per}": us,
          "gflop_per_s": gflop / (us / 1e6) if us else None}


def report(summary, record, top, per):
  """A profiling program's report: its `summary` line, a line on
  `record["matrix_products"]` (`matrix_products`), then the tables of
  `record["places"]` and `record["kernels"]`."""
  products = record["matrix_products"]
  lines = [summary]
  if products["gflop_per_s"] is not None:
    lines.append(
        f"matrix products: {products[f'gflop_per_{per}']:.2f} GFLOP a "
        f"{per}, {products[f'us_per_{per}'] / 1e3:.1f} ms of kernels, "
        f"{products['gflop_per_s']:.1f} GFLOP/s")
  return "\n".join(lines + [""] + tables(record["places"],
                                         record["kernels"], top, per))


def define_report_flags(flag_values, work):
  """The flags every profiling program has: --repeats (of `work`, a
  plural noun: "Transitions"), --top and --output."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_integer("repeats", 5, f"{work} timed, then as many "
                       "profiled.", flag_values=flag_values)
  flags.DEFINE_integer("top", 25, "Kernels listed, the costliest first.",
                       flag_values=flag_values)
  flags.DEFINE_string("output", None, "JSON file for the profile.",
                      flag_values=flag_values)
