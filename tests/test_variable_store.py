"""Tests of how the pc VM stores a variable: push, pop, update and write
against a list-of-stacks model, in both layouts (`variable_store`)."""
import hypothesis
from hypothesis import strategies as st
import tensorflow as tf

from tfp_autobatch.ir import types as types_lib
from tfp_autobatch.runtime import stack_banks
from tfp_autobatch.runtime import variable_store

Z, D = 3, 5

_ops = st.lists(st.tuples(st.sampled_from(["push", "pop", "update", "write"]),
                          st.lists(st.booleans(), min_size=Z, max_size=Z),
                          st.lists(st.integers(-99, 99), min_size=Z,
                                   max_size=Z)),
                max_size=12)


_apply_write_xla = tf.function(
    lambda stack, write: stack_banks.apply_stack_write(stack, write, xla=True),
    jit_compile=True)


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(ops=_ops, cached_top=st.booleans(), xla=st.booleans())
def test_stack_ops_match_list_model(ops, cached_top, xla):
  # With a cached top the stack buffer lives outside the store and a push
  # returns a StackWrite, applied as the VM's loop applies it after a block
  # (under XLA, masked-off rows are skipped by an out-of-range index).
  stores = variable_store.VariableStore(["v"], cached_top, D)
  current = [0] * Z
  saved = [[] for _ in range(Z)]
  store, stack = stores.initial("v", tf.zeros([Z], tf.int32),
                                types_lib.TensorType(tf.int32, ()), Z)
  assert (stack is not None) == cached_top
  for kind, mask, values in ops:
    # Keep to the members for which the op is legal.
    if kind == "push":
      mask = [m and len(saved[i]) < D - 1 for i, m in enumerate(mask)]
    if kind in ("pop", "update"):
      mask = [m and bool(saved[i]) for i, m in enumerate(mask)]
    m = tf.constant(mask)
    value = tf.constant(values, tf.int32)
    match kind:
      case "push":
        # A block pushes the variable's value, then writes it back (the
        # push leaves the cached top alone).
        store, write = stores.push(store, value, m)
        assert (write is not None) == cached_top
        if write is not None:
          stack = (_apply_write_xla(stack, write) if xla else
                   stack_banks.apply_stack_write(stack, write))
        store = stores.write(store, "v", value, m)
      case "write":
        store = stores.write(store, "v", value, m)
      case "pop" | "update":
        store, _ = stores.pop(store, m, keep=kind == "update", stack=stack)
    for i in range(Z):
      if not mask[i]:
        continue
      match kind:
        case "push":
          saved[i].append(values[i])
          current[i] = values[i]
        case "write":
          current[i] = values[i]
        case "pop":
          current[i] = saved[i].pop()
        case "update":
          current[i] = saved[i][-1]
    assert stores.value(store, "v").numpy().tolist() == current
    sp = store["sp"].numpy()
    assert sp.tolist() == [len(s) for s in saved]
    stack_now = (stack if cached_top else store["stack"]).numpy()
    for i in range(Z):
      assert stack_now[:len(saved[i]), i].tolist() == saved[i]


def test_a_register_is_its_value():
  stores = variable_store.VariableStore(["v"], cached_top=True, depth=D)
  value = tf.constant([1, 2, 3])
  store, stack = stores.initial("r", value, types_lib.TensorType(tf.int32, ()),
                                Z)
  assert store is value and stack is None
  store = stores.write(store, "r", tf.constant([7, 8, 9]),
                       tf.constant([True, False, True]))
  assert stores.value(store, "r").numpy().tolist() == [7, 2, 9]
