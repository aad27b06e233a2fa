# Two commands on a fresh machine: `make demo` and `make test`.
# Both create (or reuse) .venv and install the package with its test and
# bench extras from setup.py (the stan extra is left out).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=
PYTEST_ARGS ?=

.PHONY: venv demo test test-nightly clean

venv: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,bench]"
	touch $(STAMP)

demo: venv
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m benchmarks.demo $(ARGS)

# Everything but the few statistical tests that take minutes each (CI).
test: venv
	$(PY) -m pytest -n 2 -q -m "not nightly" $(PYTEST_ARGS) tests

# The long statistical NUTS checks (posteriordb, moments and R-hat).
test-nightly: venv
	$(PY) -m pytest -n 2 -q -m nightly $(PYTEST_ARGS) tests

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
