# The README's two quickstart commands: `make run` and `make test`.
# Both create .venv with the system python3 and install the project from pyproject.toml.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP_RUN  := $(VENV)/.installed-run
STAMP      := $(VENV)/.installed-dev
PYTEST_ARGS ?=
# the suite runs in parallel pytest-xdist workers, one more than the CPUs (many tests wait on real daemons);
# tests that share something machine-wide stay in one worker (tests/xdist_groups.py). PYTEST_WORKERS=0: no workers
PYTEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(len(os.sched_getaffinity(0)) + 1)' 2>/dev/null || echo 2)

# `make test-fast`: the pure and unit tests only (tests/integration_marks.py marks the rest `integration` from the
# code) without those marked `slow(seconds)`, one worker per CPU: they compute, they do not wait on daemons
FAST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(len(os.sched_getaffinity(0)))' 2>/dev/null || echo 2)

.PHONY: run test test-fast lint docs bench demo clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[clouds]'
	touch $(STAMP_RUN)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP) $(STAMP_RUN)

run: $(STAMP_RUN)
	$(BIN)/overspill serve

# every run prints progress from its first second (tests/progress.py) and fails when a test leaves a process, a
# listening port or a temporary folder behind (tests/leak_check.py)
test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -n $(FAST_WORKERS) --dist loadgroup -m "not integration and not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# the documentation site into site/ (mkdocs.yml); strict: a broken link, a missing page or a bad anchor fails.
# The reference and benchmark pages are generated from the code by docsgen/hooks.py during the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

demo: $(STAMP)
	$(BIN)/overspill demo

bench: $(STAMP)
	$(BIN)/python benchmarks/placement_bench.py
	$(BIN)/python benchmarks/submit_load_bench.py
	$(BIN)/python benchmarks/console_bench.py

clean:
	rm -rf $(VENV) .overspill .pytest_cache site
