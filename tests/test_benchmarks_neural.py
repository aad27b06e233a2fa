"""Smoke test of `benchmarks.neural` at tiny sizes: it runs every kind of
system (ours, TF eager, DyNet's agenda batching where `dynet38` is
installed) and writes its JSON, table and plot. No timing is asserted."""
import json
import os
import subprocess
import sys

import pytest

from benchmarks import neural_report
from benchmarks import neural_systems

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow   # a process with TensorFlow, graphs traced per call site
def test_benchmark_runs_and_reports(tmp_path):
  output, plot = tmp_path / "neural.json", tmp_path / "neural.png"
  dynet = "agenda" if neural_systems.dynet_available() else ""
  subprocess.run(
      [sys.executable, "-m", "benchmarks.neural", "--threads=1",
       "--workloads=rnn_classifier", "--backends=pc:graph",
       "--cells=per_example,batched",
       "--batch_sizes=2", f"--dynet={dynet}", "--rounds=1",
       "--min_run_sec=0", "--embedding_size=4", "--hidden_size=4",
       "--vocabulary_size=20", "--pool_size=4", "--eager_cap=1",
       f"--output={output}", f"--plot={plot}"],
      cwd=ROOT, check=True, env=dict(os.environ, PYTHONPATH=ROOT))
  result = json.loads(output.read_text())
  systems = {(r["system"], r["mode"]) for r in result["records"]}
  expected = {(s, m) for s in ("pc:graph", "pc:graph+batched_cells",
                                "tf_eager")
              for m in ("inference", "training")}
  if dynet:
    expected |= {("dynet:agenda", "inference"), ("dynet:agenda", "training")}
  assert systems == expected
  for r in result["records"]:
    assert r["examples_per_sec"] > 0 and r["first_call_sec"] > 0
    assert r["threads"] == 1 and r["batch_size"] == 2
  assert plot.stat().st_size > 0
  assert "rnn_classifier | inference | 1" in neural_report.table(result, 2)
  # TensorFlow ran with its pooled host allocator, and the results say so.
  assert result["config"]["flags"]["tf_cpu_bfc_allocator"] is True
  assert result["machine"]["tf_cpu_bfc_allocator"] == "true"


@pytest.mark.slow   # compiles the VM and the reverse VM's two with XLA
def test_profile_charges_the_gradient_to_recording_and_backward(
    tmp_path, capsys):
  """benchmarks.neural_profile (driven by its flags): the kernels of a
  TreeLSTM gradient on pc:xla are charged to the reverse VM's recording
  run and backward steps, their loops, or around them; each block's
  kernels land on exactly the blocks that ran, as often as they ran."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from benchmarks import neural_profile  # pylint: disable=g-import-not-at-top
  output = str(tmp_path / "profile.json")
  fv = neural_profile.define_flags(flags.FlagValues())
  fv(["neural_profile", "--batch_size=3", "--embedding_size=4",
      "--hidden_size=4", "--vocabulary_size=20", "--warmup=0",
      "--repeats=2", "--top=5", "--notf_cpu_bfc_allocator",
      "--output=" + output])
  returned = neural_profile.run_from_flags(fv)
  text = capsys.readouterr().out
  with open(output) as f:
    record = json.load(f)["record"]
  assert record["kernels"] == returned["kernels"]
  assert (record["workload"], record["batch_size"], record["cells"]) == (
      "tree_lstm", 3, "batched")
  places = {p["place"]: p for p in record["places"]}
  phases = ("recording", "backward")
  loops = {phase: places[phase + " loop"] for phase in phases}
  assert (loops["recording"]["executions"] == loops["backward"]["executions"]
          == record["steps"] > 0)
  assert all(loop["us_per_step"] > 0 for loop in loops.values())
  by_phase = {phase: {p: v["executions"] for p, v in places.items()
                      if p.startswith(phase + " ") and p not in
                      (phase + " loop",)} for phase in phases}
  assert set(places) == ({neural_profile.AROUND}
                         | {l["place"] for l in loops.values()}
                         | set().union(*by_phase.values()))
  # Every block of a run has kernels, counted as often as it ran: the
  # recording run's blocks sum to the steps the backward loop takes back.
  assert sum(by_phase["recording"].values()) == record["steps"]
  recorded = {p.split(" ", 1)[1]: n for p, n in by_phase["recording"].items()}
  taken_back = {p.split(" ", 1)[1]: n for p, n in by_phase["backward"].items()}
  assert taken_back and all(recorded[b] == n for b, n in taken_back.items())
  assert record["kernel_ms_per_step"] * 1e3 == pytest.approx(
      sum(k["us_per_step"] for k in record["kernels"]))
  assert "VM steps recorded and taken back" in text
  assert "wrote " + output in text
  listed = [line.split()[0] for line in
            text.split("\nkernel ", 1)[1].splitlines()[1:]
            if line.strip() and not line.startswith("wrote ")]
  assert listed == [k["name"] for k in record["kernels"][:5]]
