"""`runtime/python_stack.room_for`: Python's recursion limit raised for the
runtimes that recurse in Python, and restored, also across threads."""
import sys
import threading

import pytest

from tfp_autobatch.runtime import python_stack


def _recurse(n):
  return 0 if n == 0 else 1 + _recurse(n - 1)


def test_room_is_made_and_given_back():
  before = sys.getrecursionlimit()
  with python_stack.room_for(1000, 3):
    assert _recurse(2500) == 2500
  assert sys.getrecursionlimit() == before
  with pytest.raises(ValueError):
    with python_stack.room_for(1000, 3):
      raise ValueError("the limit comes back after an error too")
  assert sys.getrecursionlimit() == before


def test_a_thread_that_ends_first_leaves_the_others_their_room():
  # Thread A enters with a small need, then B with a large one; A leaves
  # while B still runs. B keeps its room (restoring A's saved limit used
  # to take it away), and the limit comes back only when both have left.
  before = sys.getrecursionlimit()
  a_entered, b_entered, a_left = (threading.Event() for _ in range(3))
  result = {}

  def a():
    with python_stack.room_for(2, 3):
      a_entered.set()
      b_entered.wait()
    a_left.set()

  def b():
    a_entered.wait()
    with python_stack.room_for(1000, 3):
      b_entered.set()
      a_left.wait()
      try:
        result["b"] = _recurse(2500)
      except RecursionError:
        result["b"] = "RecursionError"

  threads = [threading.Thread(target=a), threading.Thread(target=b)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert result["b"] == 2500
  assert sys.getrecursionlimit() == before


def test_past_the_cap_the_error_says_what_to_do():
  with pytest.raises(RecursionError, match="pc backend"):
    with python_stack.room_for(python_stack.MAX_FRAMES, 3):
      _recurse(2 * python_stack.MAX_FRAMES)
