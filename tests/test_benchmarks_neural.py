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
