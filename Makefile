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

# The tests run as three pytest processes, one after another, with two
# workers each. TensorFlow keeps every XLA program a process compiles until
# the process ends (one of our NUTS steps holds about 150 MB), and one
# process for the whole suite outgrew a 24 GB machine. A part that selects
# no test (with PYTEST_ARGS="-k ...") is fine; all three selecting none fails.
TEST_PART_1 := tests/test_nuts*.py
TEST_PART_2 := tests/test_benchmarks*.py tests/test_differential.py \
	tests/test_gradients.py tests/test_examples*.py
TEST_PART_3 := tests $(foreach glob,$(TEST_PART_1) $(TEST_PART_2),--ignore-glob=$(glob))
run_test_parts = ran=0; failed=0; \
	for part in "$(TEST_PART_1)" "$(TEST_PART_2)" "$(TEST_PART_3)"; do \
	  $(PY) -m pytest -n 2 -q $(1) $(PYTEST_ARGS) $$part; status=$$?; \
	  if [ $$status -eq 0 ]; then ran=1; \
	  elif [ $$status -ne 5 ]; then failed=1; fi; \
	done; \
	if [ $$ran -eq 0 ] && [ $$failed -eq 0 ]; then echo "no tests ran"; fi; \
	[ $$failed -eq 0 ] && [ $$ran -eq 1 ]

# Everything but the few statistical tests that take minutes each (CI).
test: venv
	@$(call run_test_parts,-m "not nightly")

# The long statistical NUTS checks (posteriordb, moments and R-hat).
test-nightly: venv
	@$(call run_test_parts,-m nightly)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
