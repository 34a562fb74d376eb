# Developer commands. Each one first makes sure .venv exists and holds this checkout installed
# with its test extras (`pip install -e '.[test]'`); it is rebuilt when pyproject.toml changes.
#
#   make demo    concurrent producers and schedulers on a throw-away PostgreSQL 18
#                (or on $ASSETQ_DATABASE_URL when set); DEMO_ARGS="--producers 8" etc.
#   make test    lint, then the whole pytest suite; PYTEST_ARGS="-k scheduler -x" etc.
#   make lint    ruff (lint and format check) and mypy (strict), on the package, the benchmarks
#                and the example service; `.venv/bin/ruff format .` formats the tree
#   make bench   the benchmark report (docs/benchmarks.md and its plots), benchmarks/bench.py;
#                BENCH_ARGS="--quick" for a smoke run
#   make soak    the chaos soak (tests/soak.py): producers, schedulers and workers as processes,
#                killed at random, then checked on the database; PostgreSQL (local server) and
#                MariaDB (a throw-away server); SOAK_ARGS="--events 100000 --kills 120" etc.
#   make clean   remove .venv and build leftovers

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.assetq-installed

DEMO_ARGS ?=
PYTEST_ARGS ?=
BENCH_ARGS ?=
SOAK_ARGS ?=

.PHONY: demo test lint pytest bench soak clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@if ! $(BIN)/python -c '' 2>/dev/null; then \
		echo "creating $(VENV)"; rm -rf $(VENV); $(PYTHON) -m venv $(VENV); \
	fi
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $@

demo: $(STAMP)
	$(BIN)/assetq demo $(DEMO_ARGS)

test: lint pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy benchmarks
	$(BIN)/mypy --strict examples/service

pytest: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench.py $(BENCH_ARGS)

soak: $(STAMP)
	$(BIN)/python tests/soak.py $(SOAK_ARGS)

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache .pytest_cache
