"""Progress bars and Ctrl-C for runs made of compiled chunks of steps.

A run that is compiled (a `tf.function`, XLA) cannot report or stop in the
middle of a compiled loop, so long runs are cut into chunks of steps: each
chunk is one compiled call, and between chunks the bar moves and a Ctrl-C
(KeyboardInterrupt) ends the run with the draws of the chunks done so far,
as NumPyro's `MCMC` does.
"""
import sys
import warnings

__all__ = ["SamplingInterrupted", "PhaseProgress", "show_progress",
           "chunk_lengths"]


class SamplingInterrupted(UserWarning):
  """Warned when a run was stopped (Ctrl-C) and returned the draws made."""


def show_progress(progress_bar):
  """Whether to draw bars: as asked, else only on a terminal."""
  if progress_bar is None:
    return bool(getattr(sys.stdout, "isatty", lambda: False)())
  return bool(progress_bar)


def chunk_lengths(total, chunk_size):
  """`total` steps as chunks of `chunk_size` (the last one shorter)."""
  full, rest = divmod(int(total), int(chunk_size))
  return [int(chunk_size)] * full + ([rest] if rest else [])


class PhaseProgress:
  """One tqdm bar per phase ("warm-up", "sampling"), or nothing.

  `advance(n)` is called after each chunk; a bar's postfix shows what the
  caller passes (the step size, divergences so far).
  """

  def __init__(self, enabled, totals):
    self._enabled = enabled
    self._totals = dict(totals)
    self._bar = None
    self._phase = None
    if enabled:
      import tqdm.auto  # pylint: disable=g-import-not-at-top  (optional)
      self._tqdm = tqdm.auto.tqdm

  def start(self, phase):
    """Switches to a phase's bar (closing the previous one)."""
    if phase == self._phase:
      return
    self.close()
    self._phase = phase
    if self._enabled and self._totals.get(phase):
      self._bar = self._tqdm(total=self._totals[phase], desc=phase,
                             unit="step", dynamic_ncols=True)

  def advance(self, steps, **postfix):
    if self._bar is not None:
      if postfix:
        self._bar.set_postfix(postfix, refresh=False)
      self._bar.update(steps)

  def close(self):
    if self._bar is not None:
      self._bar.close()
      self._bar = None


def warn_interrupted(phase, done, total):
  warnings.warn(
      f"sampling was interrupted (KeyboardInterrupt) during {phase}, after "
      f"{done} of {total} steps; returning the draws made so far",
      SamplingInterrupted, stacklevel=3)
