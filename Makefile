# profkit: `make demo` (the main job) and `make test` (all tests) install what
# they need first, idempotently: system packages, then a venv.
SHELL := /bin/bash
PYTHON ?= python3
# PROFKIT_VENV: a venv outside the tree (the Vagrant VM keeps its own off the synced folder)
VENV := $(or $(PROFKIT_VENV),.venv)
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The npm packages the export tests read profkit's files with (pinned by the lockfile)
JS := tests/js
JS_STAMP := $(JS)/node_modules/.installed
PYTEST_ARGS ?=

.PHONY: all setup system venv js test test-fast demo lab regress clean-venv lint

all: setup

setup: system venv js

# Re-checked every time (fast when everything is installed).
system:
	@if [ "$$(id -u)" = 0 ]; then bash scripts/setup-system.sh; else sudo bash scripts/setup-system.sh; fi

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

# npm ci with the machine's npm configuration; again only when the lockfile changes
js: $(JS_STAMP)

$(JS_STAMP): $(JS)/package.json $(JS)/package-lock.json
	cd $(JS) && npm ci --ignore-scripts --no-audit --no-fund
	@touch $(JS_STAMP)

# Two phases (docs/testing.md): the tests that may share the machine, one pytest-xdist
# worker per core; then the tests marked `alone` (they assert times measured here), with
# nothing else running.  Both phases run; make fails if either fails.  A phase that
# PYTEST_ARGS leaves empty (pytest's exit status 5) is not a failure unless both are.
# The last lines say which tests failed in either phase, and why (each phase writes
# JUnit XML to $(RESULTS); a log cut to its head and tail keeps them).
TEST_JOBS ?= $(shell nproc)
RESULTS := $(CURDIR)/.test-results

test: setup
	@rm -rf $(RESULTS); mkdir -p $(RESULTS); r1=0; r2=0; \
	$(BIN)/pytest -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --phase shared \
	  --durations=25 --junitxml=$(RESULTS)/shared.xml $(PYTEST_ARGS) || r1=$$?; \
	$(BIN)/pytest --phase alone --durations=25 --junitxml=$(RESULTS)/alone.xml \
	  $(PYTEST_ARGS) || r2=$$?; \
	echo "make test: shared phase exit $$r1, alone phase exit $$r2"; \
	$(BIN)/python scripts/test_failures.py $(RESULTS)/shared.xml $(RESULTS)/alone.xml; \
	if [ $$r1 = 5 ] && [ $$r2 = 5 ]; then exit 5; fi; \
	for r in $$r1 $$r2; do if [ $$r != 0 ] && [ $$r != 5 ]; then exit $$r; fi; done

# Without PostgreSQL builds or its source (parsers, renderers, statistics): builds
# nothing and downloads nothing.
test-fast: setup
	$(BIN)/pytest -m "not pg and not slow and not browser and not source and not cold" $(PYTEST_ARGS)

demo: setup
	$(BIN)/profkit reproduce

lab: setup
	$(BIN)/jupyter lab --no-browser --ip=$${LAB_IP:-127.0.0.1} --port=$${PORT:-8888} \
	  --ServerApp.root_dir=$(CURDIR) $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

# PostgreSQL's own regression suite on every patch variant (slow: see README).
regress: setup
	$(BIN)/profkit regress --all

lint: venv
	$(BIN)/ruff check profkit tests benchmarks

clean-venv:
	rm -rf $(VENV)
