# Two commands on a fresh machine: `make demo` and `make test`.
# Both create (or reuse) .venv and install everything from setup.py.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=
PYTEST_ARGS ?=

.PHONY: venv demo test bench clean

venv: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,bench]"
	touch $(STAMP)

demo: venv
	$(PY) -m benchmarks.demo $(ARGS)

test: venv
	$(PY) -m pytest -n 2 -q $(PYTEST_ARGS) tests

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
