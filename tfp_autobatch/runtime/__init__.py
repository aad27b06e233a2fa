"""Interpreters of IR programs: the reference and the batching strategies."""
