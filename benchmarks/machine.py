"""The machine and software a benchmark ran on, saved with its results:
CPU, cores, load, GPUs, versions, tfp_autobatch's backends, git commit, date.

Imported as `machine_lib` (callers name the description `machine`).
"""
import datetime
import os
import platform
import subprocess

import numpy as np
import tensorflow as tf

from benchmarks import programs_systems


def _cpu_model():
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.lower().startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _git_commit():
  try:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root,
                          capture_output=True, text=True, timeout=10,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root,
                           capture_output=True, text=True, timeout=10,
                           check=True).stdout.strip()
    return head + ("+dirty" if dirty else "")
  except Exception:  # pylint: disable=broad-except
    return None


# TensorFlow's switch for a pooled (BFC) allocator of host memory, read
# when TensorFlow first allocates on the CPU.
TF_CPU_BFC_ALLOCATOR = "TF_CPU_ALLOCATOR_USE_BFC"


def use_tf_cpu_bfc_allocator(enabled):
  """Sets TensorFlow's host allocator to its pooled one (or leaves it, as
  `enabled` says) for this process and its children; call it before
  TensorFlow runs its first op. TensorFlow's default hands each large
  buffer back to the system when it is freed, so a buffer made afresh at
  every call (an XLA program's arrays of tens of MB) has its pages
  faulted in at every call."""
  if enabled:
    os.environ[TF_CPU_BFC_ALLOCATOR] = "true"
  else:
    os.environ.pop(TF_CPU_BFC_ALLOCATOR, None)


def machine_info():
  """A description of the machine and software versions."""
  import tensorflow_probability as tfp  # pylint: disable=g-import-not-at-top
  try:
    affinity = len(os.sched_getaffinity(0))
  except AttributeError:
    affinity = os.cpu_count()
  try:
    load = os.getloadavg()
  except OSError:
    load = None
  return {
      "cpu_model": _cpu_model(),
      "cpu_count": os.cpu_count(),
      "usable_cores": affinity,
      "load_average_at_start": load,
      "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
      "platform": platform.platform(),
      "python": platform.python_version(),
      "tensorflow": tf.__version__,
      "tensorflow_probability": tfp.__version__,
      "numpy": np.__version__,
      "tfp_autobatch_backends": list(programs_systems.available_backends()),
      "tf_cpu_bfc_allocator": os.environ.get(TF_CPU_BFC_ALLOCATOR),
      "git_commit": _git_commit(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
  }
