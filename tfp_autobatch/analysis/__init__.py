"""Analyses of IR programs that passes and runtimes both use: liveness,
definite assignment, and which code cannot raise (`raise_free`)."""
